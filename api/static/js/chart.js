// Line charts on uPlot (vendored in /static/vendor/uplot, loaded by index.html as the global
// `uPlot`): several series on shared axes, with a toolbar per chart (x by step, tokens seen or
// wall time; log y; a smoothing slider that draws the raw series faint behind; outliers
// shown or clipped; reset after a drag-zoom), titled axes with units, live legend values, a
// hover box kept inside the chart, event markers grouped per step, and a data table as the
// chart's text alternative. `data-points` on the container counts the points given (the
// browser tests read it to see a chart grow); `container.chart` is this object.
//
// Series: {label, color, points: [{x: step, y}], dashed, dots, faint, smooth, clock}, where
// `smooth` gets the slider and `clock` (chart_data.stepClock of the run's train records)
// gives the tokens / wall-time axes; `update(series, markers, {clock})` sets a clock for
// series without one. Markers: {x: step, label, short, color, kind}.

import { ema, groupMarkers, layoutLabels, logTicks, METRICS, readableOn, robustRange, X_MODES } from "./chart_data.js";

const HEIGHT = 240;
const TABLE_ROWS = 20;
export const PALETTE = ["#2f6fde", "#e07b39", "#1f9d55", "#9b51e0", "#d64545", "#12a4b6", "#c98a0b", "#5d6b82"];
const INT_INCRS = [1, 2, 5].flatMap((m) => Array.from({ length: 16 }, (_, e) => m * 10 ** e)).sort((a, b) => a - b);
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
  172800, 604800];
let chartCount = 0;

export function formatNumber(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : "-∞";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-2 || a >= 1e6)) return v.toExponential(2).replace(/\.?0+e/, "e");
  if (Number.isInteger(v)) return String(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 10) return v.toFixed(2);
  return String(parseFloat(v.toPrecision(4)));
}

export function formatTokens(v) {
  if (!Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  for (const [d, s] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]]) {
    if (a >= d) return `${parseFloat((v / d).toPrecision(3))}${s}`;
  }
  return String(Math.round(v));
}

export function formatDuration(seconds) {
  if (!Number.isFinite(seconds)) return "–";
  const s = Math.round(Math.abs(seconds)), sign = seconds < 0 ? "-" : "";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  if (h) return `${sign}${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${sign}${m}m ${String(r).padStart(2, "0")}s`;
  return `${sign}${r}s`;
}

const X_FORMAT = { step: formatNumber, tokens: formatTokens, time: formatDuration };

function node(tag, attrs = {}, parent = null, text = null) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== null) el.textContent = text;
  if (parent) parent.appendChild(el);
  return el;
}

// A cheap digest of what update() was given: labels, styles, every point, every marker.
function fingerprint(series, markers, clock) {
  let h = 0;
  const mix = (v) => { h = (h * 31 + (Number.isFinite(v) ? v : 7)) % 1e15; };
  for (const s of series) for (const p of s.points) { mix(p.x); mix(p.y); }
  for (const m of markers) mix(m.x);
  const styles = series.map((s) => [s.label, s.color, s.dashed, s.dots, s.faint, s.smooth, s.points.length,
    s.clock?.lastStep]);
  return JSON.stringify([h, styles, markers.map((m) => m.label), clock?.lastStep]);
}

export class LineChart {
  constructor(container, { yFormat = null, emptyText = "No data yet", onPick = null, metric = null } = {}) {
    this.container = container;
    this.onPick = onPick; // called with the step nearest a click (the job page lists its rows)
    this.emptyText = emptyText;
    this.customFormat = yFormat;
    this.id = container.id || `chart-${++chartCount}`;
    this.opts = { x: "step", log: false, smoothing: 0.6, outliers: false };
    this.series = [];
    this.markers = [];
    this.clock = null;
    this.plot = null;
    this.zoomed = false;
    container.classList.add("chart");
    container.chart = this;
    this.buildDom();
    this.setMetric(metric || container.dataset.metric || "");
    this.resize = new ResizeObserver(() => this.fit());
    this.resize.observe(this.host);
  }

  buildDom() {
    const c = this.container;
    c.setAttribute("role", "figure");
    this.tools = node("div", { class: "chart-tools", role: "group" }, c);
    this.host = node("div", { class: "chart-plot" }, c);
    if (this.onPick) c.classList.add("pickable");
    this.empty = node("p", { class: "chart-empty" }, this.host, this.emptyText);
    this.tip = node("div", { class: "chart-tip", role: "presentation" }, this.host);
    this.tip.hidden = true;
    this.summary = node("p", { class: "visually-hidden", id: `${this.id}-summary` }, c);
    c.setAttribute("aria-describedby", this.summary.id);
    this.details = node("details", { class: "chart-data" }, c);
    node("summary", {}, this.details, `Data table (latest ${TABLE_ROWS} points)`);
    this.table = node("table", {}, this.details);
    this.details.addEventListener("toggle", () => this.fillTable());
    this.buildControls();
  }

