// What a job leaves behind, on its page: checkpoints (why each is kept, what was deleted,
// when and why), exports (start one, watch it, cancel it), what the artifact store holds
// (presigned download links) and, for an admin key, the project's webhook deliveries about
// this job. Everything comes from the API the CLI uses; a panel the key may not read says so.

import { api, ApiError, itemsOf } from "./api.js";
import { formatNumber } from "./chart.js";
import { bytes, clock, esc, flash, stateBadge } from "./util.js";

export function outputsHtml() {
  return `
    <div class="panel" id="checkpoints-panel"><h2>Checkpoints</h2>
      <table id="checkpoints"><thead><tr><th>Step</th><th>Kept because</th><th>Size</th><th>Loss</th><th>Saved</th></tr></thead>
      <tbody></tbody></table>
      <details id="deleted-checkpoints" hidden><summary>Deleted checkpoints (<span id="deleted-count">0</span>)</summary>
        <table><thead><tr><th>Step</th><th>Reason</th><th>By</th><th>Size</th><th>Deleted</th></tr></thead><tbody></tbody></table>
      </details></div>
    <div class="panel" id="exports-panel"><h2>Exports</h2>
      <form id="export-form" class="row">
        <label>Checkpoint <select id="export-step"><option value="">latest</option></select></label>
        <label><input type="checkbox" id="export-merge" checked> Merge LoRA into the base</label>
        <label>dtype <select id="export-dtype"><option>float32</option><option>bfloat16</option><option>float16</option></select></label>
        <button type="submit" id="export-start">Export</button>
      </form>
      <table id="exports"><thead><tr><th>Export</th><th>Step</th><th>Kind</th><th>dtype</th><th>State</th><th>Size</th><th>Actions</th></tr></thead>
      <tbody></tbody></table></div>
    <div class="panel" id="artifacts-panel"><h2>In the artifact store</h2>
      <table id="artifacts"><thead><tr><th>Name</th><th>Kind</th><th>Step</th><th>Size</th><th>Files</th><th></th></tr></thead>
      <tbody></tbody></table><ul id="artifact-links" class="mono"></ul></div>
    <div class="panel" id="webhooks-panel"><h2>Webhook deliveries</h2>
      <p class="muted" id="webhooks-note"></p>
      <table id="deliveries"><thead><tr><th>Event</th><th>State</th><th>Attempts</th><th>Answer</th><th>Sent</th></tr></thead>
      <tbody></tbody></table></div>`;
}

// Wire the export form and the table buttons once; `refresh` redraws after a request.
export function bindOutputs(view, jobId, refresh) {
  view.querySelector("#export-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const step = view.querySelector("#export-step").value;
    const body = { merge_lora: view.querySelector("#export-merge").checked,
      dtype: view.querySelector("#export-dtype").value };
    if (step) body.step = Number(step);
    try {
      await api(`/v1/jobs/${jobId}/exports`, { method: "POST", body });
      flash("Export queued.", "ok");
    } catch (err) { flash(err instanceof ApiError ? err.message : String(err)); }
    refresh();
  });
  view.querySelector("#exports").addEventListener("click", async (event) => {
    const id = event.target.dataset.cancelExport;
    if (!id) return;
    try { await api(`/v1/exports/${id}/cancel`, { method: "POST" }); } catch (err) { flash(err.message); }
    refresh();
  });
  view.querySelector("#artifacts").addEventListener("click", async (event) => {
    const name = event.target.dataset.download;
    if (name) showLinks(view, jobId, name);
  });
}

export async function drawOutputs(view, jobId, job, checkpointPage) {
  drawCheckpoints(view, checkpointPage);
  const [exports, artifacts] = await Promise.all([
    api(`/v1/jobs/${jobId}/exports`).then(itemsOf).catch(() => []),
    api(`/v1/jobs/${jobId}/artifacts`).then(itemsOf).catch(() => []),
  ]);
  drawExports(view, exports);
  drawArtifacts(view, artifacts);
  await drawDeliveries(view, jobId, job);
}

