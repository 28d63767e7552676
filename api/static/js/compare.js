// Compare (/compare?ids=a,b): the loss curves of several jobs on one chart.

import { api, itemsOf } from "./api.js";
import { LineChart, PALETTE } from "./chart.js";
import { esc, every, stateBadge } from "./util.js";

const MAX_POINTS = 600;

export function renderCompare(view) {
  const ids = new Set((new URLSearchParams(location.search).get("ids") || "").split(",").filter(Boolean));
  view.innerHTML = `
    <div class="panel"><div class="row"><h1>Compare loss curves</h1><span class="spacer"></span>
      <label><input type="checkbox" id="show-val" checked> validation loss</label></div>
      <div id="compare-chart"></div></div>
    <div class="panel"><h2>Jobs</h2><table id="compare-jobs"><thead><tr><th></th><th>Name</th>
      <th>State</th><th>Created</th></tr></thead><tbody></tbody></table></div>`;
  const chart = new LineChart(view.querySelector("#compare-chart"), { emptyText: "Pick jobs below" });
  const cache = new Map(); // id -> {train, val, final}
  let jobs = [];

  const draw = () => {
    const showVal = view.querySelector("#show-val").checked;
    const out = [];
    [...ids].forEach((id, i) => {
      const data = cache.get(id);
      if (!data) return;
      const name = jobs.find((j) => j.id === id)?.name || id.slice(0, 8);
      const color = PALETTE[i % PALETTE.length];
      out.push({ label: name, color, points: data.train.map((r) => ({ x: r.step, y: r.loss })) });
      if (showVal && data.val.length) out.push({ label: `${name} (val)`, color, dashed: true, dots: true,
        points: data.val.map((r) => ({ x: r.step, y: r.val_loss })) });
    });
    chart.update(out);
  };
  const load = async (id) => {
    const job = jobs.find((j) => j.id === id);
    if (cache.get(id)?.final) return;
    const [train, val] = await Promise.all(["train", "val"].map((kind) =>
      api(`/v1/jobs/${id}/metrics`, { query: { kind, max_points: MAX_POINTS } }).then(itemsOf)));
    cache.set(id, { train, val, final: job ? job.terminal : false });
  };
  const refresh = async () => {
    jobs = itemsOf(await api("/v1/jobs", { query: { limit: 100 } }));
    for (const id of ids) if (!jobs.some((j) => j.id === id)) jobs.push(await api(`/v1/jobs/${id}`));
    view.querySelector("tbody").innerHTML = jobs.map((j) => `<tr>
      <td><input type="checkbox" data-id="${esc(j.id)}" ${ids.has(j.id) ? "checked" : ""} aria-label="compare"></td>
      <td><a href="/jobs/${esc(j.id)}" data-link>${esc(j.name || j.id)}</a></td>
      <td>${stateBadge(j.status)}</td><td>${esc(new Date(j.created_at).toLocaleString())}</td></tr>`).join("");
    await Promise.all([...ids].map(load));
    draw();
  };
  view.querySelector("tbody").addEventListener("change", async (event) => {
    const id = event.target.dataset.id;
    if (!id) return;
    if (event.target.checked) ids.add(id); else ids.delete(id);
    history.replaceState({}, "", `/compare?ids=${[...ids].join(",")}`);
    await Promise.all([...ids].map(load));
    draw();
  });
  view.querySelector("#show-val").addEventListener("change", draw);
  return every(5000, refresh);
}
