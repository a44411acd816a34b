// Two systems side by side, from one run or two: their scores, the diff, and task by task which does better.
import { h, api, table, short, score, pct } from "./dom.js";
import { diffTable } from "./system.js";

export async function compareView(ctx) {
  const q = ctx.route.query;
  const a = q.get("a"), b = q.get("b");
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: "compare" }]);
  const form = h("form", { class: "toolbar", onsubmit: (e) => {
    e.preventDefault();
    location.hash = `#/compare?a=${encodeURIComponent(e.target.a.value)}&b=${encodeURIComponent(e.target.b.value)}`;
  } }, "A ", h("input", { name: "a", value: a || "", placeholder: "RUN:SYSTEM", size: 30 }),
  " B ", h("input", { name: "b", value: b || "", placeholder: "RUN:SYSTEM (best, current, baseline or an id prefix)", size: 30 }),
  h("button", { type: "submit" }, "compare"));
  if (!a || !b) return h("div", null, h("h1", null, "Compare two systems"), form);
  const c = await api(`/api/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
  const side = (x) => h("div", { class: "pane" }, h("h2", { class: "mono" }, `${x.run}: ${short(x.id)}`),
    table(["split", "score"], Object.entries(x.scores).filter(([, v]) => v).map(([k, v]) => ({ cells: [k, score(v)] }))),
    h("h3", null, "prompts"), Object.entries(x.system.prompts || {}).map(([k, v]) => h("div", null, h("b", null, k), h("pre", null, v))));
  const tasks = Object.entries(c.tasks).filter(([, v]) => v.n).map(([split, v]) => ({
    cells: [split, v.n, pct(v.a), pct(v.b), `${(100 * v.diff).toFixed(1)} pts${v.ci95 === null ? "" : ` ±${(100 * v.ci95).toFixed(1)}`}`,
      v.n_fixed, v.n_broke, v.p.toPrecision(2)],
  }));
  return h("div", { id: "compare" }, h("h1", null, "Compare two systems"), form,
    h("div", { class: "two" }, side(c.a), side(c.b)),
    h("h2", null, "Task by task (B against A)"),
    tasks.length ? table(["split", "tasks in common", "A", "B", "B − A", "B better on", "B worse on", "sign test p"], tasks)
      : h("p", { class: "muted" }, "no tasks scored by both"),
    h("h2", null, "Diff (A → B)"), diffTable(c.diff, ["A", "B"]));
}
