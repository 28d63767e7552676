// The single-page app: a tiny history router that mounts one page module at a time.

import { apiKey, toLogin } from "./api.js";
import { renderLogin } from "./login.js";
import { renderJobs } from "./jobs.js";
import { renderJob } from "./job.js";
import { renderCompare } from "./compare.js";
import { renderSubmit } from "./submit.js";
import { flash, setTitle } from "./util.js";

// (path, page, nav item, tab title); a page may name itself more precisely (a job's name).
const routes = [
  [/^\/login$/, renderLogin, null, "Log in"],
  [/^\/$/, renderJobs, "jobs", "Jobs"],
  [/^\/jobs\/([^/]+)$/, renderJob, "jobs", "Job"],
  [/^\/compare$/, renderCompare, "compare", "Compare"],
  [/^\/submit$/, renderSubmit, "submit", "Submit a job"],
];

let unmount = null;

export function navigate(path) {
  history.pushState({}, "", path);
  route();
}

function route() {
  if (unmount) { unmount(); unmount = null; }
  const view = document.getElementById("view");
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const match = routes.find(([re]) => re.test(path));
  document.getElementById("logout").hidden = !apiKey.get();
  if (!match) {
    view.innerHTML = `<div class="panel"><h1>Not found</h1><p><a href="/" data-link>Back to jobs</a></p></div>`;
    setTitle("Not found");
    return;
  }
  const [re, render, nav, title] = match;
  setTitle(title);
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
  if (render !== renderLogin && !apiKey.get() && !window.TUNEYARD_NO_AUTH) {
    toLogin();
    return;
  }
  const args = path.match(re).slice(1).map(decodeURIComponent);
  view.innerHTML = "";
  unmount = render(view, ...args) || null;
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-link]");
  if (!link || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  flash("");
  navigate(link.getAttribute("href"));
});

window.addEventListener("popstate", route);
document.getElementById("logout").addEventListener("click", () => {
  apiKey.clear();
  navigate("/login");
});

// With TUNEYARD_AUTH=off (the embedded local default) the API answers without a key.
async function start() {
  if (!apiKey.get()) {
    try { window.TUNEYARD_NO_AUTH = (await fetch("/v1/jobs?limit=1")).ok; } catch { /* offline */ }
  }
  route();
}
start();