  buildControls() {
    const t = this.tools, id = this.id;
    const xLabel = node("label", { for: `${id}-x` }, t, "x ");
    const x = node("select", { id: `${id}-x`, "data-control": "x" }, xLabel);
    for (const [value, [text]] of Object.entries(X_MODES)) node("option", { value }, x, text);
    const logLabel = node("label", {}, t);
    const log = node("input", { type: "checkbox", "data-control": "log" }, logLabel);
    logLabel.append(" log y");
    this.smoothWrap = node("label", {}, t, "smoothing ");
    const smooth = node("input", { type: "range", min: "0", max: "0.99", step: "0.01",
      value: String(this.opts.smoothing), "data-control": "smoothing" }, this.smoothWrap);
    const shown = node("output", { "aria-hidden": "true" }, this.smoothWrap, this.opts.smoothing.toFixed(2));
    this.outliersWrap = node("label", {}, t);
    const outliers = node("input", { type: "checkbox", "data-control": "outliers" }, this.outliersWrap);
    this.outliersWrap.append(" show outliers");
    this.resetButton = node("button", { type: "button", "data-control": "reset", disabled: "" }, t, "Reset zoom");
    this.clipNote = node("span", { class: "chart-note", hidden: "" }, t, "y clipped to hide outliers");
    x.addEventListener("change", () => this.setOption("x", x.value));
    log.addEventListener("change", () => this.setOption("log", log.checked));
    outliers.addEventListener("change", () => this.setOption("outliers", outliers.checked));
    smooth.addEventListener("input", () => {
      shown.textContent = Number(smooth.value).toFixed(2);
      this.setOption("smoothing", Number(smooth.value));
    });
    this.resetButton.addEventListener("click", () => this.resetZoom());
    this.controls = { x, log, smooth, outliers };
  }

  // Which metric the y axis shows: its title, unit and scale (chart_data.METRICS).
  setMetric(metric) {
    this.metric = metric;
    this.meta = METRICS[metric] || { label: metric, axis: metric };
    const name = this.meta.axis || "chart";
    this.tools.setAttribute("aria-label", `${name} chart options`);
    this.redraw(true);
  }

  setOption(name, value) {
    this.opts[name] = value;
    this.redraw(name !== "smoothing"); // a new smoothing weight is new data, not a new chart
  }

  update(series, markers = [], { clock = null } = {}) {
    // The pages poll every few seconds: the same data again is not drawn again.
    const seen = fingerprint(series, markers, clock);
    if (seen === this.seen) return;
    this.seen = seen;
    this.series = series.filter((s) => s.points.length);
    this.markers = markers;
    this.clock = clock;
    this.container.dataset.points = String(this.series.reduce((n, s) => n + s.points.length, 0));
    this.redraw(false);
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }

  // ---- data: input series -> drawn series -> uPlot's aligned columns -------------------

  clockOf(s) {
    return s.clock || this.clock || this.series.find((o) => o.clock)?.clock || null;
  }

  xModeReady(mode) {
    if (mode === "step") return true;
    const key = mode === "tokens" ? "hasTokens" : "hasTime";
    return this.series.length > 0 && this.series.every((s) => this.clockOf(s)?.[key]);
  }

  xOf(s, step) {
    if (this.opts.x === "step") return step;
    const clock = this.clockOf(s);
    return this.opts.x === "tokens" ? clock.tokensAt(step) : clock.timeAt(step);
  }

