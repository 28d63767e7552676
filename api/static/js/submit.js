// Submit (/submit): write, paste or upload a YAML/JSON recipe (or start from an example
// template or an earlier job), validate it and read the full plan, see each error next to
// its field in line order (the editor line for recipe fields, the input for form fields)
// with "apply fix" where the fix is a value, then submit.

import { api, ApiError } from "./api.js";
import { attachEditor } from "./editor.js";
import { recipeToYaml } from "./job_facts.js";
import { fixValue, planHtml } from "./submit_plan.js";
import { esc, flash, setTitle } from "./util.js";
import { navigate } from "./app.js";

const DRAFT = "tuneyard.draftRecipe";

export function renderSubmit(view) {
  view.innerHTML = `
    <form class="panel" id="submit-form">
      <div class="row"><h1>Submit a job</h1><span class="spacer"></span>
        <label>Template <select id="template"><option value="">choose an example…</option></select></label>
        <label>Start from job <input id="from-job" placeholder="job id or prefix" autocomplete="off"></label>
        <button type="button" id="load-job">Load</button>
        <label class="button">Upload file<input type="file" id="recipe-file" accept=".yaml,.yml,.json" hidden></label></div>
      <div class="row" id="job-fields">
        <label>Name <input id="job-name" data-loc="name" placeholder="my-finetune"></label>
        <label>Nodes <input id="nnodes" data-loc="resources.nnodes" type="number" min="1" value="1"></label>
        <label>Procs/node <input id="nproc" data-loc="resources.nproc_per_node" type="number" min="1" value="1"></label>
        <label>Accelerator <select id="accelerator" data-loc="resources.accelerator"><option>cpu</option><option>cuda</option></select></label>
      </div>
      <div class="editor"><div class="gutter" id="gutter" aria-hidden="true"></div>
        <div class="code"><div id="recipe" role="textbox" aria-multiline="true" aria-label="Recipe (YAML or JSON)"
          aria-describedby="editor-keys" aria-placeholder="Paste a recipe (YAML or JSON), or start from a template"></div></div></div>
      <p class="muted small" id="editor-keys">Enter keeps the indentation, Tab indents the selected lines, Shift+Tab dedents,
        Ctrl+Z undoes; press Escape, then Tab, to leave the editor.</p>
      <label id="overrides-label">Overrides, one per line (<code>optimizer.lr=1e-4</code>)
        <textarea id="overrides" data-loc="overrides"></textarea></label>
      <div class="row" id="submit-buttons">
        <button type="button" id="validate">Validate</button>
        <button type="submit" class="primary" id="submit">Submit</button>
        <span id="result" class="muted" aria-live="polite"></span></div>
      <ul class="errors" id="errors"></ul>
      <div id="plan-preview" class="plan" hidden></div>
    </form>`;
  const $ = (sel) => view.querySelector(sel);
  const editor = $("#recipe");
  const gutter = () => renderGutter($("#gutter"), editor.value, []);
  const { repaint, select } = attachEditor(editor, () => {
    sessionStorage.setItem(DRAFT, editor.value);
    view.querySelectorAll(".line-note").forEach((n) => n.remove()); // its line may have moved
    gutter();
  });
  editor.value = sessionStorage.getItem(DRAFT) || "";
  editor.onscroll = () => { $("#gutter").scrollTop = editor.scrollTop; };
  view.repaint = () => { repaint(); gutter(); };
  view.selectRange = select;
  view.setRecipe = (text) => {
    editor.value = text;
    sessionStorage.setItem(DRAFT, text);
    repaint();
    gutter();
    showErrors(view, []);
    $("#plan-preview").hidden = true;
  };
  $("#recipe-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    view.setRecipe(await file.text());
    if (!$("#job-name").value) $("#job-name").value = file.name.replace(/\.(ya?ml|json)$/, "");
  });
  wireSources(view);
  $("#validate").addEventListener("click", () => send(view, true));
  $("#submit-form").addEventListener("submit", (event) => { event.preventDefault(); send(view, false); });
  gutter();
  const from = new URLSearchParams(location.search).get("from");
  if (from) loadJob(view, from);
}

