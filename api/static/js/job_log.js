// The job page's log panel: every attempt's stdout and stderr in order (a rule line where a
// new attempt begins), a search that shows only the matching lines with the match marked,
// and "follow" that keeps the newest line in view while new lines arrive.

import { api, itemsOf } from "./api.js";
import { esc } from "./util.js";

const KEEP = 5000; // lines held in the page; the API keeps every line
const PAGE = 2000;

export function logPanelHtml() {
  return `<div class="panel" id="log-panel"><div class="row"><h2>Log</h2><span class="spacer"></span>
      <label>Search <input id="log-search" type="search" placeholder="text in a line" autocomplete="off"></label>
      <span id="log-matches" class="muted" aria-live="polite"></span>
      <label><input type="checkbox" id="log-follow" checked> Follow</label></div>
    <pre class="log" id="log" tabindex="0" aria-label="Job log">No log lines yet.</pre></div>`;
}

// Starts the panel; returns the poll function (the page schedules it).
export function logPanel(view, jobId) {
  const pre = view.querySelector("#log");
  const search = view.querySelector("#log-search");
  const follow = view.querySelector("#log-follow");
  const state = { cursor: null, lines: [], lastAttempt: null };
  const draw = () => drawLog(view, state.lines, search.value.trim(), follow.checked);
  search.addEventListener("input", draw);
  follow.addEventListener("change", () => { if (follow.checked) pre.scrollTop = pre.scrollHeight; });
  // Scrolling up to read stops following; scrolling back to the end starts it again.
  pre.addEventListener("scroll", () => {
    follow.checked = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  });
  return async () => {
    let grew = false;
    for (let page = 0; page < 5; page++) {
      const body = await api(`/v1/jobs/${jobId}/logs`, {
        query: { limit: PAGE, ...(state.cursor === null ? {} : { cursor: state.cursor }) } });
      const lines = itemsOf(body);
      if (!lines.length) break;
      grew = true;
      state.cursor = body.next_cursor ?? state.cursor;
      for (const line of lines) {
        if (state.lastAttempt !== null && line.attempt !== state.lastAttempt) {
          state.lines.push({ rule: true, text: `──── attempt ${line.attempt} ────` });
        }
        state.lastAttempt = line.attempt;
        state.lines.push({ text: line.text, stream: line.stream });
      }
      if (!body.has_more) break;
    }
    if (!grew) return;
    state.lines = state.lines.slice(-KEEP);
    draw();
  };
}

function drawLog(view, lines, query, following) {
  const pre = view.querySelector("#log");
  const counter = view.querySelector("#log-matches");
  if (!lines.length) return;
  if (!query) {
    pre.textContent = lines.map((l) => l.text).join("\n");
    counter.textContent = "";
  } else {
    const needle = query.toLowerCase();
    const hits = lines.filter((l) => !l.rule && l.text.toLowerCase().includes(needle));
    counter.textContent = `${hits.length} matching line${hits.length === 1 ? "" : "s"}`;
    pre.innerHTML = hits.map((l) => markMatches(l.text, needle)).join("\n");
  }
  if (following) pre.scrollTop = pre.scrollHeight;
}

function markMatches(text, needle) {
  const lower = text.toLowerCase();
  let out = "", from = 0, at;
  while ((at = lower.indexOf(needle, from)) !== -1) {
    out += esc(text.slice(from, at)) + `<mark>${esc(text.slice(at, at + needle.length))}</mark>`;
    from = at + needle.length;
  }
  return out + esc(text.slice(from));
}
