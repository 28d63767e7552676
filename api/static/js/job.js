// Job page (/jobs/{id}): state and the run's facts (job_facts.js), live charts fed by the
// metrics cursor, events drawn on the loss chart by what happened (pause, resume, cancel,
// preempt, retry; each resume with its verdict), the dataset rows of a clicked loss point,
// checkpoints, the log (job_log.js), cancel (after a confirmation) / pause / resume, and
// "clone and edit" into the submit page.

import { api, ApiError, itemsOf } from "./api.js";
import { LineChart } from "./chart.js";
import { stepClock } from "./chart_data.js";
import {
  attemptRows, failureOf, hyperparameters, kvHtml, memoryRows, progressRows, recipeHtml,
} from "./job_facts.js";
import { logPanel, logPanelHtml } from "./job_log.js";
import { bindOutputs, drawOutputs, outputsHtml } from "./job_outputs.js";
import { clock, esc, every, flash, setTitle, stateBadge } from "./util.js";

const MAX_POINTS = 800; // history is fetched downsampled to this; live points are appended
const CHARTS = [
  ["loss", "Loss (train and validation)"], ["lr", "Learning rate"], ["grad_norm", "Gradient norm"],
  ["tps", "Tokens / s"], ["mfu", "MFU"],
];
// Marker colour and short text per event label (the events API names what happened).
const MARKER_STYLE = {
  checkpoint: ["#1f9d55", "ckpt"], resume: ["#9b51e0", "resume"], retry: ["#c98a0b", "retry"],
  preempt: ["#c98a0b", "preempt"], fail: ["#d64545", "failed"], pause: ["#7d8597", "pause"],
  cancel: ["#4a4a4a", "cancel"],
  verified: ["#1f9d55", "resume ✓"], mismatch: ["#d64545", "resume ✗"], rollback: ["#d64545", "rollback"],
};
const VERDICT_EVENTS = { resume_verified: "verified", resume_mismatch: "mismatch", rollback: "rollback" };

export function renderJob(view, jobId) {
  view.innerHTML = skeleton(jobId);
  const onPick = (key) => key === "loss" ? (step) => showStepRows(view, jobId, step) : null;
  const charts = Object.fromEntries(CHARTS.map(([key]) => [key,
    new LineChart(view.querySelector(`#chart-${key}`), { emptyText: "Waiting for metrics…", onPick: onPick(key) })]));
  const state = { job: null, train: [], val: [], trainCursor: null, valCursor: null,
    events: [], checkpoints: [] };

  const pollMetrics = async () => {
    const grew = (await pull(jobId, "train", state)) | (await pull(jobId, "val", state));
    if (grew) drawCharts(charts, state);
  };
  const pollJob = async () => {
    state.job = await api(`/v1/jobs/${jobId}`);
    drawHeader(view, state.job, state.train);
    state.events = await api(`/v1/jobs/${jobId}/events`).then(itemsOf).catch(() => state.events);
    drawEvents(view, state.events);
    view.querySelector("#job-memory").innerHTML = kvHtml(memoryRows(state.job.plan, state.events), "data-memory");
    await pollOutputs();
    drawCharts(charts, state);
  };
  // Checkpoints, exports, stored artifacts and deliveries change after the run ends too.
  const pollOutputs = async () => {
    if (!state.job) return;
    const page = await api(`/v1/jobs/${jobId}/checkpoints`).catch(() => null);
    const steps = (list) => list.map((c) => c.step).join();
    if (page && steps(itemsOf(page)) !== steps(state.checkpoints)) {
      state.checkpoints = itemsOf(page);
      drawCharts(charts, state); // checkpoint markers on the loss chart
    }
    await drawOutputs(view, jobId, state.job, page);
  };
  bindOutputs(view, jobId, pollOutputs);
  const pollLogs = logPanel(view, jobId);

  view.querySelector("#actions").addEventListener("click", async (event) => {
    const verb = event.target.dataset.action;
    if (!verb) return;
    if (verb === "clone") { cloneJob(jobId); return; }
    if (verb === "cancel" && !(await confirmCancel(view, state.job))) return;
    act(jobId, verb, view).then(pollJob);
  });
  const stops = [
    every(2000, async () => {
      if (state.job && state.job.terminal && state.finalDrawn) return;
      await pollJob();
      await pollMetrics();
      if (state.job && state.job.terminal) state.finalDrawn = true;
    }),
    every(3000, pollLogs),
    // Once the job has ended pollJob stops; exports and deliveries still change.
    every(3000, () => (state.finalDrawn ? pollOutputs() : null)),
  ];
  return () => stops.forEach((stop) => stop());
}