// Templates (the examples the server ships) and "start from job X" fill the form.
function wireSources(view) {
  const $ = (sel) => view.querySelector(sel);
  const templates = new Map();
  api("/v1/templates").then((body) => {
    for (const t of body.data || []) templates.set(t.name, t);
    $("#template").insertAdjacentHTML("beforeend", [...templates.values()].map((t) =>
      `<option value="${esc(t.name)}" title="${esc(t.title)}">${esc(t.name)}</option>`).join(""));
  }).catch(() => { /* no templates: the select stays with its prompt */ });
  $("#template").addEventListener("change", (event) => {
    const chosen = templates.get(event.target.value);
    if (!chosen) return;
    view.setRecipe(chosen.recipe_yaml);
    $("#job-name").value = chosen.name.split("/").pop().replace(/\.ya?ml$/, "");
  });
  $("#load-job").addEventListener("click", () => {
    const id = $("#from-job").value.trim();
    if (id) loadJob(view, id);
  });
}

async function loadJob(view, jobId) {
  const $ = (sel) => view.querySelector(sel);
  let request;
  try {
    request = await api(`/v1/jobs/${encodeURIComponent(jobId)}/request`);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    flash(`Cannot start from job ${jobId}: ${err.message}`);
    return;
  }
  view.setRecipe(request.recipe_yaml ?? recipeToYaml(request.recipe || {}));
  $("#job-name").value = `${request.name || "job"}-copy`;
  $("#from-job").value = jobId;
  $("#overrides").value = (request.overrides || []).join("\n");
  const res = request.resources || {};
  $("#nnodes").value = res.nnodes ?? 1;
  $("#nproc").value = res.nproc_per_node ?? 1;
  $("#accelerator").value = res.accelerator ?? "cpu";
  setTitle(`Submit: copy of ${request.name || jobId}`);
  flash(`Loaded the recipe of ${request.name || jobId}: edit it, then validate or submit.`, "info");
}

// A number field as typed: an empty field is left to the server's default, and 0 is sent
// as 0 (the server answers with the field and its fix, never a silent 1).
function numberField(input) {
  const text = input.value.trim();
  return text === "" ? undefined : Number(text);
}

function requestBody(view) {
  const $ = (sel) => view.querySelector(sel);
  const text = $("#recipe").value;
  const resources = { nnodes: numberField($("#nnodes")), nproc_per_node: numberField($("#nproc")),
    accelerator: $("#accelerator").value };
  const body = {
    name: $("#job-name").value.trim() || "dashboard-job",
    overrides: $("#overrides").value.split("\n").map((s) => s.trim()).filter(Boolean),
    resources: Object.fromEntries(Object.entries(resources).filter(([, v]) => v !== undefined)),
  };
  if (text.trim().startsWith("{")) {
    try { body.recipe = JSON.parse(text); return body; } catch { /* let the server say where */ }
  }
  body.recipe_yaml = text;
  return body;
}

