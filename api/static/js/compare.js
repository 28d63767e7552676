// Compare (/compare?ids=a,b&metric=loss): any metric of several jobs on one chart (x by
// step, tokens seen or wall time from the chart's own toolbar), the final metrics of each
// run, and the keys of their resolved recipes (and resources) that differ.

import { api, ApiError, itemsOf } from "./api.js";
import { formatDuration, formatNumber, formatTokens, LineChart, PALETTE } from "./chart.js";
import { METRICS, stepClock } from "./chart_data.js";
import { esc, every, flash, stateBadge } from "./util.js";

const MAX_POINTS = 600;

// The resolved recipe as dotted keys (`optimizer.lr`); a list is one value, written as JSON.
export function flattenRecipe(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    const keys = Object.keys(value);
    if (!keys.length && prefix) out[prefix] = "{}";
    for (const key of keys) flattenRecipe(value[key], prefix ? `${prefix}.${key}` : key, out);
  } else if (prefix) {
    out[prefix] = Array.isArray(value) ? JSON.stringify(value) : value;
  }
  return out;
}

// [key, [value per job]] for the keys whose values are not all the same (missing counts).
export function differingKeys(flats) {
  const keys = [...new Set(flats.flatMap((f) => Object.keys(f)))].sort();
  return keys.map((key) => [key, flats.map((f) => (key in f ? f[key] : undefined))])
    .filter(([, values]) => new Set(values.map((v) => JSON.stringify(v ?? null))).size > 1);
}

// What a job's recipe, resources and overrides say, flattened for the differences table.
export function jobFacts(job) {
  return {
    ...flattenRecipe(job.recipe || {}),
    ...flattenRecipe(job.resources || {}, "resources"),
    overrides: (job.overrides || []).join(" ") || undefined,
  };
}

function lastFinite(records, field) {
  for (let i = records.length - 1; i >= 0; i -= 1) if (Number.isFinite(records[i][field])) return records[i];
  return null;
}

// The final numbers of one run, from its (possibly downsampled) records.
export function finalMetrics(job, train, val) {
  const clock = stepClock(train);
  const loss = lastFinite(train, "loss"), lastVal = lastFinite(val, "val_loss");
  const vals = val.map((r) => r.val_loss).filter(Number.isFinite);
  const tps = train.slice(-20).map((r) => r.tps).filter(Number.isFinite).sort((a, b) => a - b);
  const last = clock.lastStep;
  return [
    ["status", job?.status ?? "–"],
    ["steps", last === null ? "–" : `${last} / ${job?.max_steps ?? "?"}`],
    ["final train loss", formatNumber(loss?.loss)],
    ["final val loss", formatNumber(lastVal?.val_loss)],
    ["best val loss", vals.length ? formatNumber(Math.min(...vals)) : "–"],
    ["tokens seen", last === null || !clock.hasTokens ? "–" : formatTokens(clock.tokensAt(last))],
    ["wall time", last === null || !clock.hasTime ? "–" : formatDuration(clock.timeAt(last))],
    ["tokens/s (median, last 20)", tps.length ? formatNumber(tps[Math.floor(tps.length / 2)]) : "–"],
  ];
}

function skeleton(metric) {
  const options = Object.entries(METRICS).map(([key, m]) =>
    `<option value="${esc(key)}" ${key === metric ? "selected" : ""}>${esc(m.axis)}</option>`).join("");
  return `
    <div class="panel"><h1>Compare runs</h1>
      <div class="row" id="compare-tools">
        <label for="compare-metric">Metric</label><select id="compare-metric">${options}</select>
        <label id="show-val-label"><input type="checkbox" id="show-val" checked> validation loss (dashed)</label>
      </div>
      <div id="compare-chart" data-metric="${esc(metric)}"></div></div>
    <div class="panel"><h2 id="final-title">Final metrics</h2>
      <table id="compare-final" aria-labelledby="final-title"><thead></thead><tbody></tbody></table></div>
    <div class="panel"><h2 id="diff-title">What differs</h2>
      <p class="muted" id="diff-note"></p>
      <table id="compare-diff" aria-labelledby="diff-title"><thead></thead><tbody></tbody></table></div>
    <div class="panel"><h2 id="jobs-title">Jobs</h2><table id="compare-jobs" aria-labelledby="jobs-title">
      <thead><tr><th scope="col">Compare</th><th scope="col">Name</th><th scope="col">State</th>
      <th scope="col">Created</th></tr></thead><tbody></tbody></table></div>`;
}

