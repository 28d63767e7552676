// Job list: name, state, progress, latest loss, age; filter by state; refreshes every 3 s.

import { api, itemsOf } from "./api.js";
import { formatNumber } from "./chart.js";
import { age, esc, every, progressOf, stateBadge } from "./util.js";

// The statuses come from the server's own definition (JobStatus in the OpenAPI schema).
async function jobStatuses() {
  const spec = await (await fetch("/openapi.json")).json();
  return spec.components.schemas.JobStatus.enum;
}

export function renderJobs(view) {
  const params = new URLSearchParams(location.search);
  view.innerHTML = `
    <div class="panel">
      <div class="row" id="jobs-toolbar">
        <h1>Jobs</h1><span class="spacer"></span>
        <label>State <select id="state-filter"><option value="">all</option></select></label>
        <a class="button" href="/compare" data-link id="compare-selected">Compare selected</a>
        <a class="button primary" href="/submit" data-link>New job</a>
      </div>
      <table id="jobs-table"><thead><tr><th></th><th>Name</th><th>State</th><th>Progress</th>
        <th>Loss</th><th>Attempt</th><th>Created</th></tr></thead><tbody></tbody></table>
      <p class="muted" id="jobs-empty" hidden>No jobs yet. <a href="/submit" data-link>Submit one</a>
        or run <code>tuneyard demo</code>.</p>
    </div>`;
  const filter = view.querySelector("#state-filter");
  jobStatuses().then((statuses) => {
    filter.insertAdjacentHTML("beforeend",
      statuses.map((s) => `<option value="${esc(s)}">${esc(s)}</option>`).join(""));
    filter.value = params.get("status") || "";
  });
  const selected = new Set();
  const tbody = view.querySelector("tbody");
  const compare = view.querySelector("#compare-selected");
  const refresh = async () => {
    const body = await api("/v1/jobs", { query: { status: filter.value, limit: 100 } });
    const jobs = itemsOf(body);
    tbody.innerHTML = jobs.map((job) => row(job, selected.has(job.id))).join("");
    // Widths through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    for (const bar of tbody.querySelectorAll("[data-pct]")) bar.style.width = `${bar.dataset.pct}%`;
    view.querySelector("#jobs-empty").hidden = jobs.length > 0;
  };
  filter.addEventListener("change", () => {
    const q = filter.value ? `?status=${filter.value}` : "";
    history.replaceState({}, "", `/${q}`);
    refresh();
  });
  tbody.addEventListener("change", (event) => {
    const box = event.target.closest("input[data-id]");
    if (!box) return;
    if (box.checked) selected.add(box.dataset.id); else selected.delete(box.dataset.id);
    compare.setAttribute("href", `/compare?ids=${[...selected].join(",")}`);
  });
  return every(3000, refresh);
}

function row(job, checked) {
  const { step, maxSteps, loss } = progressOf(job);
  const pct = maxSteps ? Math.min(100, (100 * (step || 0)) / maxSteps) : 0;
  return `<tr data-job="${esc(job.id)}">
    <td><input type="checkbox" data-id="${esc(job.id)}" ${checked ? "checked" : ""} aria-label="select"></td>
    <td><a href="/jobs/${esc(job.id)}" data-link>${esc(job.name || job.id)}</a>
      <div class="muted mono">${esc(job.id.slice(0, 8))}</div></td>
    <td>${stateBadge(job.status)}</td>
    <td class="num"><span class="bar"><span data-pct="${pct}"></span></span>${step ?? 0} / ${maxSteps ?? "?"}</td>
    <td class="num">${loss === null || loss === undefined ? "" : formatNumber(loss)}</td>
    <td class="num">${job.attempt ?? 0}/${job.max_attempts ?? "?"}</td>
    <td title="${esc(job.created_at)}">${esc(age(job.created_at))}</td></tr>`;
}
