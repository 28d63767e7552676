// The job page's facts: progress (step of max, elapsed, ETA, tokens), attempts and the
// retry budget, the failure with its fix, key hyperparameters, memory (the estimate beside
// the measured peak once the run has one), and the resolved recipe with overrides marked.

import { bytes, esc } from "./util.js";

// `{"dp_shard": 4, "tp": 2, "pp": 1}` as "dp_shard 4 × tp 2" (sizes of 1 left out).
export function meshShape(shape) {
  if (!shape || typeof shape !== "object") return shape ? String(shape) : "–";
  const sizes = Object.entries(shape).filter(([, n]) => n !== 1).map(([k, n]) => `${k} ${n}`);
  return sizes.length ? sizes.join(" × ") : "1 rank, no parallelism";
}

export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  if (seconds < 1) return seconds < 0.01 ? "< 0.01s" : `${seconds.toFixed(2)}s`;
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function count(n) {
  if (!Number.isFinite(n)) return "–";
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}

// Seconds per step measured over the records of the latest attempt, else the plan's estimate.
function secondsPerStep(job, train) {
  const recent = train.filter((r) => Number.isFinite(r.timestamp)).slice(-50);
  if (recent.length >= 2) {
    const [a, b] = [recent[0], recent[recent.length - 1]];
    if (b.step > a.step && b.timestamp > a.timestamp) return { value: (b.timestamp - a.timestamp) / (b.step - a.step), measured: true };
  }
  const planned = job.plan?.estimate?.step_seconds;
  return Number.isFinite(planned) ? { value: planned, measured: false } : null;
}

// Tokens so far: the records' own counts when every step is loaded, else steps x tokens/step.
function tokensSoFar(job, train, step) {
  if (train.length && train.length === step && train.every((r) => Number.isFinite(r.num_tokens))) {
    return count(train.reduce((n, r) => n + r.num_tokens, 0));
  }
  const perStep = job.plan?.tokens_per_step;
  return Number.isFinite(perStep) && step ? `≈ ${count(step * perStep)} (at most)` : "–";
}

export function progressRows(job, train) {
  const step = job.latest_metrics?.step ?? (train.length ? train[train.length - 1].step : 0);
  const max = job.max_steps ?? job.plan?.max_steps;
  const started = job.started_at ? new Date(job.started_at).getTime() : null;
  const ended = job.finished_at ? new Date(job.finished_at).getTime() : (job.terminal ? null : Date.now());
  const elapsed = started && ended ? (ended - started) / 1000 : NaN;
  const pace = secondsPerStep(job, train);
  let eta = "–";
  if (job.terminal) eta = "done";
  else if (job.status === "paused") eta = "paused";
  else if (pace && max) eta = `${duration((max - step) * pace.value)}${pace.measured ? "" : " (estimated before start)"}`;
  const pct = max ? ` (${Math.floor((100 * step) / max)}%)` : "";
  return [
    ["Step", `${step} of ${max ?? "?"}${pct}`],
    ["Elapsed", duration(elapsed)],
    ["ETA", eta],
    ["Tokens", tokensSoFar(job, train, step)],
  ];
}

export function attemptRows(job) {
  const failures = job.failed_attempts ?? 0;
  const runs = job.attempt ?? 0;
  return [
    ["Attempt", runs <= 1 ? String(runs) : `${runs} (each retry and each resume starts one)`],
    ["Failures", `${failures} of ${job.max_attempts ?? "?"} allowed (pauses do not count)`],
  ];
}

// "code: message" and, when the message carries one, the fix on its own line.
export function failureOf(job) {
  if (!job.error_code && !job.error_message) return null;
  const text = job.error_message || "";
  const match = text.match(/^(.*?)\s*\(fix: (.*)\)\s*$/s);
  return { code: job.error_code || "", message: match ? match[1] : text, fix: match ? match[2] : "" };
}

function pick(obj, ...path) {
  return path.reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj);
}

export function hyperparameters(job) {
  const r = job.recipe || {};
  const plan = job.plan || {};
  const model = pick(r, "model", "pretrained_model_name_or_path") || pick(r, "model", "config", "_name_or_path")
    || plan.architecture || pick(r, "model", "_target_");
  const peft = r.peft ? `${String(pick(r, "peft", "_target_") || "peft").split(".").pop()}`
    + (pick(r, "peft", "dim") ? ` r=${pick(r, "peft", "dim")}` : "")
    + (pick(r, "peft", "alpha") ? ` α=${pick(r, "peft", "alpha")}` : "") : "none (full fine-tune)";
  return [
    ["Model", model ?? "–"],
    ["Parameters", plan.param_count ? count(plan.param_count) : "–"],
    ["PEFT", peft],
    ["Optimizer", String(pick(r, "optimizer", "_target_") || "–").split(".").pop()],
    ["Learning rate", pick(r, "optimizer", "lr") ?? "–"],
    ["Global batch", plan.global_batch_size ?? pick(r, "step_scheduler", "global_batch_size") ?? "–"],
    ["Micro batch / rank", plan.local_batch_size ?? pick(r, "step_scheduler", "local_batch_size") ?? "–"],
    ["Grad accumulation", plan.grad_accumulation_steps ?? "–"],
    ["Max steps", plan.max_steps ?? "–"],
    ["Sequence length", plan.seq_length ?? "–"],
    ["Mesh", plan.mesh_shape ? `${meshShape(plan.mesh_shape)} (${plan.strategy ?? ""})` : "–"],
  ];
}