export function renderCompare(view) {
  const params = new URLSearchParams(location.search);
  const ids = new Set((params.get("ids") || "").split(",").filter(Boolean));
  let metric = METRICS[params.get("metric")] ? params.get("metric") : "loss";
  view.innerHTML = skeleton(metric);
  const chart = new LineChart(view.querySelector("#compare-chart"), {
    emptyText: "Nothing to draw yet: pick jobs below, or wait for their first steps.", metric });
  const cache = new Map(); // id -> {train, val, job, final}
  let jobs = [];
  const nameOf = (id) => cache.get(id)?.job?.name || jobs.find((j) => j.id === id)?.name || id.slice(0, 8);

  const draw = () => {
    const showVal = view.querySelector("#show-val").checked;
    view.querySelector("#show-val-label").hidden = metric !== "loss";
    const out = [];
    [...ids].forEach((id, i) => {
      const data = cache.get(id);
      if (!data) return;
      const color = PALETTE[i % PALETTE.length], clock = stepClock(data.train), name = nameOf(id);
      const kind = metric === "val_loss" ? "val" : "train";
      const points = data[kind].filter((r) => r[metric] !== null && r[metric] !== undefined)
        .map((r) => ({ x: r.step, y: r[metric] }));
      out.push({ label: name, color, clock, points, smooth: !!METRICS[metric].smooth, dots: kind === "val" });
      if (metric === "loss" && showVal && data.val.length) {
        out.push({ label: `${name} (val)`, color, clock, dashed: true, dots: true,
          points: data.val.filter((r) => r.val_loss !== null).map((r) => ({ x: r.step, y: r.val_loss })) });
      }
    });
    chart.update(out);
    drawTables(view, [...ids].filter((id) => cache.has(id)), cache, nameOf);
  };
  const load = async (id) => {
    if (cache.get(id)?.final) return;
    try {
      const [job, train, val] = await Promise.all([api(`/v1/jobs/${id}`),
        ...["train", "val"].map((kind) =>
          api(`/v1/jobs/${id}/metrics`, { query: { kind, max_points: MAX_POINTS } }).then(itemsOf))]);
      cache.set(id, { job, train, val, final: job.terminal });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 404) throw err;
      ids.delete(id); // a mistyped or deleted id in the URL: compare the others
      flash(`Job ${id} not found; left out of the comparison.`);
      sync();
    }
  };
  const sync = () => {
    const query = new URLSearchParams({ ids: [...ids].join(","), metric });
    history.replaceState({}, "", `/compare?${query.toString().replaceAll("%2C", ",")}`);
  };
  const refresh = async () => {
    jobs = itemsOf(await api("/v1/jobs", { query: { limit: 100 } }));
    await Promise.all([...ids].map(load));
    for (const id of ids) if (!jobs.some((j) => j.id === id) && cache.get(id)) jobs.push(cache.get(id).job);
    drawPicker(view, jobs, ids);
    draw();
  };
  view.querySelector("#compare-jobs tbody").addEventListener("change", async (event) => {
    const id = event.target.dataset.id;
    if (!id) return;
    if (event.target.checked) ids.add(id); else ids.delete(id);
    sync();
    await Promise.all([...ids].map(load));
    draw();
  });
  view.querySelector("#compare-metric").addEventListener("change", (event) => {
    metric = event.target.value;
    chart.setMetric(metric);
    sync();
    draw();
  });
  view.querySelector("#show-val").addEventListener("change", draw);
  const stop = every(5000, refresh);
  return () => { stop(); chart.destroy(); };
}

// The job picker, updated in place so a refresh keeps the keyboard focus where it was.
function drawPicker(view, jobs, ids) {
  const tbody = view.querySelector("#compare-jobs tbody");
  const order = jobs.map((j) => j.id).join(",");
  if (tbody.dataset.order !== order) {
    tbody.dataset.order = order;
    tbody.innerHTML = jobs.map((j) => `<tr data-job="${esc(j.id)}">
      <td><input type="checkbox" data-id="${esc(j.id)}" aria-label="Compare ${esc(j.name || j.id)}"></td>
      <td><a href="/jobs/${esc(j.id)}" data-link>${esc(j.name || j.id)}</a></td>
      <td class="state-cell"></td><td>${esc(new Date(j.created_at).toLocaleString())}</td></tr>`).join("");
  }
  for (const j of jobs) {
    const row = tbody.querySelector(`tr[data-job="${CSS.escape(j.id)}"]`);
    row.querySelector("input").checked = ids.has(j.id);
    const cell = row.querySelector(".state-cell");
    if (cell.dataset.state !== j.status) {
      cell.dataset.state = j.status;
      cell.innerHTML = stateBadge(j.status);
    }
  }
}

function headRow(ids, nameOf, first) {
  const cols = ids.map((id, i) => `<th scope="col"><span class="compare-swatch" data-color="${PALETTE[i % PALETTE.length]}"></span>${esc(nameOf(id))}</th>`);
  return `<tr><th scope="col">${esc(first)}</th>${cols.join("")}</tr>`;
}

function paintSwatches(table) {
  for (const s of table.querySelectorAll(".compare-swatch")) s.style.borderColor = s.dataset.color;
}

function drawTables(view, ids, cache, nameOf) {
  const final = view.querySelector("#compare-final");
  const rows = ids.map((id) => finalMetrics(cache.get(id).job, cache.get(id).train, cache.get(id).val));
  final.querySelector("thead").innerHTML = ids.length ? headRow(ids, nameOf, "metric") : "";
  final.querySelector("tbody").innerHTML = ids.length ? rows[0].map(([name], r) => `<tr><th scope="row">${esc(name)}</th>
    ${rows.map((cols) => `<td>${r === 0 ? stateBadge(cols[r][1]) : esc(cols[r][1])}</td>`).join("")}</tr>`).join("")
    : `<tr><td class="muted">Pick jobs below.</td></tr>`;
  paintSwatches(final);
  const diff = view.querySelector("#compare-diff");
  const differing = ids.length > 1 ? differingKeys(ids.map((id) => jobFacts(cache.get(id).job))) : [];
  view.querySelector("#diff-note").textContent = ids.length < 2 ? "Pick two or more jobs to see what differs."
    : differing.length ? `${differing.length} ${differing.length === 1 ? "key differs" : "keys differ"} between the resolved recipes; every other key is the same.`
      : "The resolved recipes and resources are identical.";
  diff.querySelector("thead").innerHTML = differing.length ? headRow(ids, nameOf, "key") : "";
  diff.querySelector("tbody").innerHTML = differing.map(([key, values]) => `<tr data-key="${esc(key)}">
    <th scope="row" class="key">${esc(key)}</th>${values.map((v) =>
      `<td class="differs">${v === undefined ? '<span class="muted">(not set)</span>' : esc(String(v))}</td>`).join("")}</tr>`).join("");
  paintSwatches(diff);
}