function drawCheckpoints(view, page) {
  const kept = itemsOf(page), deleted = page?.deleted || [];
  view.querySelector("#checkpoints tbody").innerHTML = kept.length ? kept.map((c) => `<tr data-step="${esc(c.step)}">
    <td class="num">${esc(c.step)}${c.stored_only ? ` <span class="muted" title="its local copy was evicted: the artifact store holds it">stored only</span>` : ""}</td><td>${esc((c.kept_because || []).join(", ") || "–")}</td>
    <td class="num">${esc(bytes(c.size_bytes))}</td>
    <td class="num">${esc(formatNumber(c.metrics?.val_loss ?? c.metrics?.loss))}</td>
    <td>${esc(clock(c.created_at))}</td></tr>`).join("")
    : `<tr><td colspan="5" class="muted">No checkpoints yet.</td></tr>`;
  const box = view.querySelector("#deleted-checkpoints");
  box.hidden = !deleted.length;
  view.querySelector("#deleted-count").textContent = String(deleted.length);
  box.querySelector("tbody").innerHTML = deleted.map((d) => `<tr>
    <td class="num">${esc(d.step)}</td><td>${esc(d.reason)}</td><td>${esc(d.source)}</td>
    <td class="num">${esc(bytes(d.size_bytes))}</td><td>${esc(clock(d.deleted_at))}</td></tr>`).join("");
  const select = view.querySelector("#export-step");
  const steps = kept.map((c) => String(c.step));
  const shown = [...select.options].slice(1).map((o) => o.value);
  if (steps.join() !== shown.join()) {  // rebuilt only when the steps change: a choice stays
    const chosen = select.value;
    select.innerHTML = `<option value="">latest</option>` + steps.map((s) => `<option value="${esc(s)}">step ${esc(s)}</option>`).join("");
    select.value = steps.includes(chosen) ? chosen : "";
  }
}

function drawExports(view, exports) {
  view.querySelector("#exports tbody").innerHTML = exports.length ? exports.map((e) => `<tr data-export="${esc(e.id)}">
    <td class="mono" title="${esc(e.id)}">${esc(e.id.slice(0, 8))}</td><td class="num">${esc(e.step)}</td>
    <td>${esc(e.kind)}</td><td>${esc(e.dtype)}</td>
    <td>${stateBadge(e.status)}${e.error_message ? `<div class="muted">${esc(e.error_message.slice(0, 200))}</div>` : ""}</td>
    <td class="num">${e.size_bytes ? esc(bytes(e.size_bytes)) : "–"}</td>
    <td>${e.actions.includes("cancel") ? `<button data-cancel-export="${esc(e.id)}">Cancel</button>` : ""}
      ${e.path ? `<span class="mono muted">${esc(e.path)}</span>` : ""}</td></tr>`).join("")
    : `<tr><td colspan="7" class="muted">No exports yet: choose a checkpoint and export it.</td></tr>`;
}

function drawArtifacts(view, artifacts) {
  view.querySelector("#artifacts tbody").innerHTML = artifacts.length ? artifacts.map((a) => `<tr>
    <td class="mono">${esc(a.name)}</td><td>${esc(a.kind)}</td><td class="num">${esc(a.step ?? "–")}</td>
    <td class="num">${esc(bytes(a.size_bytes))}</td><td class="num">${esc(a.files)}</td>
    <td><button data-download="${esc(a.name)}" aria-label="Download links for ${esc(a.name)}">Download</button></td></tr>`).join("")
    : `<tr><td colspan="6" class="muted">Nothing stored: no artifact store is configured, or nothing is uploaded yet.</td></tr>`;
}

async function showLinks(view, jobId, name) {
  const list = view.querySelector("#artifact-links");
  try {
    const answer = await api(`/v1/jobs/${jobId}/artifacts/${encodeURIComponent(name)}/download`);
    list.innerHTML = answer.files.map((f) => `<li><a href="${esc(f.url)}" rel="noreferrer">${esc(f.path)}</a>
      (${esc(bytes(f.size))}, sha256 ${esc(f.sha256.slice(0, 12))}…)</li>`).join("")
      + `<li class="muted">Links expire ${esc(clock(answer.expires_at))}.</li>`;
  } catch (err) { flash(err.message); }
}

// An admin key reads the project's webhooks; the deliveries about this job are listed.
async function drawDeliveries(view, jobId, job) {
  const note = view.querySelector("#webhooks-note"), tbody = view.querySelector("#deliveries tbody");
  let hooks;
  try {
    hooks = itemsOf(await api(`/v1/projects/${encodeURIComponent(job.project)}/webhooks`));
  } catch (err) {
    note.textContent = err.status === 403 ? "Webhooks are visible to the project's admin keys." : err.message;
    tbody.innerHTML = "";
    return;
  }
  const pages = await Promise.all(hooks.map((h) =>
    api(`/v1/projects/${encodeURIComponent(job.project)}/webhooks/${h.id}/deliveries`, { query: { limit: 50 } })
      .then(itemsOf).catch(() => [])));
  const mine = pages.flat().filter((d) => JSON.stringify(d.payload?.data ?? {}).includes(jobId));
  note.textContent = hooks.length ? `${hooks.length} webhook(s) in this project; the deliveries about this job:`
    : "This project has no webhooks (POST /v1/projects/{name}/webhooks).";
  tbody.innerHTML = mine.map((d) => `<tr data-delivery="${esc(d.id)}">
    <td>${esc(d.event)}</td><td>${stateBadge(d.status)}</td><td class="num">${esc(d.attempts)}</td>
    <td>${esc(d.last_status_code ?? d.last_error ?? "–")}</td>
    <td>${esc(clock(d.delivered_at || d.last_attempt_at || d.created_at))}</td></tr>`).join("");
}
