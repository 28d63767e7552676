// The numbers behind the charts, without DOM or uPlot: what each metric is called and in
// which unit, the x axes (step, tokens seen, wall time) derived from a run's train records,
// smoothing, the y range that a spike or a diverged run cannot squash, and the event markers
// grouped per step with label rows that never overlap. Node runs these in the tests.

// Axis titles with units, per MetricsSample field. `scale` turns the stored value into the
// unit shown (MFU is stored as 0..1 and shown in %); `smooth` marks noisy train metrics,
// which get the smoothing slider; `robust` those whose y range leaves outliers out by
// default (a schedule such as lr has none: its warmup is not an outlier).
export const METRICS = {
  loss: { label: "loss", axis: "loss (nats / token)", smooth: true, robust: true },
  val_loss: { label: "val loss", axis: "validation loss (nats / token)", robust: true },
  grad_norm: { label: "grad norm", axis: "gradient norm (L2)", smooth: true, robust: true },
  lr: { label: "lr", axis: "learning rate" },
  tps: { label: "tokens/s", axis: "throughput (tokens / s)", smooth: true, robust: true },
  tps_per_rank: { label: "tokens/s per rank", axis: "throughput per rank (tokens / s)", smooth: true, robust: true },
  mem: { label: "memory", axis: "peak memory, rank 0 (GiB)" },
  mfu: { label: "MFU", axis: "MFU (%)", scale: 100, smooth: true, robust: true },
  num_tokens: { label: "tokens / step", axis: "tokens per step" },
};

// The x axes: [the toolbar's short name, the axis title].
export const X_MODES = {
  step: ["step", "step"],
  tokens: ["tokens", "tokens seen"],
  time: ["time", "wall time (elapsed)"],
};

// The step -> (tokens seen, elapsed seconds) map of one run, from its train records. The
// records may be downsampled: a skipped step is counted with the tokens of the next record
// kept, so the estimate is exact when every step is present.
export function stepClock(records) {
  const rows = records.filter((r) => Number.isFinite(r.step)).slice().sort((a, b) => a.step - b.step);
  const steps = [], tokens = [], times = [];
  let total = 0, prev = 0, hasTokens = rows.length > 0, hasTime = rows.length > 0;
  for (const r of rows) {
    if (!Number.isFinite(r.num_tokens)) hasTokens = false;
    if (!Number.isFinite(r.timestamp)) hasTime = false;
    total += (r.num_tokens || 0) * Math.max(r.step - prev, 1);
    prev = r.step;
    steps.push(r.step);
    tokens.push(total);
    times.push(r.timestamp);
  }
  const start = hasTime ? Math.min(...times) : 0;
  return {
    hasTokens, hasTime, lastStep: steps.length ? steps[steps.length - 1] : null,
    tokensAt: (step) => (hasTokens ? interpolate(steps, tokens, step) : null),
    timeAt: (step) => (hasTime ? interpolate(steps, times, step) - start : null),
  };
}

// Linear between the known steps (binary search), held at the first and last beyond them.
function interpolate(xs, ys, x) {
  if (!xs.length) return null;
  if (x <= xs[0]) return ys[0];
  if (x >= xs[xs.length - 1]) return ys[ys.length - 1];
  let lo = 0, hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid; else hi = mid;
  }
  return ys[lo] + ((ys[hi] - ys[lo]) * (x - xs[lo])) / (xs[hi] - xs[lo]);
}

// A debiased exponential moving average (as TensorBoard draws it), so the first steps do not
// lag; a missing or non-finite value stays missing and does not poison what follows.
export function ema(values, weight) {
  let avg = 0, n = 0;
  return values.map((v) => {
    if (!Number.isFinite(v)) return v === undefined ? undefined : null;
    n += 1;
    avg = weight * avg + (1 - weight) * v;
    return weight > 0 ? avg / (1 - weight ** n) : v;
  });
}

function quantile(sorted, q) {
  const at = (sorted.length - 1) * q, lo = Math.floor(at);
  return sorted[lo] + (sorted[Math.min(lo + 1, sorted.length - 1)] - sorted[lo]) * (at - lo);
}