function skeleton(jobId) {
  const charts = CHARTS.map(([key, title]) => `
    <div class="panel ${key === "loss" ? "wide" : ""}" id="panel-${key}"><h2>${title}</h2><div id="chart-${key}" data-metric="${key}"></div></div>`).join("");
  return `
    <div class="panel">
      <div class="row"><div><h1 id="job-name">${esc(jobId)}</h1>
        <div class="muted mono">${esc(jobId)}</div></div>
        <span id="job-state"></span><span class="spacer"></span>
        <div id="actions" class="row">
          <button data-action="clone" id="btn-clone" title="Open the submit page with this job's recipe">Clone and edit</button>
          <button data-action="pause" id="btn-pause">Pause</button>
          <button data-action="resume" id="btn-resume">Resume</button>
          <button data-action="cancel" id="btn-cancel" class="danger">Cancel</button>
        </div></div>
      <div class="failure" id="job-failure" hidden></div>
      <div class="facts">
        <dl class="kv" id="job-progress"></dl>
        <dl class="kv" id="job-details"></dl>
      </div>
      <dl class="kv" id="job-memory"></dl>
    </div>
    <div class="facts">
      <div class="panel"><h2>Hyperparameters</h2><dl class="kv" id="job-hyper"></dl></div>
      <div class="panel"><details id="recipe-panel"><summary><h2>Resolved recipe</h2>
        <span class="muted" id="override-count"></span></summary>
        <pre class="recipe" id="job-recipe"></pre></details></div>
    </div>
    <div class="grid">${charts}
      <div class="panel"><h2>Events</h2><ul class="timeline" id="events"></ul></div>
    </div>
    <div class="panel" id="rows-panel"><h2>Rows of step <span id="rows-step">–</span></h2>
      <p class="muted" id="rows-note">Click a point of the loss chart to see the dataset rows that made that step.</p>
      <table id="step-rows"><thead><tr><th>Row</th><th>Id</th><th>Rank</th><th>Micro-batch</th><th>Tokens</th><th>Text</th></tr></thead>
      <tbody></tbody></table></div>
    ${outputsHtml()}
    ${logPanelHtml()}
    <dialog id="cancel-dialog" aria-labelledby="cancel-title">
      <form method="dialog"><h2 id="cancel-title">Cancel this job?</h2>
        <p id="cancel-text"></p>
        <div class="row"><span class="spacer"></span>
          <button value="keep" id="cancel-keep" autofocus>Keep it running</button>
          <button value="cancel" id="cancel-confirm" class="danger">Cancel job</button></div>
      </form></dialog>`;
}

// Fetch new records of one kind after the cursor; re-fetch downsampled when too many pile up.
async function pull(jobId, kind, state) {
  const key = kind === "train" ? "train" : "val";
  const cursorKey = `${key}Cursor`;
  const query = state[cursorKey] === null ? { kind, max_points: MAX_POINTS } : { kind, cursor: state[cursorKey], limit: 1000 };
  const page = await api(`/v1/jobs/${jobId}/metrics`, { query });
  const records = itemsOf(page);
  if (!records.length) return false;
  state[key] = state[cursorKey] === null ? records : state[key].concat(records);
  state[cursorKey] = page.next_cursor;
  if (state[key].length > 2 * MAX_POINTS) state[cursorKey] = null; // next poll re-downsamples
  return true;
}

function series(records, field, label, extra = {}) {
  return { label, ...extra,
    points: records.filter((r) => r[field] !== null && r[field] !== undefined).map((r) => ({ x: r.step, y: r[field] })) };
}

function drawCharts(charts, state) {
  const markers = eventMarkers(state);
  const clock = { clock: stepClock(state.train) }; // x by tokens seen or wall time
  charts.loss.update([series(state.train, "loss", "train loss", { color: "#2f6fde", smooth: true }),
    series(state.val, "val_loss", "val loss", { color: "#e07b39", dots: true, dashed: true })], markers, clock);
  charts.lr.update([series(state.train, "lr", "lr")], markers.filter((m) => m.kind !== "checkpoint"), clock);
  charts.grad_norm.update([series(state.train, "grad_norm", "grad norm", { smooth: true })], [], clock);
  charts.tps.update([series(state.train, "tps", "tokens/s", { smooth: true })], [], clock);
  charts.mfu.update([series(state.train, "mfu", "mfu", { smooth: true })], [], clock);
}

