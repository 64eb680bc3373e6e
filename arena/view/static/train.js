// parley view: the training dashboard. Rows of metrics.jsonl arrive as server-sent events
// (or, in an exported page, as embedded JSON data); every numeric key gets a chart, keys
// "name/role" share one chart with a line per role, stages are marked by vertical lines.
// Text is only ever set through textContent: nothing from the run is parsed as HTML.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const SKIP = new Set(["update", "stage_update", "attempt", "wall_s", "stale_hist"]);
  // Per-role charts first, then the watched metric and the sampler's figures, then the rest.
  const FIRST = ["success", "score", "reward_mean", "samples", "episodes", "stale_mean",
                 "stale_max", "dropped_stale", "failed", "loss"];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];
  const root = document.getElementById("dashboard");
  const statusEl = document.getElementById("status");
  const chartsEl = document.getElementById("charts");
  const stagesEl = document.getElementById("stages");
  const rows = [];
  let summary = null;
  let scheduled = false;

  function el(tag, attrs, text) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function groups() {
    const out = new Map();
    for (const row of rows) {
      for (const [key, value] of Object.entries(row)) {
        if (SKIP.has(key) || typeof value !== "number" || !isFinite(value)) continue;
        const cut = key.indexOf("/");
        const name = cut > 0 ? key.slice(0, cut) : key;
        const series = cut > 0 ? key.slice(cut + 1) : key;
        if (!out.has(name)) out.set(name, new Map());
        if (!out.get(name).has(series)) out.get(name).set(series, []);
        out.get(name).get(series).push([row.update, value]);
      }
    }
    const names = [...out.keys()].sort((a, b) => {
      const score = (n) => (out.get(n).size > 1 ? -1 : FIRST.includes(n) ? FIRST.indexOf(n) : 99);
      return score(a) - score(b) || a.localeCompare(b);
    });
    return names.map((n) => [n, out.get(n)]);
  }

  function chart(name, series) {
    const W = 360, H = 170, L = 54, R = 8, T = 8, B = 24;
    let xs = [], ys = [];
    for (const pts of series.values()) for (const [x, y] of pts) { xs.push(x); ys.push(y); }
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const box = el("div", { class: "chart", "data-name": name });
    box.appendChild(el("h4", {}, name));
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H });
    svg.appendChild(el("svg:line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    svg.appendChild(el("svg:line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    svg.appendChild(el("svg:text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmt(y1)));
    svg.appendChild(el("svg:text", { x: L - 4, y: H - B, "text-anchor": "end" }, fmt(y0)));
    svg.appendChild(el("svg:text", { x: W - R, y: H - 6, "text-anchor": "end" }, `update ${x1}`));
    let prev = null;
    for (const row of rows) {  // stage boundaries
      if (prev !== null && row.stage !== prev) {
        const x = sx(row.update - 0.5);
        svg.appendChild(el("svg:line", { x1: x, y1: T, x2: x, y2: H - B, class: "stage" }));
        svg.appendChild(el("svg:text", { x: x + 2, y: T + 8, class: "stage" }, row.stage));
      }
      prev = row.stage;
    }
    let i = 0;
    const legend = el("div", { class: "legend" });
    for (const [label, pts] of series) {
      const color = COLORS[i++ % COLORS.length];
      const d = pts.map(([x, y], j) => `${j ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`);
      svg.appendChild(el("svg:path", { d: d.join(""), stroke: color, fill: "none", class: "line" }));
      if (pts.length === 1) {
        svg.appendChild(el("svg:circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 2.5, fill: color }));
      }
      const last = pts[pts.length - 1][1];
      const item = el("span", { style: `color:${color}` }, `${label}: ${fmt(last)}  `);
      legend.appendChild(item);
    }
    box.appendChild(svg);
    box.appendChild(legend);
    return box;
  }

  function fmt(v) {
    if (typeof v !== "number") return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : String(+v.toFixed(4));
  }

  function render() {
    scheduled = false;
    const last = rows[rows.length - 1];
    const state = summary ? "finished" : "running";
    statusEl.textContent = last
      ? `${rows.length} updates · stage ${last.stage} · ${last.episodes} episodes · ` +
        `${last.wall_s} s · ${state}`
      : `no metrics yet · ${state}`;
    statusEl.setAttribute("data-updates", String(rows.length));
    chartsEl.replaceChildren(...groups().map(([n, s]) => chart(n, s)));
    if (summary && Array.isArray(summary.stages)) {
      const table = el("table", { id: "stage-table" });
      const head = el("tr");
      for (const h of ["stage", "kind", "updates", "episodes", "first", "last", "failed", "wall s"]) {
        head.appendChild(el("th", {}, h));
      }
      table.appendChild(head);
      for (const s of summary.stages) {
        const tr = el("tr");
        for (const v of [s.stage, s.kind, s.updates, s.episodes, s.first, s.last,
                         s.failed_episodes, s.wall_s]) {
          tr.appendChild(el("td", {}, v === null || v === undefined ? "–" : fmt(v)));
        }
        table.appendChild(tr);
      }
      stagesEl.replaceChildren(el("h3", {}, "stages"), table);
    }
  }

  function later() {
    if (!scheduled) { scheduled = true; requestAnimationFrame(render); }
  }

  const embedded = document.getElementById("train-data");
  if (embedded) {
    const data = JSON.parse(embedded.textContent);
    rows.push(...data.rows);
    summary = data.summary && data.summary.stages ? data.summary : null;
    render();
  } else if (root.dataset.events) {
    const source = new EventSource(root.dataset.events);
    source.onmessage = (e) => { rows.push(JSON.parse(e.data)); later(); };
    source.addEventListener("summary", (e) => { summary = JSON.parse(e.data); later(); });
    render();
  }
})();
