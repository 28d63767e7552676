// Job page (/jobs/{id}): state, live charts fed by the metrics cursor, events drawn on the
// loss chart (each resume with its verdict), the dataset rows of a clicked loss point,
// checkpoints, log tail, and cancel / pause / resume.

import { api, ApiError, itemsOf } from "./api.js";
import { formatNumber, LineChart } from "./chart.js";
import { bytes, clock, esc, every, flash, stateBadge } from "./util.js";

const MAX_POINTS = 800; // history is fetched downsampled to this; live points are appended
const CHARTS = [
  ["loss", "Loss (train and validation)"], ["lr", "Learning rate"], ["grad_norm", "Gradient norm"],
  ["tps", "Tokens / s"], ["mfu", "MFU"],
];
const MARKER_STYLE = {
  checkpoint: ["#1f9d55", "ckpt"], resumed: ["#9b51e0", "resume"], retrying: ["#c98a0b", "retry"],
  preempted: ["#c98a0b", "preempt"], failed: ["#d64545", "failed"], paused: ["#7d8597", "pause"],
  verified: ["#1f9d55", "resume ✓"], mismatch: ["#d64545", "resume ✗"], rollback: ["#d64545", "rollback"],
};
const VERDICT_EVENTS = { resume_verified: "verified", resume_mismatch: "mismatch", rollback: "rollback" };

