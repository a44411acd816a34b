// A run's curriculum (engine.curriculum): per generation, each group's level and share of the training
// tasks, the move, and the success counts it was decided on, drawn beside the run's val curve.
import { h, table, pct } from "./dom.js";
import { lineChart } from "./charts.js";

// what decided a group's cell: the move and, once judged, solved/rollouts at the level it was at
function cell(r, g) {
  const s = (r.success || {})[g];
  const seen = s && s.n ? `; ${s.solved}/${s.n} solved at L${s.level}` : "";
  return h("span", { dataset: { group: g, level: String(r.levels[g]) } },
    h("b", null, `L${r.levels[g]}`), ` ${pct(r.mix[g], 0)} `, h("span", { class: "muted" }, `(${r.moves[g]}${seen})`));
}

// the curriculum's section of the overview: two charts (levels; shares) and the table of decisions
export function curriculumSection(ctx, cur) {
  const rows = cur.generations;
  const groups = Object.keys(rows[0].levels).sort();
  const x = rows.map((r) => r.generation);
  const [lo, hi] = rows[0].band || [0, 1];
  const levelDiv = h("div", { class: "plot", id: "plot-curriculum-levels" });
  const mixDiv = h("div", { class: "plot", id: "plot-curriculum-mix" });
  ctx.onMount(() => {
    lineChart(levelDiv, "each group's level (0 the easiest)", x, groups.map((g) => ({ name: g, y: rows.map((r) => r.levels[g]) })));
    lineChart(mixDiv, "each group's share of the training tasks", x, groups.map((g) => ({ name: g, y: rows.map((r) => r.mix[g]) })),
      { percent: true });
  });
  const evidence = (cur.settings || {}).evidence === "all" ? "the parents' minibatch rollouts and the operators' samples from them"
    : "the parents' minibatch rollouts";
  return h("div", { id: "curriculum" },
    h("h2", null, `Curriculum (kept in a success band of ${Math.round(100 * lo)}–${Math.round(100 * hi)}%)`),
    h("p", { class: "muted" }, `Each cell: the level and the share of the generation's training tasks, what moved it, and the success it was decided on (${evidence} at the level before).`),
    h("div", { class: "two" }, levelDiv, mixDiv),
    table([{ label: "gen", num: true }, ...groups, { label: "minibatch (fresh)", num: true }],
      rows.map((r) => ({ data: { generation: String(r.generation) },
        cells: [r.generation, ...groups.map((g) => cell(r, g)), `${r.minibatch} (${r.fresh ?? 0})`] })), { id: "curriculum-table" }));
}
