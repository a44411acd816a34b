// Two systems side by side, from one run or two: their scores, the diff, and task by task which does better.
import { h, append, api, table, short, score, gain, pct, num, secs } from "./dom.js";
import { diffTable } from "./system.js";
import { lineChart } from "./charts.js";

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
    cells: [split, v.n, pct(v.a), pct(v.b), gain(v), v.n_fixed, v.n_broke, v.p.toPrecision(2)],
  }));
  const unpaired = Object.entries(c.tasks).filter(([, v]) => v.why).map(([split, v]) => h("p", { class: "muted" }, `${split}: ${v.why}`));
  return h("div", { id: "compare" }, h("h1", null, "Compare two systems"), form,
    h("div", { class: "two" }, side(c.a), side(c.b)),
    h("h2", null, "Task by task (B against A)"),
    tasks.length ? table(["split", "tasks in common", "A", "B", "B − A", "B better on", "B worse on", "sign test p"], tasks)
      : h("p", { class: "muted" }, "no task in common: no interval, no test"), unpaired,
    h("h2", null, "Diff (A → B)"), diffTable(c.diff, ["A", "B"]));
}

// Two runs side by side: their budgets and scores, their curves on one chart, and their best systems compared.
export async function compareRunsView(ctx, ra, rb) {
  const [a, b] = await Promise.all([api(`/api/runs/${encodeURIComponent(ra)}/summary`), api(`/api/runs/${encodeURIComponent(rb)}/summary`)]);
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: `compare ${ra} and ${rb}` }]);
  const row = (label, f) => ({ cells: [label, f(a), f(b)] });
  const facts = table(["", ra, rb], [
    row("task", (r) => `${r.name}${r.world ? ` (${r.world})` : ""}${r.seed !== null && r.seed !== undefined ? `, seed ${r.seed}` : ""}`),
    row("status", (r) => r.status), row("generations", (r) => num(r.generation)), row("systems", (r) => String(r.systems)),
    row("rollouts", (r) => String(r.used.rollouts)), row("LLM calls", (r) => String(r.used.calls)),
    row("tokens", (r) => String(r.used.tokens)), row("seconds", (r) => secs(r.used.seconds)),
    row("baseline val", (r) => (r.baseline ? score(r.baseline.val) : "–")), row("best val", (r) => (r.best ? score(r.best.val) : "–")),
    row("best test", (r) => (r.best ? score(r.best.test) : "–")),
  ], { id: "compare-runs" });
  const curve = h("div", { class: "plot", id: "plot-compare" });
  const spent = h("div", { class: "plot", id: "plot-compare-calls" });
  ctx.onMount(() => {
    lineChart(curve, "best val per generation", null, [
      { name: ra, x: (a.generations || []).map((g) => g.index), y: (a.generations || []).map((g) => g.best_val) },
      { name: rb, x: (b.generations || []).map((g) => g.index), y: (b.generations || []).map((g) => g.best_val) }], { percent: true });
    lineChart(spent, "LLM calls per generation", null, [
      { name: ra, x: (a.generations || []).map((g) => g.index), y: (a.generations || []).map((g) => g.calls) },
      { name: rb, x: (b.generations || []).map((g) => g.index), y: (b.generations || []).map((g) => g.calls) }]);
  });
  const out = h("div", null, h("h1", null, `Compare runs ${ra} and ${rb}`), facts, h("div", { class: "two" }, curve, spent));
  if (a.best && b.best) {
    const c = await api(`/api/compare?a=${encodeURIComponent(`${ra}:best`)}&b=${encodeURIComponent(`${rb}:best`)}`);
    const tasks = Object.entries(c.tasks).filter(([, v]) => v.n);
    append(out, h("h2", null, `Their best systems (${short(c.a.id)} and ${short(c.b.id)})`),
      tasks.length ? table(["split", "tasks in common", ra, rb, `${rb} − ${ra}`, `${rb} better on`, `${rb} worse on`], tasks.map(([s, v]) => ({
        cells: [s, v.n, pct(v.a), pct(v.b), gain(v), v.n_fixed, v.n_broke],
      }))) : h("p", { class: "muted" }, "no task in common (other tasks, or the same ids with other content): no interval, no test"),
      Object.entries(c.tasks).filter(([, v]) => v.why).map(([s, v]) => h("p", { class: "muted" }, `${s}: ${v.why}`)),
      h("h3", null, "Diff"), diffTable(c.diff, [ra, rb]),
      h("p", null, h("a", { href: `#/compare?a=${encodeURIComponent(`${ra}:best`)}&b=${encodeURIComponent(`${rb}:best`)}` }, "the two systems in full")));
  }
  return out;
}