// Markers for the loss chart: checkpoints at their step; each thing that happened (pause,
// resume, cancel, preempt, retry, failure) once per attempt, at the step reached then.
function eventMarkers(state) {
  const markers = state.checkpoints.map((c) => ({ x: c.step, kind: "checkpoint", label: `checkpoint ${c.path || ""}` }));
  const seen = new Map();
  for (const e of state.events) {
    const kind = markerKind(e);
    if (!kind) continue;
    const explicit = e.data?.step ?? null;
    const step = explicit ?? stepAt(state.train, e.created_at);
    if (step === null || step === undefined) continue;
    const key = `${kind}:${e.attempt}`;
    const earlier = seen.get(key);
    // One marker per thing per attempt: a pause is asked, stops the trainer, is recorded.
    if (earlier && (earlier.explicit || explicit === null)) continue;
    const marker = { x: step, kind, label: `${kind}: ${e.message || ""}`.trim(), explicit: explicit !== null };
    if (earlier) markers[markers.indexOf(earlier)] = marker; else markers.push(marker);
    seen.set(key, marker);
  }
  // A resume with its verdict is drawn once, as the verdict.
  const judged = new Set(markers.filter((m) => m.kind === "verified" || m.kind === "mismatch").map((m) => m.x));
  return markers.filter((m) => !(m.kind === "resume" && judged.has(m.x)))
    .map(({ explicit, ...m }) => ({ ...m, color: MARKER_STYLE[m.kind][0], short: MARKER_STYLE[m.kind][1] }));
}

// The dataset rows the sampler gave one step (after a resume: the rows the resumed run used).
async function showStepRows(view, jobId, step) {
  view.querySelector("#rows-step").textContent = String(step);
  const note = view.querySelector("#rows-note");
  const tbody = view.querySelector("#step-rows tbody");
  tbody.innerHTML = "";
  let body;
  try {
    body = await api(`/v1/jobs/${jobId}/steps/${step}/samples`);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    note.textContent = err.status === 404 ? `No rows are recorded for step ${step}.` : err.message;
    return;
  }
  view.querySelector("#rows-panel").dataset.step = String(step);
  note.textContent = `${body.data.length} rows, attempt ${body.attempt}, epoch ${body.epoch ?? "–"}`;
  tbody.innerHTML = body.data.map((r) => `<tr data-index="${esc(r.index)}">
    <td class="num">${esc(r.index)}</td><td class="mono">${esc(r.id ?? "–")}</td><td class="num">${esc(r.dp_rank)}</td>
    <td class="num">${esc(r.micro_batch)}</td><td class="num">${esc(r.tokens ?? "–")}</td>
    <td class="mono">${esc(r.preview ?? "")}</td></tr>`).join("");
}

function markerKind(e) {
  const label = e.label;
  if (label === "resume_check") return VERDICT_EVENTS[e.data?.event] || null;
  return label && MARKER_STYLE[label] && label !== "checkpoint" ? label : null;
}

function stepAt(train, when) {
  if (!when || !train.length) return null;
  const t = typeof when === "number" ? when : new Date(when).getTime() / 1000;
  let step = null;
  for (const r of train) if (r.timestamp && r.timestamp <= t) step = r.step;
  return step;
}

