// A system's memory (items at its version, changes since its parent's), tool library (with the
// sandbox's verdicts) and workflow graph (drawn as SVG from the server's layout).
import { h, append, s, api, table, short, badge, json } from "./dom.js";

const enc = encodeURIComponent;

export async function memoryView(rid, sid) {
  const m = await api(`/api/runs/${enc(rid)}/systems/${enc(sid)}/memory`);
  if (!m.spec.store) return h("p", { class: "muted" }, "no memory");
  const out = h("div", { id: "memory" },
    h("p", null, `store ${m.spec.store}, version ${m.spec.version}`, m.active !== undefined ? `: ${m.active} active items` : ""));
  if (m.missing) return append(out, h("p", { class: "error" }, m.missing));
  if (m.versions.length) append(out, h("p", { class: "muted" }, "versions along its lineage: ",
    m.versions.map((v) => `v${v.version} (${v.systems.map(short).join(", ")})`).join(" → ")));
  if (m.changes.length) {
    append(out, h("h3", null, `Changes since its parent (v${m.since ?? 0} → v${m.spec.version})`),
      table(["event", "op", "item", "data"], m.changes.map((e) => ({ cells: [e.seq, e.op, h("span", { class: "mono" }, short(e.item)), h("pre", null, json(e.data))] }))));
  }
  append(out, h("h3", null, "Items"), table(["item", "kind", "status", "text", "strength", "uses", "links"], m.items.map((it) => ({
    cells: [h("span", { class: "mono" }, short(it.id)), it.kind, badge(it.status, it.status === "active" ? "ok" : "warn"), h("pre", null, it.text),
      it.strength, it.uses, Object.keys(it.links || {}).length ? h("pre", null, json(it.links)) : ""],
  }))));
  return out;
}


export async function toolsView(rid, sid) {
  const t = await api(`/api/runs/${enc(rid)}/systems/${enc(sid)}/tools`);
  const out = h("div", { id: "tools" });
  if (!t.tools.length) append(out, h("p", { class: "muted" }, "no tools in this system's library"));
  for (const tool of t.tools) {
    append(out, h("div", { class: "step tool" },
      h("b", { class: "mono" }, `${tool.name}(${(tool.params || []).join(", ")})`), " ", badge(tool.origin || "user", "info"),
      tool.uses !== undefined ? h("span", { class: "muted" }, ` used ${tool.uses}×, ${tool.successes} in successful rollouts`) : null,
      tool.doc ? h("p", null, tool.doc) : null,
      h("details", null, h("summary", null, `code and ${(tool.tests || []).length} tests`), h("pre", null, tool.code || ""),
        h("pre", null, json(tool.tests || []))),
      tool.provenance && Object.keys(tool.provenance).length ? h("p", { class: "muted" }, `provenance: ${JSON.stringify(tool.provenance)}`) : null));
  }
  if (t.verdicts.length) {
    append(out, h("h3", null, "Sandbox verdicts on the run's proposals"), table(["generation", "tool", "verdict", "passed", "reason"],
      t.verdicts.map((v) => ({ cells: [v.generation ?? "–", h("span", { class: "mono" }, v.signature || v.tool || "–"),
        badge(v.verdict, v.verdict === "admitted" ? "ok" : v.verdict === "rejected" ? "bad" : "warn"),
        v.total !== undefined ? `${v.passed}/${v.total}` : "–", v.reason || v.of || ""] }))));
  }
  return out;
}

export async function workflowView(rid, sid) {
  const w = await api(`/api/runs/${enc(rid)}/systems/${enc(sid)}/workflow`);
  const out = h("div", { id: "workflow" });
  if (Object.keys(w.settings).length) append(out, h("pre", null, json(w.settings)));
  if (!w.graph) return append(out, h("p", { class: "muted" }, "no workflow graph (the agent's own code is the workflow)"));
  append(out, h("p", { class: "muted" }, `graph ${short(w.graph.id)}: entry ${w.graph.entry}, returns ${w.graph.output}`), drawGraph(w.graph));
  return out;
}

export function drawGraph(g) {
  const SX = 70, SY = 55, PAD = 60, BW = 110, BH = 34;
  const xs = g.nodes.map((n) => n.x), ys = g.nodes.map((n) => -n.y);
  const minX = Math.min(...xs), minY = Math.min(...ys);
  const W = PAD * 2 + (Math.max(...xs) - minX) * SX + BW, H = PAD * 2 + (Math.max(...ys) - minY) * SY + BH;
  const at = {};
  for (const n of g.nodes) at[n.id] = [PAD + (n.x - minX) * SX + BW / 2, PAD + (-n.y - minY) * SY + BH / 2];
  const svg = s("svg", { width: W, height: H, class: "workflow", dataset: { nodes: g.nodes.length } },
    s("defs", null, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#495057" }))));
  const edge = (a, b, label, opts = {}) => {
    const [x1, y1] = at[a], [x2, y2] = at[b];
    const bend = opts.back ? 60 : 0;
    const top = Math.min(y1, y2) - BH / 2 - 45; // a loop goes back over the top, from the top of one box to the other's
    const d = a === b ? `M${x1 - 20},${y1 - BH / 2} C${x1 - 30},${y1 - 70} ${x1 + 30},${y1 - 70} ${x1 + 20},${y1 - BH / 2}`
      : opts.back ? `M${x1},${y1 - BH / 2} C${x1},${top} ${x2},${top} ${x2},${y2 - BH / 2}`
        : `M${x1 + BW / 2},${y1} C${(x1 + x2) / 2},${y1} ${(x1 + x2) / 2},${y2} ${x2 - BW / 2},${y2}`;
    svg.append(s("path", { d, fill: "none", stroke: opts.dashed ? "#868e96" : "#495057", "stroke-dasharray": opts.dashed ? "5 3" : null, "marker-end": "url(#arrow)" }));
    if (label) svg.append(s("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - bend / 2 - 4, fill: "#7a1f1f", "text-anchor": "middle" }, label));
  };
  for (const e of g.edges) if (at[e.src] && at[e.dst]) edge(e.src, e.dst, e.when, { back: e.back });
  for (const c of g.chains) if (at[c.vote] && at[c.node]) edge(c.vote, c.node, `x${c.samples}`, { dashed: true });
  for (const n of g.nodes) {
    const [x, y] = at[n.id];
    const fill = n.model === null ? "#d9d9d9" : n.model ? "#f6bd60" : "#a8dadc";
    svg.append(s("g", { class: "wf-node", dataset: { id: n.id } },
      s("title", null, `${n.id}: ${n.type}\n${JSON.stringify(n.params)}`),
      s("rect", { x: x - BW / 2, y: y - BH / 2, width: BW, height: BH, rx: 6, fill, stroke: "#212529", "stroke-width": n.entry ? 2.5 : 1 }),
      s("text", { x, y: y - 2, "text-anchor": "middle" }, n.id),
      s("text", { x, y: y + 11, "text-anchor": "middle", fill: "#495057" }, n.type + (n.max_visits ? ` (x${n.max_visits})` : ""))));
  }
  return svg;
}
