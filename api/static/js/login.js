// Login: an API key kept in sessionStorage (gone when the tab closes), checked against /v1/jobs.

import { api, apiKey, ApiError } from "./api.js";
import { esc } from "./util.js";

export function renderLogin(view) {
  const next = new URLSearchParams(location.search).get("next") || "/";
  view.innerHTML = `
    <form class="panel login" id="login-form">
      <h1>Sign in</h1>
      <p class="muted">Paste an API key. Create one with
        <code>tuneyard keys create --project default --role admin</code>.</p>
      <input id="api-key" name="api-key" type="password" autocomplete="off" placeholder="ty_…" required>
      <div class="row"><button class="primary" type="submit">Sign in</button>
        <span id="login-error" class="field-error"></span></div>
    </form>`;
  const form = view.querySelector("#login-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = form.querySelector("#api-key").value.trim();
    const error = form.querySelector("#login-error");
    apiKey.set(key);
    try {
      await api("/v1/jobs", { query: { limit: 1 } });
      history.pushState({}, "", next.startsWith("/") ? next : "/");
      window.dispatchEvent(new PopStateEvent("popstate"));
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        history.replaceState({}, "", `/login?next=${encodeURIComponent(next)}`);
        renderLogin(view);
        view.querySelector("#login-error").textContent = "That key was refused.";
      } else {
        error.innerHTML = esc(err.message);
      }
    }
  });
}
