// The submit page's plan preview: what `POST /v1/jobs:validate` planned (mesh, batch
// arithmetic, memory per rank with its parts, ETA, device-hours, what it requires) and the
// warnings about what validation accepted but the job will not use.

import { duration, meshShape } from "./job_facts.js";
import { bytes, esc } from "./util.js";

function count(n) {
  if (!Number.isFinite(n)) return "–";
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)}M`;
  return n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : String(n);
}

function meshText(plan) {
  const extra = plan.ep_size > 1 ? `, ep ${plan.ep_size}` : "";
  return `${plan.strategy ?? "?"} on ${plan.world_size ?? "?"} rank${plan.world_size === 1 ? "" : "s"} `
    + `(${plan.nnodes ?? 1} node × ${plan.nproc_per_node ?? 1} ${plan.accelerator ?? ""}); mesh ${meshShape(plan.mesh_shape)}${extra}`;
}

function batchText(plan) {
  const { global_batch_size: g, local_batch_size: l, dp_size: dp, grad_accumulation_steps: a } = plan;
  if (!g) return "–";
  const parts = `global ${g} = micro-batch ${l ?? "?"} × dp ${dp ?? "?"} × accumulation ${a ?? "?"}`;
  const tokens = plan.tokens_per_step ? `; ${count(plan.tokens_per_step)} tokens/step at sequence length ${plan.seq_length}` : "";
  return parts + tokens;
}

function memoryHtml(estimate) {
  const memory = estimate?.memory_per_rank_bytes;
  if (!memory) return "– (model size or sequence length unknown)";
  const parts = ["params", "grads", "optimizer", "activations", "workspace"]
    .map((k) => `<li><span>${k}</span><span class="num">${esc(bytes(memory[k]))}</span></li>`).join("");
  return `<strong>${esc(bytes(memory.total))}</strong> per rank<ul class="parts">${parts}</ul>`;
}

export function planHtml(answer) {
  const plan = answer.plan || {};
  const est = plan.estimate || {};
  const rows = [
    ["Model", `${plan.architecture ?? "–"}${plan.param_count ? `, ${count(plan.param_count)} parameters` : ""}`
      + (est.trainable_params && est.trainable_params !== plan.param_count ? ` (${count(est.trainable_params)} trainable)` : "")],
    ["Mesh", meshText(plan)],
    ["Batch", batchText(plan)],
    ["Steps", plan.max_steps ?? "–"],
    ["Memory", null],
    ["Time", Number.isFinite(est.eta_seconds)
      ? `≈ ${duration(est.eta_seconds)} (${duration(est.step_seconds)} a step), ${est.device_hours.toFixed(est.device_hours < 1 ? 3 : 1)} device-hours`
      : "–"],
    ["Queue", answer.queue ?? "–"],
  ];
  const requires = Object.entries(plan.requires || {});
  if (requires.length) rows.push(["Requires", requires.map(([pkg, field]) => `${pkg} (for ${field})`).join(", ")]);
  const dl = rows.map(([k, v]) => `<dt>${esc(k)}</dt><dd data-plan="${esc(k.toLowerCase())}">${v === null ? memoryHtml(est) : esc(v)}</dd>`).join("");
  const warnings = (answer.warnings || []).map((w) =>
    `<li><code>${esc(w.loc)}</code>: ${esc(w.msg)}${w.fix ? ` <span class="muted">(${esc(w.fix)})</span>` : ""}</li>`).join("");
  return `<h2>Plan</h2><dl class="kv">${dl}</dl>`
    + (warnings ? `<h3>Warnings</h3><ul class="warnings" id="plan-warnings">${warnings}</ul>` : "");
}

// The value a fix sets, when it is one: `set optimizer.lr: 1.0e-5` or `set a.b: 1, or …`.
export function fixValue(fix) {
  const m = String(fix || "").match(/^set ([A-Za-z_][\w.]*): ([^\s,;()[\]{}]+)(?:$|,|\s+or\s|\s+\()/);
  return m ? { path: m[1], value: m[2] } : null;
}