// The estimate per rank; the measured peaks; and the estimate's error only against the
// whole run's peak (the `finished` event): a running job's peak so far is not comparable.
export function memoryRows(plan, events) {
  const estimate = plan?.estimate?.memory_per_rank_bytes;
  const measuredIn = (name) => events.map((e) => e.data || {})
    .filter((d) => d.event === name && Array.isArray(d.peak_memory_bytes)).pop();
  const finished = measuredIn("finished");
  const measured = finished || measuredIn("started");
  const rows = [];
  if (estimate) {
    const parts = ["params", "grads", "optimizer", "activations", "workspace"].map((k) => `${k} ${bytes(estimate[k])}`).join(", ");
    rows.push(["Memory estimate", `${bytes(estimate.total)} per rank (${parts})`]);
  } else rows.push(["Memory estimate", "– (model size or sequence length unknown at submit)"]);
  if (!measured) {
    rows.push(["Measured peak", "– (reported when training starts)"]);
    return rows;
  }
  const peaks = measured.peak_memory_bytes;
  const top = Math.max(...peaks);
  let versus = " (so far) · compared with the estimate when the run finishes";
  if (finished && estimate && top > 0) versus = ` · estimate ${((estimate.total - top) / top * 100).toFixed(1)}% off`;
  rows.push([`Measured peak (${measured.event})`, peaks.map((p, rank) => `rank ${rank} ${bytes(p)}`).join(", ") + versus]);
  return rows;
}

export function kvHtml(rows, attr = "data-fact") {
  return rows.map(([k, v]) => `<dt>${esc(k)}</dt><dd ${attr}="${esc(k)}">${esc(v)}</dd>`).join("");
}

// The recipe as YAML lines, each with its dotted path; `marked` paths get a class.
export function recipeHtml(recipe, overrides) {
  const marked = new Map(overrides.map((o) => {
    const [path, ...value] = o.split("=");
    return [path.trim().replace(/^\+/, ""), value.join("=")];
  }));
  const lines = [];
  yamlLines(recipe, "", 0, lines);
  return lines.map(({ path, text }) => {
    const hit = marked.has(path);
    return `<span class="${hit ? "override" : ""}" data-path="${esc(path)}">${esc(text)}${hit ? '<em class="override-tag">override</em>' : ""}</span>`;
  }).join("\n");
}

// A YAML scalar that reads back as the same value: plain words stay plain, other strings
// are JSON-quoted (valid YAML), and 1e-07 is written 1.0e-07 (a YAML 1.1 float needs the dot).
function scalar(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "string") {
    const plain = /^[A-Za-z_/][\w./@+-]*$/.test(v) && !/^(true|false|null|yes|no|on|off|y|n)$/i.test(v);
    return plain ? v : JSON.stringify(v);
  }
  if (typeof v === "number") return String(v).replace(/^(-?\d+)e/, "$1.0e");
  return String(v);
}

function yamlLines(value, path, depth, out) {
  const pad = "  ".repeat(depth);
  if (Array.isArray(value)) {
    value.forEach((item, i) => {
      const here = path ? `${path}.${i}` : String(i);
      if (item && typeof item === "object" && Object.keys(item).length) {
        out.push({ path: here, text: `${pad}-` });
        yamlLines(item, here, depth + 1, out);
      } else out.push({ path: here, text: `${pad}- ${scalar(item)}` });
    });
    return;
  }
  for (const [key, item] of Object.entries(value || {})) {
    const here = path ? `${path}.${key}` : key;
    const nested = item && typeof item === "object" && Object.keys(item).length;
    const empty = item && typeof item === "object" && !nested ? (Array.isArray(item) ? " []" : " {}") : "";
    out.push({ path: here, text: `${pad}${key}:${nested ? "" : empty || ` ${scalar(item)}`}` });
    if (nested) yamlLines(item, here, depth + 1, out);
  }
}

export function recipeToYaml(recipe) {
  const lines = [];
  yamlLines(recipe, "", 0, lines);
  return lines.map((l) => l.text).join("\n") + "\n";
}
