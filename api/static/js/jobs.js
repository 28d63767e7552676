// Job list: search by name or id, label and state filters, sortable columns, cursor pages
// with "N–M of T", status-coloured progress, the failure reason under a failed job's name.
// Refreshes every 3 s by updating rows in place: a focused control keeps its focus.

import { api, ApiError, itemsOf } from "./api.js";
import { formatNumber } from "./chart.js";
import { age, esc, every, flash, progressOf, setTitle, stateBadge } from "./util.js";

const PAGE = 50;
const SORTABLE = { name: "Name", status: "State", priority: "Priority", created_at: "Created" };

// The statuses come from the server's own definition (JobStatus in the OpenAPI schema).
async function jobStatuses() {
  const spec = await (await fetch("/openapi.json")).json();
  return spec.components.schemas.JobStatus.enum;
}

export function renderJobs(view) {
  setTitle("Jobs");
  const params = new URLSearchParams(location.search);
  view.innerHTML = skeleton();
  const $ = (sel) => view.querySelector(sel);
  const state = {
    q: params.get("q") || "", label: params.get("label") || "", status: params.get("status") || "",
    sort: params.get("sort") || "-created_at", cursors: [null], page: 0, selected: new Set(), asked: 0,
  };
  $("#job-search").value = state.q;
  $("#label-filter").value = state.label;
  jobStatuses().then((statuses) => {
    $("#state-filter").insertAdjacentHTML("beforeend",
      statuses.map((s) => `<option value="${esc(s)}">${esc(s)}</option>`).join(""));
    $("#state-filter").value = state.status;
  });
  const refresh = async () => {
    const asked = ++state.asked; // a poll that answers after a newer query is dropped
    let body;
    try {
      body = await api("/v1/jobs", { query: {
        q: state.q, label: state.label, status: state.status, sort: state.sort,
        cursor: state.cursors[state.page], limit: PAGE } });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 422) throw err;
      flash(err.errors.map((e) => `${e.loc}: ${e.msg}${e.fix ? ` (${e.fix})` : ""}`).join("; ") || err.message);
      return;
    }
    if (asked !== state.asked) return;
    const jobs = itemsOf(body);
    syncRows($("#jobs-table tbody"), jobs, state.selected);
    state.cursors[state.page + 1] = body.next_cursor;
    drawPager(view, state, jobs.length, body.count ?? jobs.length, body.has_more);
    drawSortHeaders(view, state.sort);
    $("#jobs-empty").hidden = jobs.length > 0;
    $("#jobs-empty").textContent = state.q || state.label || state.status
      ? "No job matches these filters." : "No jobs yet: submit one, or run tuneyard demo.";
  };
  const restart = () => {
    state.cursors = [null];
    state.page = 0;
    const query = new URLSearchParams();
    for (const key of ["q", "label", "status"]) if (state[key]) query.set(key, state[key]);
    if (state.sort !== "-created_at") query.set("sort", state.sort);
    history.replaceState({}, "", `/${query.size ? `?${query}` : ""}`);
    refresh();
  };
  wireControls(view, state, restart, refresh);
  return every(3000, refresh);
}

function skeleton() {
  const heads = Object.entries(SORTABLE).map(([key, title]) =>
    `<th data-sort-key="${key}" aria-sort="none"><button type="button" class="sort" data-sort="${key}">${title}</button></th>`);
  return `
    <div class="panel">
      <div class="row" id="jobs-toolbar">
        <h1>Jobs</h1><span class="spacer"></span>
        <label>Search <input id="job-search" type="search" placeholder="name or id" autocomplete="off"></label>
        <label>Label <input id="label-filter" placeholder="key=value" autocomplete="off"></label>
        <label>State <select id="state-filter"><option value="">all</option></select></label>
        <a class="button" href="/compare" data-link id="compare-selected">Compare selected</a>
        <a class="button primary" href="/submit" data-link>New job</a>
      </div>
      <div class="table-scroll"><table id="jobs-table" class="dense"><thead><tr>
        <th><span class="visually-hidden">Select</span></th>${heads[0]}${heads[1]}<th>Progress</th>
        <th>Loss</th><th>Attempt</th>${heads[2]}${heads[3]}</tr></thead><tbody></tbody></table></div>
      <p class="muted" id="jobs-empty" hidden></p>
      <div class="row pager" id="pager">
        <button type="button" id="page-prev">← Newer</button>
        <span id="page-info" aria-live="polite"></span>
        <button type="button" id="page-next">Older →</button>
      </div>
    </div>`;
}

