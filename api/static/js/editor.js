// The recipe editor: a plain <textarea> (native undo, selection, form semantics and every
// assistive technology's support) over a <pre> that draws the same text with YAML
// highlighting. Tab / Shift+Tab indent and dedent the selected lines by two spaces, Enter
// keeps the line's indentation (one level more after `key:`); Escape then Tab leaves the
// editor, so the keyboard is never trapped.

import { esc } from "./util.js";

const INDENT = "  ";

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

export function highlight(text) {
  // A trailing newline needs a line of its own in the <pre> for the heights to match.
  return text.split("\n").map(highlightLine).join("\n") + "\n";
}

// Wires `textarea` to its highlight layer `pre`; `onChange` runs after every edit.
export function attachEditor(textarea, pre, onChange) {
  let leaving = false;
  const paint = () => { pre.innerHTML = highlight(textarea.value); syncScroll(); };
  const syncScroll = () => { pre.scrollTop = textarea.scrollTop; pre.scrollLeft = textarea.scrollLeft; };
  textarea.addEventListener("input", () => { paint(); onChange?.(); });
  textarea.addEventListener("scroll", syncScroll);
  textarea.addEventListener("keydown", (event) => {
    if (event.key === "Escape") { leaving = true; return; }
    if (event.key === "Tab" && !leaving && !event.ctrlKey && !event.altKey && !event.metaKey) {
      event.preventDefault();
      indentSelection(textarea, event.shiftKey);
    } else if (event.key === "Enter" && !event.shiftKey && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      newlineWithIndent(textarea);
    }
    leaving = false;
  });
  paint();
  return paint; // to repaint after a programmatic change of `value`
}

// Edits through execCommand keep the browser's undo history; setRangeText where it is absent.
function replaceSelection(textarea, text) {
  if (!document.execCommand?.("insertText", false, text)) textarea.setRangeText(text, textarea.selectionStart, textarea.selectionEnd, "end");
  textarea.dispatchEvent(new Event("input"));
}

function newlineWithIndent(textarea) {
  const before = textarea.value.slice(0, textarea.selectionStart);
  const line = before.slice(before.lastIndexOf("\n") + 1);
  let pad = line.match(/^\s*/)[0];
  if (/:\s*$/.test(line)) pad += INDENT;
  else if (/^\s*-\s/.test(line) && /:\s*$/.test(line)) pad += INDENT;
  replaceSelection(textarea, `\n${pad}`);
}

function indentSelection(textarea, dedent) {
  const { value, selectionStart: start, selectionEnd: end } = textarea;
  const from = value.lastIndexOf("\n", start - 1) + 1;
  if (!dedent && start === end) { replaceSelection(textarea, INDENT); return; }
  const to = end > from && value[end - 1] === "\n" ? end - 1 : end;
  const block = value.slice(from, to);
  const lines = block.split("\n").map((l) => dedent ? l.replace(/^ {1,2}/, "") : INDENT + l);
  textarea.setSelectionRange(from, to);
  replaceSelection(textarea, lines.join("\n"));
  textarea.setSelectionRange(from, from + lines.join("\n").length);
}