export function renderJob(view, jobId) {
  view.innerHTML = skeleton(jobId);
  const onPick = (key) => key === "loss" ? (step) => showStepRows(view, jobId, step) : null;
  const charts = Object.fromEntries(CHARTS.map(([key]) => [key,
    new LineChart(view.querySelector(`#chart-${key}`), { emptyText: "Waiting for metrics…", onPick: onPick(key) })]));
  const state = { job: null, train: [], val: [], trainCursor: null, valCursor: null,
    events: [], checkpoints: [], logCursor: null, logLines: [] };

  const pollMetrics = async () => {
    const grew = (await pull(jobId, "train", state)) | (await pull(jobId, "val", state));
    if (grew) drawCharts(charts, state);
  };
  const pollJob = async () => {
    state.job = await api(`/v1/jobs/${jobId}`);
    drawHeader(view, state.job);
    const [events, checkpoints] = await Promise.all([
      api(`/v1/jobs/${jobId}/events`).then(itemsOf).catch(() => state.events),
      api(`/v1/jobs/${jobId}/checkpoints`).then(itemsOf).catch(() => state.checkpoints),
    ]);
    state.events = events;
    state.checkpoints = checkpoints;
    drawEvents(view, events);
    drawMemory(view, state.job.plan, events);
    drawCheckpoints(view, checkpoints);
    drawCharts(charts, state);
  };
  const pollLogs = async () => {
    const query = state.logCursor === null ? {} : { cursor: state.logCursor };
    const body = await api(`/v1/jobs/${jobId}/logs`, { query });
    const lines = itemsOf(body);
    if (!lines.length) return;
    state.logCursor = body.next_cursor ?? state.logCursor;
    state.logLines = state.logLines.concat(lines.map((line) => line.text)).slice(-400);
    const pre = view.querySelector("#log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    pre.textContent = state.logLines.join("\n");
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  };

  view.querySelector("#actions").addEventListener("click", (event) => {
    const verb = event.target.dataset.action;
    if (verb) act(jobId, verb, view).then(pollJob);
  });
  const stops = [
    every(2000, async () => {
      if (state.job && state.job.terminal && state.finalDrawn) return;
      await pollJob();
      await pollMetrics();
      if (state.job && state.job.terminal) state.finalDrawn = true;
    }),
    every(3000, pollLogs),
  ];
  return () => stops.forEach((stop) => stop());
}

function skeleton(jobId) {
  const charts = CHARTS.map(([key, title]) => `
    <div class="panel ${key === "loss" ? "wide" : ""}"><h2>${title}</h2><div id="chart-${key}" data-metric="${key}"></div></div>`).join("");
  return `
    <div class="panel">
      <div class="row"><div><h1 id="job-name">${esc(jobId)}</h1>
        <div class="muted mono">${esc(jobId)}</div></div>
        <span id="job-state"></span><span class="spacer"></span>
        <div id="actions" class="row">
          <button data-action="pause" id="btn-pause">Pause</button>
          <button data-action="resume" id="btn-resume">Resume</button>
          <button data-action="cancel" id="btn-cancel" class="danger">Cancel</button>
        </div></div>
      <dl class="kv" id="job-details"></dl>
      <dl class="kv" id="job-memory"></dl>
    </div>
    <div class="grid">${charts}
      <div class="panel"><h2>Events</h2><ul class="timeline" id="events"></ul></div>
    </div>
    <div class="panel" id="rows-panel"><h2>Rows of step <span id="rows-step">–</span></h2>
      <p class="muted" id="rows-note">Click a point of the loss chart to see the dataset rows that made that step.</p>
      <table id="step-rows"><thead><tr><th>Row</th><th>Id</th><th>Rank</th><th>Micro-batch</th><th>Tokens</th><th>Text</th></tr></thead>
      <tbody></tbody></table></div>
    <div class="panel"><h2>Checkpoints</h2>
      <table id="checkpoints"><thead><tr><th>Step</th><th>Path</th><th>Size</th><th>Loss</th><th>Saved</th></tr></thead>
      <tbody></tbody></table></div>
    <div class="panel"><h2>Log</h2><pre class="log" id="log">No log lines yet.</pre></div>`;
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

// A debiased exponential moving average (as TensorBoard draws it): a noisy loss still shows
// its trend, without the plain EMA's lag behind the first steps.
function smoothed(raw, label, weight = 0.9) {
  let avg = 0;
  const points = raw.points.map((p, i) => {
    avg = weight * avg + (1 - weight) * p.y;
    return { x: p.x, y: avg / (1 - weight ** (i + 1)) };
  });
  return { label, points, color: raw.color };
}

function drawCharts(charts, state) {
  const markers = eventMarkers(state);
  const loss = series(state.train, "loss", "train loss (raw)", { color: "#2f6fde", faint: true });
  charts.loss.update([loss, smoothed(loss, "train loss (smoothed)"),
    series(state.val, "val_loss", "val loss", { color: "#e07b39", dots: true })], markers);
  charts.lr.update([series(state.train, "lr", "lr")], markers.filter((m) => m.kind !== "checkpoint"));
  charts.grad_norm.update([series(state.train, "grad_norm", "grad norm")]);
  charts.tps.update([series(state.train, "tps", "tokens/s")]);
  charts.mfu.update([series(state.train, "mfu", "mfu")]);
}

// Markers for the loss chart: checkpoints at their step; state events at the step reached then.
function eventMarkers(state) {
  const markers = state.checkpoints.map((c) => ({ x: c.step, kind: "checkpoint", label: `checkpoint ${c.path || ""}` }));
  for (const e of state.events) {
    const kind = markerKind(e);
    if (!kind || kind === "checkpoint") continue;
    const step = e.step ?? e.data?.step ?? stepAt(state.train, e.created_at ?? e.timestamp);
    if (step !== null && step !== undefined) markers.push({ x: step, kind, label: e.message || kind });
  }
  // A resume with its verdict is drawn once, as the verdict.
  const judged = new Set(markers.filter((m) => m.kind === "verified" || m.kind === "mismatch").map((m) => m.x));
  return markers.filter((m) => !(m.kind === "resumed" && judged.has(m.x)))
    .map((m) => ({ ...m, color: MARKER_STYLE[m.kind][0], short: MARKER_STYLE[m.kind][1] }));
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
  const kind = e.data?.event || e.kind || e.event || "";
  if (VERDICT_EVENTS[kind]) return VERDICT_EVENTS[kind];
  if (kind.includes("checkpoint")) return "checkpoint";
  if (kind === "resumed") return "resumed";
  if (kind === "preempted") return "preempted";
  if (e.to_status === "retrying" || kind === "retrying") return "retrying";
  if (e.to_status === "failed" || kind === "failed") return "failed";
  if (e.to_status === "paused") return "paused";
  return null;
}

function stepAt(train, when) {
  if (!when || !train.length) return null;
  const t = typeof when === "number" ? when : new Date(when).getTime() / 1000;
  let step = null;
  for (const r of train) if (r.timestamp && r.timestamp <= t) step = r.step;
  return step;
}

function drawHeader(view, job) {
  view.querySelector("#job-name").textContent = job.name || job.id;
  view.querySelector("#job-state").innerHTML = stateBadge(job.status);
  const allowed = job.actions || []; // the server decides what may be asked now
  for (const verb of ["cancel", "pause", "resume"]) view.querySelector(`#btn-${verb}`).disabled = !allowed.includes(verb);
  const plan = job.plan || {};
  const res = job.resources || {};
  const rows = [
    ["Attempt", `${job.attempt ?? 0} of ${job.max_attempts ?? "?"}`],
    ["Steps", plan.max_steps ?? "?"],
    ["Resources", `${res.nnodes ?? 1} node × ${res.nproc_per_node ?? 1} ${res.accelerator ?? ""}`],
    ["Created", job.created_at ? new Date(job.created_at).toLocaleString() : ""],
    ["Labels", Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "–"],
  ];
  if (job.error_code || job.error_message) rows.push(["Error", `${job.error_code || ""}: ${job.error_message || ""}`]);
  view.querySelector("#job-details").innerHTML = rows.map(([k, v]) =>
    `<dt>${esc(k)}</dt><dd ${k === "Error" ? 'class="field-error" id="job-error"' : ""}>${esc(v)}</dd>`).join("");
}

// Memory per rank: the plan's estimate beside the peaks the trainer measured on each rank
// (the `finished` event, else `started`), and the estimate's error against the largest.
function drawMemory(view, plan, events) {
  const estimate = plan?.estimate?.memory_per_rank_bytes;
  const measuredIn = (name) => events.map((e) => e.data || {}).filter((d) => d.event === name && Array.isArray(d.peak_memory_bytes)).pop();
  const measured = measuredIn("finished") || measuredIn("started");
  const rows = [];
  if (estimate) {
    const parts = ["params", "grads", "optimizer", "activations", "workspace"].map((k) => `${k} ${bytes(estimate[k])}`).join(", ");
    rows.push(["Memory estimate", `${bytes(estimate.total)} per rank (${parts})`]);
  } else rows.push(["Memory estimate", "– (model size or sequence length unknown at submit)"]);
  if (measured) {
    const peaks = measured.peak_memory_bytes;
    const top = Math.max(...peaks);
    const error = estimate && top > 0 ? ` · estimate ${((estimate.total - top) / top * 100).toFixed(1)}% off` : "";
    rows.push([`Measured peak (${measured.event})`, peaks.map((p, rank) => `rank ${rank} ${bytes(p)}`).join(", ") + error]);
  } else rows.push(["Measured peak", "– (reported when training starts)"]);
  view.querySelector("#job-memory").innerHTML = rows.map(([k, v]) => `<dt>${esc(k)}</dt><dd data-memory="${esc(k)}">${esc(v)}</dd>`).join("");
}

function drawEvents(view, events) {
  const list = view.querySelector("#events");
  list.innerHTML = events.length ? events.slice().reverse().map((e) => {
    const what = e.to_status ? `${e.from_status || "–"} → ${e.to_status}` : (e.data?.event || e.kind || "");
    const step = e.step ?? e.data?.step;
    return `<li data-kind="${esc(e.data?.event || e.kind || "")}"><time>${esc(clock(e.created_at ?? e.timestamp))}</time>
      <strong>${esc(what)}</strong>${step !== undefined && step !== null ? ` <span class="muted">step ${esc(step)}</span>` : ""}
      ${e.message ? ` <span class="muted">${esc(e.message)}</span>` : ""}</li>`;
  }).join("") : `<li class="muted">No events yet.</li>`;
}

function drawCheckpoints(view, checkpoints) {
  const tbody = view.querySelector("#checkpoints tbody");
  tbody.innerHTML = checkpoints.length ? checkpoints.map((c) => `<tr>
    <td class="num">${esc(c.step)}</td><td class="mono">${esc(c.path)}</td>
    <td class="num">${esc(bytes(c.size_bytes))}</td>
    <td class="num">${esc(formatNumber(c.metrics?.loss ?? c.metrics?.val_loss))}</td>
    <td>${esc(clock(c.created_at))}</td></tr>`).join("")
    : `<tr><td colspan="5" class="muted">No checkpoints yet.</td></tr>`;
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