function drawHeader(view, job, train) {
  view.querySelector("#job-name").textContent = job.name || job.id;
  setTitle(`${job.name || job.id.slice(0, 8)} (${job.status})`);
  const badge = view.querySelector("#job-state");
  if (badge.dataset.status !== job.status) { badge.dataset.status = job.status; badge.innerHTML = stateBadge(job.status); }
  const allowed = job.actions || []; // the server decides what may be asked now
  for (const verb of ["cancel", "pause", "resume"]) view.querySelector(`#btn-${verb}`).disabled = !allowed.includes(verb);
  const res = job.resources || {};
  view.querySelector("#job-progress").innerHTML = kvHtml([...progressRows(job, train), ...attemptRows(job)]);
  view.querySelector("#job-details").innerHTML = kvHtml([
    ["Resources", `${res.nnodes ?? 1} node × ${res.nproc_per_node ?? 1} ${res.accelerator ?? ""}`],
    ["Queue", job.queue ?? "–"],
    ["Created", job.created_at ? new Date(job.created_at).toLocaleString() : ""],
    ["Labels", Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "–"],
  ]);
  drawFailure(view, job);
  view.querySelector("#job-hyper").innerHTML = kvHtml(hyperparameters(job));
  const recipe = view.querySelector("#job-recipe");
  if (!recipe.dataset.drawn) {
    recipe.dataset.drawn = "1";
    recipe.innerHTML = recipeHtml(job.recipe || {}, job.overrides || []);
    const n = (job.overrides || []).length;
    view.querySelector("#override-count").textContent = n ? `${n} override${n > 1 ? "s" : ""} marked` : "no overrides";
  }
  drawMfuNote(view, job, train);
}

// MFU is measured against a GPU's peak FLOPs: on CPU it is n/a, and a run that ended
// without one says so instead of waiting.
function drawMfuNote(view, job, train) {
  const cpu = (job.resources?.accelerator || job.plan?.accelerator) === "cpu";
  const none = job.terminal && !train.some((r) => Number.isFinite(r.mfu));
  const text = cpu ? "n/a on CPU: MFU is measured against a GPU's peak FLOPs."
    : none ? "No MFU was recorded for this run." : "";
  let note = view.querySelector("#mfu-note");
  view.querySelector("#chart-mfu").hidden = Boolean(text);
  if (!text) { note?.remove(); return; }
  if (!note) {
    note = document.createElement("p");
    note.id = "mfu-note";
    note.className = "muted";
    view.querySelector("#panel-mfu").appendChild(note);
  }
  note.textContent = text;
}

function drawFailure(view, job) {
  const box = view.querySelector("#job-failure");
  const failure = job.status === "failed" ? failureOf(job) : null;
  box.hidden = !failure;
  if (!failure) return;
  box.innerHTML = `<strong>Failed${failure.code ? ` (${esc(failure.code)})` : ""}:</strong>
    <span id="job-error">${esc(failure.message)}</span>
    ${failure.fix ? `<div id="job-fix"><strong>Fix:</strong> ${esc(failure.fix)}</div>` : ""}`;
}

function drawEvents(view, events) {
  const list = view.querySelector("#events");
  list.innerHTML = events.length ? events.slice().reverse().map((e) => {
    const what = e.to_status ? `${e.from_status || "–"} → ${e.to_status}` : (e.data?.event || e.kind || "");
    const step = e.step ?? e.data?.step;
    const tag = e.label ? `<span class="tag ${esc(e.label)}">${esc(e.label)}</span> ` : "";
    return `<li data-kind="${esc(e.data?.event || e.kind || "")}" data-label="${esc(e.label || "")}"><time>${esc(clock(e.created_at ?? e.timestamp))}</time>
      ${tag}<strong>${esc(what)}</strong>${step !== undefined && step !== null ? ` <span class="muted">step ${esc(step)}</span>` : ""}
      ${e.message ? ` <span class="muted">${esc(e.message)}</span>` : ""}</li>`;
  }).join("") : `<li class="muted">No events yet.</li>`;
}

// Cancelling cannot be undone: ask first, naming what is lost.
function confirmCancel(view, job) {
  const dialog = view.querySelector("#cancel-dialog");
  const step = job?.latest_metrics?.step;
  view.querySelector("#cancel-text").textContent = `${job?.name || "The job"} stops${step ? ` at step ${step}` : ""} `
    + "and cannot be resumed; its checkpoints are kept.";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "cancel"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function cloneJob(jobId) {
  history.pushState({}, "", `/submit?from=${encodeURIComponent(jobId)}`);
  window.dispatchEvent(new PopStateEvent("popstate"));
}

async function act(jobId, verb, view) {
  try {
    const job = await api(`/v1/jobs/${jobId}/${verb}`, { method: "POST" });
    flash(`${verb} requested: job is now ${job.status}`, "info");
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    flash(refusalText(verb, err));
  }
  view.querySelector(`#btn-${verb}`).blur();
}

// What to show when the API refused an action: a 409 names the state the job is in now.
export function refusalText(verb, err) {
  if (err.status === 409 && err.currentStatus) return `Cannot ${verb}: the job is ${err.currentStatus}.`;
  return err.message;
}
