// YAML highlighting for the recipe editor: one line at a time, as HTML spans by kind (key,
// list dash, comment, and the value's kind). Not a YAML parser: what it cannot classify is
// drawn as a string. Pure (no DOM), so node runs it in the static tests.

import { esc } from "./util.js";

// One line of YAML as HTML: comment, key, list dash, and the value's kind.
export function highlightLine(line) {
  const comment = line.match(/^(.*?)(\s#.*|^#.*)$/);
  const body = comment ? comment[1] : line;
  const tail = comment ? `<span class="y-comment">${esc(comment[2])}</span>` : "";
  const m = body.match(/^(\s*)(-\s+)?((?:"[^"]*"|'[^']*'|[^\s:#"'][^:#]*?))(\s*:)(?=\s|$)(.*)$/);
  if (m) {
    const [, pad, dash, key, colon, value] = m;
    return `${esc(pad)}${dash ? `<span class="y-dash">${esc(dash)}</span>` : ""}<span class="y-key">${esc(key)}</span>${esc(colon)}${valueHtml(value)}${tail}`;
  }
  const item = body.match(/^(\s*)(-\s+)(.*)$/);
  if (item) return `${esc(item[1])}<span class="y-dash">${esc(item[2])}</span>${valueHtml(item[3])}${tail}`;
  return valueHtml(body) + tail;
}

function valueHtml(text) {
  const m = text.match(/^(\s*)(.*?)(\s*)$/);
  const [, lead, core, trail] = m;
  if (!core) return esc(text);
  let kind = "y-str";
  if (/^(true|false|null|~)$/i.test(core)) kind = "y-bool";
  else if (/^[-+]?(\d[\d_]*)?(\.\d+)?([eE][-+]?\d+)?$/.test(core) && /\d/.test(core)) kind = "y-num";
  else if (/^[[{]/.test(core)) kind = "y-flow";
  else if (/^[|>]/.test(core)) kind = "y-block";
  return `${esc(lead)}<span class="${kind}">${esc(core)}</span>${esc(trail)}`;
}

// The whole text as HTML whose text content is exactly `text` (the editor keeps its caret
// by character offsets, so highlighting may add markup but never characters).
export function highlight(text) {
  return text.split("\n").map(highlightLine).join("\n");
}
