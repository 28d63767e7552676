// A small SVG line chart: several series on shared axes, vertical event markers, a hover tip.
// Written for the dashboard (no library, no network). `data-points` on the container counts
// the points drawn, which the browser test reads to see a chart grow.

const NS = "http://www.w3.org/2000/svg";
const H = 240, PAD = { l: 60, r: 14, t: 12, b: 26 };
export const PALETTE = ["#2f6fde", "#e07b39", "#1f9d55", "#9b51e0", "#d64545", "#12a4b6", "#c98a0b", "#5d6b82"];

function el(name, attrs = {}, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

function ticks(min, max, count) {
  if (!(max > min)) return [min];
  const step = niceStep(max - min, count);
  const out = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

export function formatNumber(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-2 || a >= 1e6)) return v.toExponential(2).replace(/\.?0+e/, "e");
  if (Number.isInteger(v)) return String(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 10) return v.toFixed(2);
  return String(parseFloat(v.toPrecision(4)));
}

function extent(series, key) {
  let lo = Infinity, hi = -Infinity;
  for (const s of series) for (const p of s.points) {
    const v = p[key];
    if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  return [lo, hi];
}

export class LineChart {
  constructor(container, { yFormat = formatNumber, emptyText = "No data yet", onPick = null } = {}) {
    this.container = container;
    this.onPick = onPick; // called with the step nearest a click (the job page lists its rows)
    this.yFormat = yFormat;
    this.emptyText = emptyText;
    container.classList.add("chart");
    this.svg = el("svg", { role: "img" });
    container.appendChild(this.svg);
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    container.appendChild(this.legend);
    this.tip = document.createElement("div");
    this.tip.className = "tip";
    this.tip.hidden = true;
    container.appendChild(this.tip);
    this.svg.addEventListener("mousemove", (e) => this.hover(e));
    this.svg.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.svg.addEventListener("click", (e) => this.pick(e));
    if (onPick) container.classList.add("pickable");
    this.series = [];
    this.markers = [];
    this.width = 0;
    this.resize = new ResizeObserver(() => {
      if (container.clientWidth && container.clientWidth !== this.width) this.draw();
    });
    this.resize.observe(container);
  }

  update(series, markers = []) {
    this.series = series.filter((s) => s.points.length);
    this.markers = markers;
    this.container.dataset.points = String(this.series.reduce((n, s) => n + s.points.length, 0));
    this.draw();
  }

  draw() {
    const svg = this.svg;
    this.width = this.container.clientWidth || 640;
    const W = this.width; // drawn at the container's pixel width, so text is never stretched
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    this.legend.innerHTML = "";
    if (!this.series.length) {
      el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg).textContent = this.emptyText;
      return;
    }
    let [x0, x1] = extent(this.series, "x");
    let [y0, y1] = extent(this.series, "y");
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.05 || 1; y1 += Math.abs(y1) * 0.05 || 1; }
    const pad = (y1 - y0) * 0.06;
    y0 -= pad; y1 += pad;
    const sx = (x) => PAD.l + ((x - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
    const sy = (y) => H - PAD.b - ((y - y0) / (y1 - y0)) * (H - PAD.t - PAD.b);
    this.scale = { x0, x1, sx };
    this.drawAxes(svg, { x0, x1, y0, y1, sx, sy, W });
    const shown = this.markers.filter((m) => m.x >= x0 && m.x <= x1).sort((a, b) => a.x - b.x);
    shown.forEach((m, i) => {
      const x = sx(m.x);
      const g = el("g", { class: `marker ${m.kind || ""}`, "data-kind": m.kind || "" }, svg);
      el("line", { x1: x, x2: x, y1: PAD.t, y2: H - PAD.b, stroke: m.color || "#9aa3b5",
        "stroke-dasharray": "3 3", "stroke-width": 1 }, g);
      el("title", {}, g).textContent = `${m.label} @ step ${m.x}`;
      // Labels near the right edge hang to the left; neighbours are staggered down.
      const nearEnd = x > W - PAD.r - 60;
      el("text", { x: nearEnd ? x - 3 : x + 3, y: PAD.t + 9 + (i % 3) * 11, fill: m.color || "#6b7385",
        "font-size": 10, "text-anchor": nearEnd ? "end" : "start" }, g).textContent = m.short || m.label;
    });
    this.series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const d = s.points.filter((p) => Number.isFinite(p.y))
        .map((p, j) => `${j ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join("");
      el("path", { d, fill: "none", stroke: color, "stroke-width": 1.8, "vector-effect": "non-scaling-stroke",
        "stroke-dasharray": s.dashed ? "5 4" : "", "stroke-opacity": s.faint ? 0.3 : 1,
        class: "series", "data-label": s.label }, svg);
      if (s.dots) for (const p of s.points) {
        if (Number.isFinite(p.y)) el("circle", { cx: sx(p.x), cy: sy(p.y), r: 2.6, fill: color }, svg);
      }
      const item = document.createElement("span");
      // Styled through the CSSOM: the page's Content-Security-Policy refuses style attributes.
      const swatch = document.createElement("i");
      swatch.style.background = color;
      swatch.style.opacity = s.faint ? 0.35 : 1;
      item.append(swatch, s.label);
      this.legend.appendChild(item);
    });
  }

  drawAxes(svg, { x0, x1, y0, y1, sx, sy, W }) {
    const grid = el("g", { class: "grid" }, svg);
    const axis = el("g", { class: "axis" }, svg);
    for (const v of ticks(y0, y1, 5)) {
      el("line", { x1: PAD.l, x2: W - PAD.r, y1: sy(v), y2: sy(v), "vector-effect": "non-scaling-stroke" }, grid);
      el("text", { x: PAD.l - 6, y: sy(v) + 4, "text-anchor": "end" }, axis).textContent = this.yFormat(v);
    }
    for (const v of ticks(x0, x1, Math.max(2, Math.floor(W / 90)))) {
      el("text", { x: sx(v), y: H - 8, "text-anchor": "middle" }, axis).textContent = formatNumber(v);
    }
    el("line", { x1: PAD.l, x2: W - PAD.r, y1: H - PAD.b, y2: H - PAD.b, stroke: "#c9cfdb",
      "vector-effect": "non-scaling-stroke" }, axis);
  }

  // The x (step) under the pointer, in data units.
  xAt(event) {
    const box = this.svg.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * this.width;
    const { x0, x1 } = this.scale;
    return x0 + ((px - PAD.l) / (this.width - PAD.l - PAD.r)) * (x1 - x0);
  }

  pick(event) {
    if (!this.onPick || !this.series.length || !this.scale) return;
    const x = this.xAt(event);
    let best = null;
    for (const p of this.series[0].points) if (!best || Math.abs(p.x - x) < Math.abs(best.x - x)) best = p;
    if (best) this.onPick(best.x);
  }

  hover(event) {
    if (!this.series.length || !this.scale) return;
    const box = this.svg.getBoundingClientRect();
    const x = this.xAt(event);
    const lines = [];
    for (const s of this.series) {
      let best = null;
      for (const p of s.points) if (!best || Math.abs(p.x - x) < Math.abs(best.x - x)) best = p;
      if (best) lines.push(`${s.label}: ${this.yFormat(best.y)} @ ${best.x}`);
    }
    this.tip.textContent = lines.join("  ·  ");
    this.tip.hidden = false;
    this.tip.style.left = `${Math.min(event.clientX - box.left + 12, box.width - 220)}px`;
    this.tip.style.top = `${event.clientY - box.top - 28}px`;
  }
}
