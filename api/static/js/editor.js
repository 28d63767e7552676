// The recipe editor. Its editing core is CodeJar (vendored: vendor/codejar/, see its README)
// on a contenteditable element: Enter keeps the line's indentation (one level more after
// `key:`), Tab / Shift+Tab indent and dedent the line, Ctrl+Z / Ctrl+Shift+Z walk its undo
// history, and it calls yaml_highlight.js to draw the text. Added here: Tab on a selection
// indents every selected line and Shift+Tab dedents them (or the caret's line, wherever the
// caret stands in it), Escape then Tab leaves the editor (the keyboard is never trapped),
// and the element answers `value` like a textarea, so the page, its tests and browser
// extensions read and set the recipe one way.

import { CodeJar } from "../vendor/codejar/codejar.js";
import { esc } from "./util.js";
import { highlight } from "./yaml_highlight.js";

const INDENT = "  ";

// Wires the editor `element` (role textbox, with an accessible name); `onChange` runs after
// every edit. Returns `repaint` (after a programmatic change) and `select(start, end)`.
export function attachEditor(element, onChange) {
  let leaving = false;
  // Registered before CodeJar's own listener, so it runs first and may stop it.
  element.addEventListener("keydown", (event) => {
    const tab = event.key === "Tab" && !event.ctrlKey && !event.altKey && !event.metaKey;
    if (tab && leaving) event.stopImmediatePropagation(); // the browser moves the focus on
    else if (tab && (event.shiftKey || hasSelection())) {
      event.preventDefault();
      event.stopImmediatePropagation();
      indentLines(jar, event.shiftKey);
    }
    leaving = event.key === "Escape";
  });
  const jar = CodeJar(element, (el) => { el.innerHTML = highlight(el.textContent); }, {
    tab: INDENT, indentOn: /:[ \t]*$/, addClosing: false,
  });
  // CodeJar wraps long lines; the line-number gutter needs one visual line per line.
  Object.assign(element.style, { whiteSpace: "pre", overflowWrap: "normal", overflow: "auto" });
  let last = jar.toString();
  const changed = () => {
    const now = jar.toString();
    if (now !== last) { last = now; onChange?.(); }
  };
  jar.onUpdate(changed); // after a key, a paste, a cut (and undo, which sets the HTML)
  element.addEventListener("input", changed);
  Object.defineProperty(element, "value", {
    configurable: true,
    get: () => jar.toString(),
    set: (text) => jar.updateCode(String(text ?? ""), false),
  });
  const repaint = () => {
    const pos = document.activeElement === element ? jar.save() : null;
    element.innerHTML = highlight(jar.toString());
    if (pos) jar.restore(pos);
  };
  const select = (start, end) => {
    element.focus();
    jar.restore({ start, end });
  };
  repaint();
  return { repaint, select };
}

function hasSelection() {
  const selection = getSelection();
  return selection.rangeCount > 0 && !selection.isCollapsed;
}

// Indents (or dedents by up to one level) every line the selection touches, keeps them
// selected (a caret stays on its line), and records the edit in CodeJar's undo history.
function indentLines(jar, dedent) {
  const text = jar.toString();
  const lineEnd = (at) => (text.indexOf("\n", at) < 0 ? text.length : text.indexOf("\n", at));
  const pos = jar.save();
  const start = Math.min(pos.start, pos.end);
  const end = Math.max(pos.start, pos.end);
  const from = text.lastIndexOf("\n", start - 1) + 1;
  const to = lineEnd(end > start && text[end - 1] === "\n" ? end - 1 : end); // a line ended, not begun
  const lines = text.slice(from, to).split("\n")
    .map((line) => (dedent ? line.replace(/^ {1,2}/, "") : INDENT + line));
  const block = lines.join("\n");
  jar.recordHistory();
  jar.restore({ start: from, end: to });
  // As CodeJar inserts: HTML keeps the newlines (Chrome's insertText drops them here).
  document.execCommand("insertHTML", false, esc(block)); // fires `input`
  jar.updateCode(jar.toString(), false); // draw the highlight again
  const caret = Math.max(from, start + lines[0].length - (lineEnd(from) - from)); // moves with its text
  jar.restore(start === end ? { start: caret, end: caret } : { start: from, end: from + block.length });
  jar.recordHistory();
}
