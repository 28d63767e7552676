// Small DOM helpers shared by the pages.

export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

export function age(iso) {
  if (!iso) return "";
  const seconds = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 60) return `${Math.floor(seconds)}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ago`;
  return `${Math.floor(seconds / 86400)}d ago`;
}

export function clock(value) {
  if (value === null || value === undefined) return "";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleTimeString();
}

export function bytes(n) {
  if (!Number.isFinite(n)) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function flash(message, kind = "error") {
  const box = document.getElementById("flash");
  box.textContent = message;
  box.className = kind;
  box.hidden = !message;
  clearTimeout(flash.timer);
  if (message) flash.timer = setTimeout(() => { box.hidden = true; }, 8000);
}

// The tab's title: what the page shows, then the app's name.
export function setTitle(what) {
  document.title = what ? `${what} · tuneyard` : "tuneyard";
}

export function stateBadge(status) {
  return `<span class="state ${esc(status)}" data-state="${esc(status)}">${esc(status)}</span>`;
}


// (latest step, max_steps, latest loss) from the job's summary.
export function progressOf(job) {
  const latest = job.latest_metrics || {};
  return { step: latest.step ?? null, maxSteps: job.max_steps ?? null, loss: latest.loss ?? null };
}

// Polls `fn` every `ms` until `stop()`; skips a tick while the previous one is running.
export function every(ms, fn) {
  let timer = null, busy = false, stopped = false;
  const tick = async () => {
    if (stopped || busy) return;
    busy = true;
    try { await fn(); } catch (err) { if (err.status !== 401) console.warn(err); }
    busy = false;
  };
  tick();
  timer = setInterval(tick, ms);
  return () => { stopped = true; clearInterval(timer); };
}