async function send(view, validateOnly) {
  const result = view.querySelector("#result");
  const preview = view.querySelector("#plan-preview");
  view.repaint(); // a value set by a script (a test, an extension) is drawn too
  showErrors(view, []);
  preview.hidden = true;
  result.textContent = validateOnly ? "Validating…" : "Submitting…";
  try {
    const answer = await api(validateOnly ? "/v1/jobs:validate" : "/v1/jobs", { method: "POST", body: requestBody(view) });
    if (validateOnly && answer.valid === false) {
      throw new ApiError(422, answer);
    } else if (validateOnly) {
      const plan = answer.plan || {};
      result.innerHTML = `<span class="valid">Valid.</span> ${esc(summary(plan))}`;
      result.dataset.valid = "true";
      preview.innerHTML = planHtml(answer);
      preview.hidden = false;
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

// Errors in reading order: the form's fields first, then the recipe's by line (those
// without a line last); each with "apply fix" when its fix sets one value.
function showErrors(view, errors) {
  view.querySelectorAll(".inline-error").forEach((n) => n.remove());
  const text = view.querySelector("#recipe").value;
  const placed = errors.map((e, order) => {
    const loc = locText(e.loc).replace(/^(recipe_yaml|recipe)\./, "");
    const input = view.querySelector(`[data-loc="${CSS.escape(loc)}"]`) ||
      (loc.startsWith("overrides") ? view.querySelector("#overrides") : null);
    const line = input ? null : lineOfLoc(text, loc);
    const rank = input ? -1 : (line ?? Number.MAX_SAFE_INTEGER);
    return { e, loc, input, line, rank, order };
  }).sort((a, b) => a.rank - b.rank || a.order - b.order);
  const lines = [];
  view.querySelector("#errors").innerHTML = placed.map(({ e, loc, input, line }, index) => {
    if (input) {
      const note = document.createElement("span");
      note.className = "inline-error field-error";
      note.dataset.loc = loc;
      note.textContent = e.msg;
      input.insertAdjacentElement("afterend", note);
    }
    if (line) lines.push({ line, msg: e.msg });
    const where = line ? ` <a href="#" data-line="${line}">line ${line}</a>` : "";
    const fix = fixValue(e.fix);
    const apply = fix ? ` <button type="button" class="small" data-fix="${index}">Apply fix</button>` : "";
    return `<li class="field-error" data-loc="${esc(loc)}"><code>${esc(loc || "recipe")}</code>${where}: ${esc(e.msg)}
      ${e.fix ? `<div class="muted">fix: ${esc(e.fix)}${apply}</div>` : ""}</li>`;
  }).join("");
  renderGutter(view.querySelector("#gutter"), text, lines);
  placeLineNotes(view, lines);
  view.querySelectorAll("[data-line]").forEach((a) => a.addEventListener("click", (event) => {
    event.preventDefault();
    selectLine(view, +a.dataset.line);
  }));
  view.querySelectorAll("[data-fix]").forEach((button) => button.addEventListener("click", () => {
    applyFix(view, fixValue(placed[+button.dataset.fix].e.fix));
  }));
}

// Sets the fix's value on the recipe line that defines it (keeping the line's indentation
// and comment), or adds it as an override when the recipe writes it inline; validates again.
function applyFix(view, { path, value }) {
  const text = view.querySelector("#recipe").value;
  const line = lineOfLoc(text, path);
  const lines = text.split("\n");
  const key = path.split(".").pop();
  const own = line ? lines[line - 1].match(new RegExp(`^(\\s*(?:-\\s+)?["']?${key}["']?\\s*:)\\s*([^#]*?)(\\s+#.*)?$`)) : null;
  if (own) {
    lines[line - 1] = `${own[1]} ${value}${own[3] || ""}`;
    view.setRecipe(lines.join("\n"));
  } else {
    const overrides = view.querySelector("#overrides");
    const kept = overrides.value.split("\n").filter((l) => l.trim() && !l.trim().startsWith(`${path}=`));
    overrides.value = [...kept, `${path}=${value}`].join("\n");
  }
  flash(`Applied the fix: ${path}: ${value}`, "info");
  send(view, true);
}

// Each recipe error also sits beside its line in the editor, and follows it on scroll.
function placeLineNotes(view, lines) {
  const editor = view.querySelector(".editor");
  const box = view.querySelector("#recipe"); // the editor's text box
  editor.querySelectorAll(".line-note").forEach((n) => n.remove());
  const style = getComputedStyle(box);
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
    const top = parseFloat(style.paddingTop) + (line - 1) * lineHeight - box.scrollTop;
    note.style.top = `${top}px`;
    note.hidden = top < 0 || top > box.clientHeight - lineHeight;
  });
  box.onscroll = () => { view.querySelector("#gutter").scrollTop = box.scrollTop; place(); };
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

function selectLine(view, line) {
  const lines = view.querySelector("#recipe").value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  view.selectRange(start, start + lines[line - 1].length);
}