function wireControls(view, state, restart, refresh) {
  const $ = (sel) => view.querySelector(sel);
  let typing = null;
  $("#job-search").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.q = event.target.value.trim(); restart(); }, 250);
  });
  $("#label-filter").addEventListener("change", (event) => { state.label = event.target.value.trim(); restart(); });
  $("#state-filter").addEventListener("change", (event) => { state.status = event.target.value; restart(); });
  $("#jobs-table thead").addEventListener("click", (event) => {
    const key = event.target.closest("[data-sort]")?.dataset.sort;
    if (!key) return;
    const current = state.sort.replace(/^-/, "");
    // A new column starts in its natural order: names A→Z, the newest/highest first.
    state.sort = current === key ? (state.sort.startsWith("-") ? key : `-${key}`)
      : (key === "name" || key === "status" ? key : `-${key}`);
    restart();
  });
  $("#page-prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); refresh(); });
  $("#page-next").addEventListener("click", () => {
    if (state.cursors[state.page + 1]) { state.page += 1; refresh(); }
  });
  const compare = $("#compare-selected");
  $("#jobs-table tbody").addEventListener("change", (event) => {
    const box = event.target.closest("input[data-id]");
    if (!box) return;
    if (box.checked) state.selected.add(box.dataset.id); else state.selected.delete(box.dataset.id);
    compare.setAttribute("href", `/compare?ids=${[...state.selected].join(",")}`);
  });
}

function drawPager(view, state, shown, total, hasMore) {
  const first = state.page * PAGE + (shown ? 1 : 0);
  const last = state.page * PAGE + shown;
  view.querySelector("#page-info").textContent = `${first}–${last} of ${total}`;
  view.querySelector("#page-prev").disabled = state.page === 0;
  view.querySelector("#page-next").disabled = !hasMore;
}

function drawSortHeaders(view, sort) {
  const key = sort.replace(/^-/, "");
  for (const th of view.querySelectorAll("th[data-sort-key]")) {
    const on = th.dataset.sortKey === key;
    const value = on ? (sort.startsWith("-") ? "descending" : "ascending") : "none";
    if (th.getAttribute("aria-sort") !== value) th.setAttribute("aria-sort", value);
  }
}

// Rows are keyed by job id and their cells rewritten only when their text changed, so a
// refresh never replaces the element that has the keyboard focus.
function syncRows(tbody, jobs, selected) {
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.job, tr]));
  jobs.forEach((job, index) => {
    let tr = existing.get(job.id);
    if (!tr) tr = newRow(job, selected.has(job.id));
    existing.delete(job.id);
    fillRow(tr, job);
    if (tbody.rows[index] !== tr) tbody.insertBefore(tr, tbody.rows[index] || null);
  });
  for (const stale of existing.values()) stale.remove();
}

function newRow(job, checked) {
  const tr = document.createElement("tr");
  tr.dataset.job = job.id;
  const name = job.name || job.id;
  tr.innerHTML = `<td><input type="checkbox" data-id="${esc(job.id)}" ${checked ? "checked" : ""}
      aria-label="Select ${esc(name)} for comparison"></td>
    <td class="name-cell"><a href="/jobs/${esc(job.id)}" data-link>${esc(name)}</a>
      <span class="muted mono">${esc(job.id.slice(0, 8))}</span><div data-cell="reason" class="reason"></div></td>
    <td data-cell="state"></td><td class="num" data-cell="progress"></td><td class="num" data-cell="loss"></td>
    <td class="num" data-cell="attempt"></td><td class="num" data-cell="priority"></td><td data-cell="created"></td>`;
  return tr;
}

function fillRow(tr, job) {
  const { step, maxSteps, loss } = progressOf(job);
  const pct = maxSteps ? Math.min(100, (100 * (step || 0)) / maxSteps) : 0;
  const failures = job.failed_attempts ?? 0;
  const cells = {
    reason: job.status === "failed" && (job.error_message || job.error_code)
      ? `<span class="field-error">${esc(job.error_code ? `${job.error_code}: ` : "")}${esc(job.error_message || "")}</span>` : "",
    state: stateBadge(job.status),
    progress: `<span class="bar ${esc(job.status)}" role="progressbar" aria-label="steps done"
      aria-valuemin="0" aria-valuemax="${maxSteps ?? 0}" aria-valuenow="${step ?? 0}"><span data-pct="${pct}"></span></span>${step ?? 0} / ${maxSteps ?? "?"}`,
    loss: loss === null || loss === undefined ? "" : esc(formatNumber(loss)),
    attempt: `${job.attempt ?? 0}${failures ? ` <span class="muted" title="failed attempts of the retry budget">· ${failures}/${job.max_attempts} failed</span>` : ""}`,
    priority: esc(job.priority ?? 0),
    created: `<span title="${esc(job.created_at)}">${esc(age(job.created_at))}</span>`,
  };
  for (const [key, html] of Object.entries(cells)) {
    const cell = tr.querySelector(`[data-cell="${key}"]`);
    if (cell.lastHtml === html) continue;
    cell.lastHtml = html;
    cell.innerHTML = html;
    // Widths through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    for (const bar of cell.querySelectorAll("[data-pct]")) bar.style.width = `${bar.dataset.pct}%`;
  }
}
