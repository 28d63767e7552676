// Submit (/submit): paste or upload a YAML/JSON recipe, validate it, see each error next to
// its field (the editor line for recipe fields, the input for form fields), then submit.

import { api, ApiError } from "./api.js";
import { esc, flash } from "./util.js";
import { navigate } from "./app.js";

const DRAFT = "tuneyard.draftRecipe";

export function renderSubmit(view) {
  view.innerHTML = `
    <form class="panel" id="submit-form">
      <div class="row"><h1>Submit a job</h1><span class="spacer"></span>
        <label class="button">Upload file<input type="file" id="recipe-file" accept=".yaml,.yml,.json" hidden></label></div>
      <div class="row" id="job-fields">
        <label>Name <input id="job-name" data-loc="name" placeholder="my-finetune"></label>
        <label>Nodes <input id="nnodes" data-loc="resources.nnodes" type="number" min="1" value="1"></label>
        <label>Procs/node <input id="nproc" data-loc="resources.nproc_per_node" type="number" min="1" value="1"></label>
        <label>Accelerator <select id="accelerator" data-loc="resources.accelerator"><option>cpu</option><option>cuda</option></select></label>
      </div>
      <div class="editor"><div class="gutter" id="gutter"></div>
        <textarea id="recipe" spellcheck="false" placeholder="Paste a recipe (YAML or JSON)"></textarea></div>
      <label id="overrides-label">Overrides, one per line (<code>optimizer.lr=1e-4</code>)
        <textarea id="overrides" data-loc="overrides"></textarea></label>
      <div class="row" id="submit-buttons">
        <button type="button" id="validate">Validate</button>
        <button type="submit" class="primary" id="submit">Submit</button>
        <span id="result" class="muted"></span></div>
      <ul class="errors" id="errors"></ul>
    </form>`;
  const $ = (sel) => view.querySelector(sel);
  const editor = $("#recipe");
  editor.value = sessionStorage.getItem(DRAFT) || "";
  const gutter = () => renderGutter($("#gutter"), editor.value, []);
  editor.addEventListener("input", () => {
    sessionStorage.setItem(DRAFT, editor.value);
    view.querySelectorAll(".line-note").forEach((n) => n.remove()); // its line may have moved
    gutter();
  });
  editor.onscroll = () => { $("#gutter").scrollTop = editor.scrollTop; };
  $("#recipe-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    editor.value = await file.text();
    if (!$("#job-name").value) $("#job-name").value = file.name.replace(/\.(ya?ml|json)$/, "");
    sessionStorage.setItem(DRAFT, editor.value);
    gutter();
  });
  $("#validate").addEventListener("click", () => send(view, true));
  $("#submit-form").addEventListener("submit", (event) => { event.preventDefault(); send(view, false); });
  gutter();
}

function requestBody(view) {
  const $ = (sel) => view.querySelector(sel);
  const text = $("#recipe").value;
  const body = {
    name: $("#job-name").value.trim() || "dashboard-job",
    overrides: $("#overrides").value.split("\n").map((s) => s.trim()).filter(Boolean),
    resources: { nnodes: +$("#nnodes").value || 1, nproc_per_node: +$("#nproc").value || 1,
      accelerator: $("#accelerator").value },
  };
  if (text.trim().startsWith("{")) {
    try { body.recipe = JSON.parse(text); return body; } catch { /* let the server say where */ }
  }
  body.recipe_yaml = text;
  return body;
}

async function send(view, validateOnly) {
  const result = view.querySelector("#result");
  showErrors(view, []);
  result.textContent = validateOnly ? "Validating…" : "Submitting…";
  try {
    const answer = await api(validateOnly ? "/v1/jobs:validate" : "/v1/jobs", { method: "POST", body: requestBody(view) });
    if (validateOnly && answer.valid === false) {
      throw new ApiError(422, answer);
    } else if (validateOnly) {
      const plan = answer.plan || {};
      result.innerHTML = `<span class="valid">Valid.</span> ${esc(summary(plan))}`;
      result.dataset.valid = "true";
    } else {
      sessionStorage.removeItem(DRAFT);
      navigate(`/jobs/${answer.id}`);
    }
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    result.dataset.valid = "false";
    if (err.errors.length) {
      result.innerHTML = `<span class="field-error">${err.errors.length} problem${err.errors.length > 1 ? "s" : ""} found.</span>`;
      showErrors(view, err.errors);
    } else {
      result.textContent = "";
      flash(err.message);
    }
  }
}