  // The raw series, plus for a smoothable one its EMA on top (the raw drawn faint behind).
  drawnSeries() {
    const out = [];
    const scale = this.meta.scale || 1;
    this.series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const ys = s.points.map((p) => (Number.isFinite(p.y) ? p.y * scale : null));
      const base = { ...s, color, ys, source: s };
      if (s.smooth && this.opts.smoothing > 0) {
        out.push({ ...base, label: `${s.label} (raw)`, faint: true, raw: true });
        out.push({ ...base, ys: ema(ys, this.opts.smoothing), smoothed: true });
      } else out.push(base);
    });
    return out;
  }

  // uPlot wants one ascending x column shared by every series: each series' points are
  // placed at their own x, and `undefined` (spanned over) fills the others' rows.
  columns(drawn) {
    const xs = new Map(); // x -> row
    const stepAt = new Map();
    const perSeries = drawn.map((s) => s.source.points.map((p, j) => {
      const x = this.xOf(s, p.x);
      if (Number.isFinite(x) && !stepAt.has(x)) stepAt.set(x, p.x);
      let y = s.ys[j];
      if (this.opts.log && !(y > 0)) y = y === undefined ? undefined : null;
      return [x, y];
    }));
    for (const pts of perSeries) for (const [x] of pts) if (Number.isFinite(x)) xs.set(x, 0);
    const sorted = [...xs.keys()].sort((a, b) => a - b);
    sorted.forEach((x, i) => xs.set(x, i));
    const data = [sorted, ...perSeries.map((pts) => {
      const col = Array(sorted.length).fill(undefined);
      for (const [x, y] of pts) if (Number.isFinite(x) && col[xs.get(x)] === undefined) col[xs.get(x)] = y;
      return col;
    })];
    this.steps = sorted.map((x) => stepAt.get(x));
    return data;
  }

  // ---- drawing ---------------------------------------------------------------------------

  redraw(rebuild) {
    if (!this.series || !this.tools) return;
    for (const mode of Object.keys(X_MODES)) {
      const option = this.controls.x.querySelector(`option[value=${mode}]`);
      option.disabled = !this.xModeReady(mode);
    }
    if (!this.xModeReady(this.opts.x)) this.opts.x = "step";
    this.controls.x.value = this.opts.x;
    this.smoothWrap.hidden = !this.series.some((s) => s.smooth);
    this.outliersWrap.hidden = !this.meta.robust;
    const drawn = this.drawnSeries();
    const c = this.container;
    Object.assign(c.dataset, { series: String(drawn.length), x: this.opts.x,
      yScale: this.opts.log ? "log" : "linear", smoothing: String(this.opts.smoothing) });
    this.empty.hidden = drawn.length > 0;
    if (!drawn.length) {
      this.destroyPlot();
      this.describe(drawn);
      return;
    }
    const data = this.columns(drawn);
    this.drawn = drawn;
    const shape = JSON.stringify([{ ...this.opts, smoothing: this.opts.smoothing > 0 }, this.metric, drawn.map((s) =>
      [s.label, s.color, !!s.dashed, !!s.faint, this.single(s, data, drawn.indexOf(s) + 1)])]);
    if (rebuild || !this.plot || shape !== this.shape) this.build(drawn, data, shape);
    else this.refresh(data);
    this.describe(drawn);
    if (this.details.open) this.fillTable();
  }

  single(s, data, i) {
    return !!s.dots || data[i].filter((v) => Number.isFinite(v)).length <= 1;
  }

  refresh(data) {
    if (!this.zoomed) {
      this.plot.setData(data);
      return;
    }
    const { min, max } = this.plot.scales.x;
    this.plot.setData(data, false);
    this.plot.setScale("x", { min, max });
  }

  destroyPlot() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.shape = null;
    this.zoomed = false;
    this.resetButton.disabled = true;
  }

  build(drawn, data, shape) {
    const keep = this.zoomed && this.plot && this.shape && JSON.parse(this.shape)[0].x === this.opts.x
      ? { ...this.plot.scales.x } : null;
    this.destroyPlot();
    this.shape = shape;
    this.plot = new globalThis.uPlot(this.options(drawn, data), data, this.host);
    this.plot.over.addEventListener("click", () => this.pick());
    this.plot.over.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.plot.root.querySelector("canvas")?.setAttribute("aria-hidden", "true");
    if (keep) this.plot.setScale("x", { min: keep.min, max: keep.max });
  }

  options(drawn, data) {
    const fmtX = X_FORMAT[this.opts.x];
    const fmtY = this.customFormat || formatNumber;
    const axis = { stroke: "#4a5263", font: "11px system-ui, sans-serif", labelFont: "12px system-ui, sans-serif",
      grid: { stroke: "#eef0f4", width: 1 }, ticks: { stroke: "#c9cfdb", width: 1 } };
    return {
      width: this.width(), height: HEIGHT,
      scales: {
        x: { time: false, range: (u, lo, hi) => this.xRange(lo, hi) },
        y: { distr: this.opts.log ? 3 : 1, log: 10, range: (u) => this.yRange(u) },
      },
      axes: [
        { ...axis, label: X_MODES[this.opts.x][1], labelSize: 16, size: 30,
          incrs: this.opts.x === "time" ? TIME_INCRS : INT_INCRS, values: (u, ticks) => this.xTicks(ticks, fmtX) },
        { ...axis, label: this.meta.axis, labelSize: 18, values: (u, ticks) => ticks.map(fmtY),
          size: (u, values) => 14 + 6.5 * Math.max(3, ...(values || []).map((v) => v.length)),
          ...(this.opts.log ? { splits: (u, i, lo, hi) => logTicks(lo, hi), filter: (u, ticks) => ticks } : {}) },
      ],
      series: [{ label: X_MODES[this.opts.x][1], value: (u, v) => fmtX(v) },
        ...drawn.map((s, i) => this.seriesOptions(s, this.single(s, data, i + 1), fmtY))],
      cursor: { drag: { x: true, y: false, setScale: true }, points: { size: 7 } },
      legend: { live: true, markers: { width: 2, dash: (u, i) => (u.series[i].dash ? "dashed" : "solid") } },
      hooks: {
        setScale: [(u) => this.afterScale(u)],
        setCursor: [(u) => this.showTip(u)],
        draw: [(u) => this.drawMarkers(u)],
      },
    };
  }

  seriesOptions(s, single, fmtY) {
    return {
      label: s.label, stroke: s.color, width: s.faint ? 1 : 2, alpha: s.faint ? 0.3 : 1,
      dash: s.dashed ? [6, 4] : undefined, spanGaps: false,
      points: { show: single, size: 6, fill: s.color, stroke: s.color },
      value: (u, v) => fmtY(v),
    };
  }

  // The x tick labels, also kept on the container for the tests (the canvas has no text).
  xTicks(ticks, fmtX) {
    const out = ticks.map(fmtX);
    this.container.dataset.xTicks = out.join(" ");
    return out;
  }

  xRange(lo, hi) {
    if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [0, 1];
    const range = lo === hi ? [lo - 1, hi + 1] : [lo, hi];
    this.xWindow = range; // uPlot ranges x first, then y over this window
    return range;
  }

  yRange(u) {
    const [x0, x1] = this.xWindow || [-Infinity, Infinity];
    const xs = u.data[0], values = [];
    for (let i = 1; i < u.series.length; i++) {
      if (!u.series[i].show) continue;
      const ys = u.data[i];
      for (let j = 0; j < xs.length; j++) if (xs[j] >= x0 && xs[j] <= x1 && ys[j] != null) values.push(ys[j]);
    }
    const r = robustRange(values, { clip: !!this.meta.robust && !this.opts.outliers, log: this.opts.log });
    this.clipNote.hidden = !r.clipped;
    this.container.dataset.clipped = String(r.clipped);
    return [r.min, r.max];
  }

  afterScale(u) {
    const xs = u.data[0];
    const full = xs.length ? this.xRange(xs[0], xs[xs.length - 1]) : [0, 1];
    const { min, max } = u.scales.x;
    const eps = (full[1] - full[0]) * 1e-9;
    this.xWindow = [min, max];
    this.zoomed = min > full[0] + eps || max < full[1] - eps;
    this.resetButton.disabled = !this.zoomed;
    Object.assign(this.container.dataset, { zoomed: String(this.zoomed), xMin: String(min), xMax: String(max) });
    const y = u.scales.y;
    Object.assign(this.container.dataset, { yMin: String(y.min), yMax: String(y.max) });
  }

  resetZoom() {
    if (!this.plot) return;
    const xs = this.plot.data[0];
    const [min, max] = this.xRange(xs[0], xs[xs.length - 1]);
    this.plot.setScale("x", { min, max });
  }

  width() {
    return Math.max(this.host.clientWidth || this.container.clientWidth || 640, 200);
  }

  fit() {
    if (this.plot && Math.abs(this.plot.width - this.width()) > 1) this.plot.setSize({ width: this.width(), height: HEIGHT });
  }

  pick() {
    const idx = this.plot?.cursor.idx;
    if (this.onPick && idx !== null && idx !== undefined && this.steps[idx] !== undefined) this.onPick(this.steps[idx]);
  }

  // ---- markers, hover box, text alternatives ---------------------------------------------

  markerGroups() {
    const clockSeries = this.series.find((s) => this.clockOf(s)) || this.series[0];
    return groupMarkers(this.markers).map((g) => ({ ...g, px: this.xOf(clockSeries, g.x) }))
      .filter((g) => Number.isFinite(g.px));
  }

  drawMarkers(u) {
    let layer = u.over.querySelector(".chart-markers");
    if (!layer) layer = node("div", { class: "chart-markers" }, u.over);
    layer.replaceChildren();
    const width = u.over.clientWidth;
    const groups = this.markerGroups().map((g) => ({ ...g, left: u.valToPos(g.px, "x") }))
      .filter((g) => g.left >= 0 && g.left <= width);
    const labels = groups.map((g) => {
      const line = node("div", { class: "chart-marker", "data-step": String(g.x), "data-kinds": g.kinds.join(" ") }, layer);
      line.style.left = `${g.left}px`;
      line.style.borderColor = g.color || "#7d8597";
      const label = node("span", { class: "chart-marker-label", title: g.title, "data-step": String(g.x) }, layer, g.text);
      label.style.color = readableOn(g.color || "#4a5263");
      return label;
    });
    const placed = layoutLabels(groups.map((g, i) => ({ x: g.left, width: labels[i].offsetWidth })), width);
    placed.forEach((p, i) => {
      labels[i].hidden = p.hidden;
      labels[i].style.left = `${p.left}px`;
      labels[i].style.top = `${2 + Math.max(p.row, 0) * 13}px`;
    });
  }

  showTip(u) {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined || u.cursor.left < 0) {
      this.tip.hidden = true;
      return;
    }
    const fmtY = this.customFormat || formatNumber;
    this.tip.replaceChildren();
    node("div", { class: "chart-tip-x" }, this.tip, `${X_MODES[this.opts.x][1]} ${X_FORMAT[this.opts.x](u.data[0][idx])}`);
    u.series.forEach((s, i) => {
      if (i === 0 || !s.show) return;
      const j = u.cursor.idxs?.[i] ?? idx;
      const row = node("div", {}, this.tip);
      const swatch = node("i", {}, row);
      swatch.style.borderColor = this.drawn[i - 1]?.color || "#4a5263";
      if (this.drawn[i - 1]?.faint) swatch.classList.add("faint");
      if (s.dash) swatch.classList.add("dashed");
      row.append(`${s.label}: ${fmtY(u.data[i][j])}`);
    });
    const step = this.steps[idx];
    const here = this.markerGroups().filter((g) => g.x === step);
    for (const g of here) node("div", { class: "chart-tip-event" }, this.tip, g.title);
    this.placeTip(u);
  }

  // The hover box sits beside the cursor and flips to the other side near an edge, so it is
  // never cut by the chart's panel.
  placeTip(u) {
    this.tip.hidden = false;
    const box = this.host.getBoundingClientRect(), over = u.over.getBoundingClientRect();
    const cx = over.left - box.left + u.cursor.left, cy = over.top - box.top + u.cursor.top;
    const w = this.tip.offsetWidth, h = this.tip.offsetHeight;
    let left = cx + 14, top = cy + 14;
    if (left + w > box.width) left = cx - 14 - w;
    if (top + h > box.height) top = cy - 14 - h;
    this.tip.style.left = `${Math.max(0, Math.min(left, box.width - w))}px`;
    this.tip.style.top = `${Math.max(0, Math.min(top, box.height - h))}px`;
  }

  describe(drawn) {
    const title = this.meta.axis || this.metric || "chart";
    this.container.setAttribute("aria-label", `${title} by ${X_MODES[this.opts.x][1]}`);
    if (!drawn.length) {
      this.summary.textContent = this.emptyText;
      return;
    }
    const last = this.series.map((s) => {
      const p = [...s.points].reverse().find((q) => Number.isFinite(q.y));
      return p ? `${s.label} ${formatNumber(p.y * (this.meta.scale || 1))} at step ${p.x}` : `${s.label} no finite value`;
    });
    this.summary.textContent = `${this.series.length} series; latest: ${last.join("; ")}.`;
  }

  // The latest points of every given series (raw values), newest first, by step.
  fillTable() {
    if (!this.details.open) return;
    const scale = this.meta.scale || 1;
    const steps = [...new Set(this.series.flatMap((s) => s.points.map((p) => p.x)))].sort((a, b) => b - a)
      .slice(0, TABLE_ROWS);
    const byStep = this.series.map((s) => new Map(s.points.map((p) => [p.x, p.y])));
    this.table.replaceChildren();
    node("caption", {}, this.table, `${this.meta.axis || this.metric}: latest ${steps.length} steps (raw values)`);
    const head = node("tr", {}, node("thead", {}, this.table));
    node("th", { scope: "col" }, head, "step");
    for (const s of this.series) node("th", { scope: "col" }, head, s.label);
    const body = node("tbody", {}, this.table);
    for (const step of steps) {
      const tr = node("tr", {}, body);
      node("th", { scope: "row" }, tr, String(step));
      byStep.forEach((m) => node("td", { class: "num" }, tr, m.has(step) ? formatNumber(m.get(step) * scale) : "–"));
    }
  }
}