// The y range to draw: every finite value, or with `clip` the values inside Tukey's far-out
// fences (3 interquartile ranges beyond the quartiles; the range floored at 1% of the
// median's size so a flat series is not magnified into noise). Quartiles ignore up to a
// quarter of the values, so a first-steps spike or a diverged run's 1e30 leaves the rest
// readable, and a series without outliers is not clipped. On a log axis, in decades.
export function robustRange(values, { clip = true, log = false } = {}) {
  const vs = values.filter((v) => Number.isFinite(v) && (!log || v > 0)).map((v) => (log ? Math.log10(v) : v));
  vs.sort((a, b) => a - b);
  if (!vs.length) return log ? { min: 0.1, max: 10, clipped: false } : { min: 0, max: 1, clipped: false };
  let lo = vs[0], hi = vs[vs.length - 1], clipped = false;
  if (clip && vs.length >= 8) {
    const q1 = quantile(vs, 0.25), q3 = quantile(vs, 0.75);
    const spread = Math.max(q3 - q1, Math.abs(quantile(vs, 0.5)) * 0.01, 1e-12);
    if (q1 - 3 * spread > lo) { lo = q1 - 3 * spread; clipped = true; }
    if (q3 + 3 * spread < hi) { hi = q3 + 3 * spread; clipped = true; }
  }
  if (hi === lo) {
    const d = log ? 0.1 : Math.abs(lo) * 0.05 || 1;
    lo -= d; hi += d;
  } else {
    const pad = (hi - lo) * 0.05;
    lo = !log && lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
    hi += pad;
  }
  return log ? { min: 10 ** lo, max: 10 ** hi, clipped } : { min: lo, max: hi, clipped };
}

// One marker per step: the labels of every event at that step joined, the first's colour.
export function groupMarkers(markers) {
  const byStep = new Map();
  for (const m of markers) {
    if (!Number.isFinite(m.x)) continue;
    const group = byStep.get(m.x) || { x: m.x, color: m.color, kinds: [], shorts: [], labels: [] };
    const short = m.short || m.label || m.kind || "";
    if (!group.shorts.includes(short)) group.shorts.push(short);
    group.labels.push(m.label || short);
    if (m.kind) group.kinds.push(m.kind);
    byStep.set(m.x, group);
  }
  return [...byStep.values()].sort((a, b) => a.x - b.x)
    .map((g) => ({ ...g, text: g.shorts.join(" · "), title: `step ${g.x}: ${g.labels.join("; ")}` }));
}

// Rows for marker labels at pixel positions: each label hangs right of its line (left of it
// near the right edge) in the first row where it clears the previous label by `gap`; a label
// that fits in no row is hidden (its line stays, and the hover box names it).
export function layoutLabels(items, plotWidth, { rows = 3, gap = 6 } = {}) {
  const ends = Array(rows).fill(-Infinity);
  return items.map(({ x, width }) => {
    let left = x + 3;
    if (left + width > plotWidth) left = Math.max(0, x - 3 - width);
    const row = ends.findIndex((end) => left >= end + gap);
    if (row === -1) return { left, row: -1, hidden: true };
    ends[row] = left + width;
    return { left, row, hidden: false };
  });
}

// Relative luminance contrast (WCAG 2) of two #rrggbb colours.
export function contrast(a, b) {
  const lum = (hex) => {
    const [r, g, bl] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255)
      .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
  };
  const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

// `color` darkened until text in it reaches `ratio` (AA: 4.5) against `background`.
export function readableOn(color, background = "#ffffff", ratio = 4.5) {
  if (!/^#[0-9a-f]{6}$/i.test(color || "")) return "#4a5263";
  let out = color;
  for (let f = 1; contrast(out, background) < ratio && f > 0; f -= 0.05) {
    out = "#" + [1, 3, 5].map((i) => Math.round(parseInt(color.slice(i, i + 2), 16) * f)
      .toString(16).padStart(2, "0")).join("");
  }
  return out;
}

// Round ticks from min to max, about `count` of them (1, 2 or 5 times a power of ten apart).
export function linearTicks(min, max, count = 5) {
  if (!(max > min)) return [min];
  const raw = (max - min) / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const out = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

// Ticks for a log axis: decades (with 2 and 5 between them when at most three decades show),
// or, within less than a decade, round values evenly apart (a log axis from 1.8 to 2.6
// would otherwise show no tick at all).
export function logTicks(min, max) {
  if (!(min > 0) || !(max > min)) return [min];
  if (max / min < 10) return linearTicks(min, max, 5);
  const d0 = Math.floor(Math.log10(min)), d1 = Math.ceil(Math.log10(max));
  const mantissas = d1 - d0 <= 3 ? [1, 2, 5] : [1];
  const every = Math.max(1, Math.ceil((d1 - d0) / 8));
  const out = [];
  for (let d = d0; d <= d1; d += every) {
    for (const m of mantissas) {
      const v = +(m * 10 ** d).toPrecision(12);
      if (v >= min && v <= max) out.push(v);
    }
  }
  return out;
}