function summary(plan) {
  const parts = [];
  if (plan.max_steps) parts.push(`${plan.max_steps} steps`);
  if (plan.world_size) parts.push(`world size ${plan.world_size}`);
  if (plan.queue) parts.push(`queue ${plan.queue}`);
  return parts.join(", ");
}

function locText(loc) {
  return Array.isArray(loc) ? loc.filter((p) => p !== "body").join(".") : String(loc || "");
}

function showErrors(view, errors) {
  view.querySelectorAll(".inline-error").forEach((n) => n.remove());
  const text = view.querySelector("#recipe").value;
  const lines = [];
  view.querySelector("#errors").innerHTML = errors.map((e) => {
    const loc = locText(e.loc).replace(/^(recipe_yaml|recipe)\./, "");
    const input = view.querySelector(`[data-loc="${CSS.escape(loc)}"]`) ||
      (loc.startsWith("overrides") ? view.querySelector("#overrides") : null);
    if (input) {
      const note = document.createElement("span");
      note.className = "inline-error field-error";
      note.dataset.loc = loc;
      note.textContent = e.msg;
      input.insertAdjacentElement("afterend", note);
    }
    const line = input ? null : lineOfLoc(text, loc);
    if (line) lines.push({ line, msg: e.msg });
    const where = line ? ` <a href="#" data-line="${line}">line ${line}</a>` : "";
    return `<li class="field-error" data-loc="${esc(loc)}"><code>${esc(loc || "recipe")}</code>${where}: ${esc(e.msg)}
      ${e.fix ? `<div class="muted">fix: ${esc(e.fix)}</div>` : ""}</li>`;
  }).join("");
  renderGutter(view.querySelector("#gutter"), text, lines);
  placeLineNotes(view, lines);
  view.querySelectorAll("[data-line]").forEach((a) => a.addEventListener("click", (event) => {
    event.preventDefault();
    selectLine(view.querySelector("#recipe"), +a.dataset.line);
  }));
}

// Each recipe error also sits beside its line in the editor, and follows it on scroll.
function placeLineNotes(view, lines) {
  const editor = view.querySelector(".editor");
  const textarea = view.querySelector("#recipe");
  editor.querySelectorAll(".line-note").forEach((n) => n.remove());
  const style = getComputedStyle(textarea);
  const lineHeight = parseFloat(style.lineHeight) || 18;
  const notes = lines.map(({ line, msg }) => {
    const note = document.createElement("div");
    note.className = "line-note";
    note.dataset.line = String(line);
    note.textContent = `← ${msg}`;
    editor.appendChild(note);
    return [note, line];
  });
  const place = () => notes.forEach(([note, line]) => {
    const top = parseFloat(style.paddingTop) + (line - 1) * lineHeight - textarea.scrollTop;
    note.style.top = `${top}px`;
    note.hidden = top < 0 || top > textarea.clientHeight - lineHeight;
  });
  textarea.onscroll = () => { view.querySelector("#gutter").scrollTop = textarea.scrollTop; place(); };
  place();
}

function renderGutter(gutter, text, bad) {
  const count = Math.max(1, text.split("\n").length);
  const badLines = new Map(bad.map((b) => [b.line, b.msg]));
  gutter.innerHTML = Array.from({ length: count }, (_, i) => badLines.has(i + 1)
    ? `<span class="bad" title="${esc(badLines.get(i + 1))}">● ${i + 1}</span>` : String(i + 1)).join("\n");
}

// The 1-based line where a dotted path (`optimizer.lr`, `dataset.0.path`) is defined in YAML/JSON.
export function lineOfLoc(text, loc) {
  if (!loc) return null;
  const lines = text.split("\n");
  let from = 0, to = lines.length, indent = -1, found = null;
  for (const part of loc.split(".")) {
    if (/^\d+$/.test(part)) continue;
    const key = new RegExp(`^(\\s*)(?:-\\s+)?["']?${part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}["']?\\s*:`);
    let hit = null;
    for (let i = from; i < to; i++) {
      const m = lines[i].match(key);
      if (m && m[1].length > indent) { hit = i; indent = m[1].length; break; }
    }
    if (hit === null) return found === null ? null : found + 1;
    found = hit;
    from = hit + 1;
    const own = lines[hit].match(/^\s*/)[0].length;
    to = from;
    while (to < lines.length && (!lines[to].trim() || lines[to].match(/^\s*/)[0].length > own)) to++;
  }
  return found === null ? null : found + 1;
}

function selectLine(textarea, line) {
  const lines = textarea.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  textarea.focus();
  textarea.setSelectionRange(start, start + lines[line - 1].length);
}
