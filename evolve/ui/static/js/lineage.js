// The lineage tree as SVG (positions from the server: one row per generation), and the panel of the chosen system.
import { h, append, s, api, pct } from "./dom.js";
import { systemPanel } from "./system.js";

const DY = 60, R = 8, PAD = 40;

// A node's state and its colour: a live run's newest system has no decision yet and must not look like the baseline.
function state(n) {
  if (n.operator === "init" || n.marks.includes("baseline")) return "baseline";
  return n.accepted === true ? "accepted" : n.accepted === false ? "rejected" : "undecided";
}
const COLOURS = { baseline: "#4dabf7", accepted: "#51cf66", rejected: "#ced4da", undecided: "#ffe066" };

export async function lineageView(ctx, rid, run) {
  const q = ctx.route.query;
  const expand = (q.get("expand") || "").split(",").filter(Boolean);
  const mode = q.get("view") || "auto";
  const url = `/api/runs/${encodeURIComponent(rid)}/lineage?view=${mode}&expand=${encodeURIComponent(expand.join(","))}`;
  const pic = await api(url);
  const chosen = q.get("sys") || (run.best && run.best.id) || (pic.nodes[0] && pic.nodes[0].id);
  const go = (changes) => {
    const p = new URLSearchParams(q);
    for (const [k, v] of Object.entries(changes)) { if (v === null) p.delete(k); else p.set(k, v); }
    location.hash = `#/run/${encodeURIComponent(rid)}/lineage?${p}`;
  };
  const note = pic.view === "whole" ? `all ${pic.total} systems`
    : pic.view === "collapsed" ? `${pic.shown} of ${pic.total} systems: the accepted and marked ones with their ancestors; +k opens a system's other children`
      : `${pic.shown} of ${pic.total} systems: the lineages of the baseline, the best and the current system; +k opens a system's other children`;
  const bar = h("div", { class: "toolbar" }, h("span", { class: "muted", id: "lineage-note" }, note),
    pic.view === "lineage" ? h("button", { id: "lineage-toolbar-accepted", onclick: () => go({ view: "accepted" }) }, `draw the ${pic.kept} accepted`) : null,
    pic.view !== "whole" && pic.total <= 5000 ? h("button", { onclick: () => go({ view: "all" }) }, "draw all") : null,
    mode !== "auto" ? h("button", { onclick: () => go({ view: null }) }, "collapse") : null,
    expand.length ? h("button", { onclick: () => go({ expand: null }) }, "fold opened") : null,
    h("span", { class: "muted" }, "● accepted (green)  ○ rejected (grey)  ◉ baseline (blue)  ● no decision yet (yellow)  ring: current  ★ best"));
  const svg = drawTree(pic, chosen, (id) => go({ sys: id }), (id) => go({ expand: [...expand, id].join(",") }));
  const left = h("div", { class: "pane", id: "lineage-pane", dataset: { keep: "lineage" } }, svg);
  if (!ctx.again) { // a new view (not a live redraw, which keeps the scroll): bring the chosen system into sight
    ctx.onMount(() => {
      const node = svg.querySelector("g.node.sel circle");
      if (!node) return;
      const box = node.getBoundingClientRect(), pane = left.getBoundingClientRect();
      left.scrollLeft += box.left - pane.left - pane.width / 2;
      left.scrollTop += box.top - pane.top - pane.height / 2;
    });
  }
  const right = h("div", { class: "pane", id: "system-panel", dataset: { keep: "panel" } });
  if (chosen) {
    try {
      append(right, await systemPanel(ctx, rid, chosen));
    } catch (e) {
      append(right, h("p", { class: "error" }, String(e.message || e)));
    }
  }
  return h("div", null, bar, h("div", { class: "split" }, left, right));
}

function drawTree(pic, chosen, pick, open) {
  const label = pic.nodes.length <= 150; // a score beside each node, when there is room for it
  const DX = label ? 46 : 24;
  const xs = pic.nodes.map((n) => n.x), ys = pic.nodes.map((n) => n.y);
  const maxX = Math.max(0, ...xs), maxY = Math.max(0, ...ys);
  const W = PAD * 2 + maxX * DX + 60, H = PAD * 2 + maxY * DY;
  const at = {};
  for (const n of pic.nodes) at[n.id] = [PAD + n.x * DX, PAD + n.y * DY];
  const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "lineage", dataset: { nodes: pic.nodes.length } });
  const rows = {}; // the generations each row holds (a row can hold a system whose parent is of its generation)
  for (const n of pic.nodes) (rows[n.y] = rows[n.y] || new Set()).add(n.generation);
  for (const [y, gens] of Object.entries(rows)) {
    svg.append(s("text", { x: 4, y: PAD + Number(y) * DY + 4, fill: "#adb5bd" }, [...gens].sort((a, b) => a - b).map((g) => `g${g}`).join(",")));
  }
  for (const [p, c, pos] of pic.edges) {
    const [x1, y1] = at[p], [x2, y2] = at[c];
    const my = (y1 + y2) / 2;
    svg.append(s("path", { d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`, fill: "none",
      stroke: pos ? "#9775fa" : "#868e96", "stroke-width": 1.2, "stroke-dasharray": pos ? "4 3" : null }));
  }
  for (const n of pic.nodes) {
    const [x, y] = at[n.id];
    const g = s("g", { class: `node${n.id === chosen ? " sel" : ""}`, dataset: { id: n.id, state: state(n) },
      onclick: (e) => { e.stopPropagation(); pick(n.id); } });
    g.append(s("title", null, `${n.id}\n${n.operator} (generation ${n.generation})\nval ${n.val === null ? "–" : pct(n.val)}` +
      `${n.why ? `\n${n.why}` : ""}${n.deploy ? `\ndeploy: ${n.deploy}` : ""}${n.marks.length ? `\n${n.marks.join(", ")}` : ""}`));
    if (n.marks.includes("current")) g.append(s("circle", { cx: x, cy: y, r: R + 4, fill: "none", stroke: "#212529", "stroke-width": 2 }));
    g.append(s("circle", { cx: x, cy: y, r: R, fill: COLOURS[state(n)] }));
    if (n.marks.includes("best")) g.append(s("text", { x: x - 5, y: y - R - 4, fill: "#f08c00" }, "★"));
    if (label && n.val !== null) g.append(s("text", { x: x + R + 3, y: y + 4, fill: "#495057" }, pct(n.val, 0)));
    if (n.deploy) g.append(s("text", { x: x - R, y: y + R + 12, fill: "#1864ab" }, n.deploy));
    svg.append(g);
    if (n.hidden) {
      const more = s("g", { class: "more", dataset: { expand: n.id }, onclick: (e) => { e.stopPropagation(); open(n.id); } },
        s("title", null, `open its ${n.hidden} other children`),
        s("rect", { x: x - 12, y: y + R + (n.deploy ? 16 : 3), width: 26, height: 13, rx: 6, fill: "#e7f5ff", stroke: "#74c0fc" }),
        s("text", { x: x - 9, y: y + R + (n.deploy ? 26 : 13), fill: "#1864ab" }, `+${n.hidden}`));
      svg.append(more);
    }
  }
  return svg;
}

