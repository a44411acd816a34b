// One run: overview (budget, scores, curves per generation), lineage (+ the system panel), tasks, deployment.
import { h, append, api, table, short, score, gain, num, secs, money, pct, ago, when, statusBadge, badge, card } from "./dom.js";
import { lineageView } from "./lineage.js";
import { lineChart, barChart } from "./charts.js";
import { curriculumSection } from "./curriculum.js";

const TABS = [["overview", "Overview"], ["lineage", "Lineage"], ["tasks", "Tasks"], ["deploy", "Deployment"]];

export async function runView(ctx, rid, tab) {
  const base = `#/run/${encodeURIComponent(rid)}`;
  const run = await api(`/api/runs/${encodeURIComponent(rid)}/summary`);
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: rid, href: base }, { label: tab }]);
  ctx.follow(`/api/runs/${encodeURIComponent(rid)}/version`, JSON.stringify(run.version));
  const head = h("div", null,
    h("h1", null, `${run.name}`, " ", statusBadge(run.status), " ", h("span", { class: "muted mono" }, run.dir)),
    h("div", { class: "tabs" }, TABS.map(([k, label]) =>
      h("a", { href: `${base}/${k}`, class: k === tab ? "active" : null, dataset: { tab: k } }, label))));
  let body;
  if (tab === "lineage") body = await lineageView(ctx, rid, run);
  else if (tab === "tasks") body = await tasksView(ctx, rid);
  else if (tab === "deploy") body = await deployView(ctx, rid);
  else body = overview(ctx, rid, run);
  return h("div", null, head, body);
}

function overview(ctx, rid, run) {
  const gens = run.generations || [];
  const g = run.paired && run.paired.test;
  const cards = h("div", { class: "cards" },
    card("generations", `${gens.length ? gens[gens.length - 1].index : 0}${run.budget.generations !== undefined ? ` / ${run.budget.generations}` : ""}`),
    card("systems", String(run.systems)),
    card("baseline val", run.baseline ? score(run.baseline.val) : "–"),
    card("best val", run.best ? score(run.best.val) : "–", run.best && run.best.id),
    card("best test", run.best ? score(run.best.test) : "–"),
    card("test gain", g && g.n ? gain(g) : "–",
      g && g.n ? `paired over ${g.n} tasks (95% interval); ${g.b_only} better, ${g.a_only} worse; sign test p=${g.p.toPrecision(2)}` : null),
    card("rollouts", `${num(run.used.rollouts)}${run.budget.rollouts ? ` / ${num(run.budget.rollouts)}` : ""}`),
    card("LLM calls", `${num(run.used.calls)}${run.budget.calls ? ` / ${num(run.budget.calls)}` : ""}`),
    card("tokens", `${num(run.used.tokens)}${run.budget.tokens ? ` / ${num(run.budget.tokens)}` : ""}`),
    card("money", `${money(run.used.cost)}${run.budget.usd ? ` / ${money(run.budget.usd)}` : ""}`),
    card("seconds", `${secs(run.used.seconds)}${run.budget.seconds ? ` / ${secs(run.budget.seconds)}` : ""}`));
  const x = gens.map((r) => r.index);
  const scoreDiv = h("div", { class: "plot", id: "plot-scores" });
  const costDiv = h("div", { class: "plot", id: "plot-cost" });
  const metrics = { calls: "LLM calls", tokens: "tokens", cost: "money ($)", seconds: "seconds", rollouts: "rollouts" };
  const pickCost = h("select", { id: "cost-metric", onchange: () => drawCost() },
    Object.entries(metrics).map(([k, label]) => h("option", { value: k }, label)));
  const drawCost = () => barChart(costDiv, `${metrics[pickCost.value]} per generation`, x,
    [{ name: metrics[pickCost.value], y: gens.map((r) => r[pickCost.value] ?? 0) }]);
  ctx.onMount(() => {
    lineChart(scoreDiv, "val score per generation", x, [
      { name: "best val", y: gens.map((r) => r.best_val) },
      { name: "median val of its children", y: gens.map((r) => r.median_val), dash: "dot" }], { percent: true });
    drawCost();
  });
  const rows = gens.map((r) => ({
    cells: [r.index, pct(r.best_val), h("a", { href: `#/run/${encodeURIComponent(rid)}/lineage?sys=${r.best}`, class: "mono" }, short(r.best)),
      r.median_val === null ? "–" : pct(r.median_val), r.children, r.accepted, num(r.rollouts), num(r.calls), num(r.tokens),
      money(r.cost), num(r.seconds, 1)],
  }));
  return h("div", null, cards,
    h("div", { class: "two" }, scoreDiv, h("div", null, h("div", { class: "toolbar" }, "spent: ", pickCost), costDiv)),
    run.curriculum ? curriculumSection(ctx, run.curriculum) : null,
    h("h2", null, "Generations"),
    table([{ label: "gen", num: true }, "best val", "best", "median val (children)", { label: "children", num: true },
      { label: "accepted", num: true }, { label: "rollouts", num: true }, { label: "calls", num: true },
      { label: "tokens", num: true }, { label: "money", num: true }, { label: "seconds", num: true }], rows, { id: "generations" }),
    run.stop_reason ? h("p", { class: "muted" }, `stopped: ${run.stop_reason}`) : null,
    run.operators.length ? h("p", { class: "muted" }, `operators: ${run.operators.join(", ")}`) : null);
}

async function tasksView(ctx, rid) {
  const split = ctx.route.query.get("split") || "val";
  const m = await api(`/api/runs/${encodeURIComponent(rid)}/matrix?split=${encodeURIComponent(split)}`);
  const pick = h("select", { onchange: (e) => { location.hash = `#/run/${encodeURIComponent(rid)}/tasks?split=${e.target.value}`; } },
    (m.splits || ["val", "test", "train"]).map((s) => h("option", { value: s, selected: s === split }, s)));
  const out = h("div", null, h("div", { class: "toolbar" }, "split ", pick,
    h("span", { class: "muted" }, "each accepted system against its parent: the tasks it does better on (fixed) and worse on (broke)")));
  append(out, table(["system", "generation", "operator", "parent", { label: "tasks", num: true }, { label: "mean", num: true },
    { label: "fixed", num: true }, { label: "broke", num: true }, { label: "both solve", num: true }, { label: "neither", num: true },
    { label: "tied between", num: true, title: "the same partial score (between 0 and 1) for both" }],
  m.rows.map((r) => ({
    onclick: () => { location.hash = `#/run/${encodeURIComponent(rid)}/lineage?sys=${r.id}`; },
    data: { system: r.id, fixed: r.fixed ?? "", broke: r.broke ?? "" },
    cells: [h("span", { class: "mono" }, short(r.id)), r.generation, r.operator, h("span", { class: "mono" }, short(r.parent)),
      r.tasks, pct(r.mean), r.fixed ?? "–", r.broke ?? "–", r.both ?? "–", r.neither ?? "–", r.tied ?? "–"],
  })), { id: "matrix" }));
  if (m.grid) {
    append(out, h("h2", null, `Per task (${m.grid.tasks.length} ${split} tasks; green solved, red missed, grey not scored)`));
    const grid = h("div", { class: "pane", dataset: { keep: "grid" } });
    m.grid.scores.forEach((row, i) => {
      const line = h("div", { style: { whiteSpace: "nowrap" } }, h("span", { class: "mono", style: { display: "inline-block", width: "80px" } }, short(m.rows[i].id)));
      row.forEach((v, j) => {
        const col = v === null ? "#dee2e6" : `hsl(${Math.round(120 * Math.min(1, Math.max(0, v)))}, 60%, 45%)`;
        append(line, h("span", { class: "grid-cell", title: `${m.grid.tasks[j]}: ${v === null ? "not scored" : v.toFixed(2)}`, style: { background: col } }));
      });
      append(grid, line);
    });
    append(out, grid);
  }
  return out;
}

async function deployView(ctx, rid) {
  const d = await api(`/api/runs/${encodeURIComponent(rid)}/deploy`);
  const out = h("div", null, h("div", { class: "cards" }, card("active", h("span", { class: "mono" }, short(d.active))),
    card("canary", d.canary ? `${short(d.canary.system)} (${pct(d.canary.share, 0)} of sessions)` : "none"),
    card("blocked", String(d.blocked.length))));
  if (d.canary_test) {
    const t = d.canary_test;
    append(out, h("h2", null, "Canary test"), h("pre", null, JSON.stringify(t, null, 2)));
  }
  const states = Object.entries(d.states);
  append(out, h("h2", null, "Lifecycle"));
  append(out, states.length ? table(["system", "state"], states.map(([sid, st]) => ({
    onclick: () => { location.hash = `#/run/${encodeURIComponent(rid)}/lineage?sys=${sid}`; },
    cells: [h("span", { class: "mono" }, short(sid)), badge(st, { active: "ok", rejected: "bad", rolled_back: "bad", canary: "info", pending: "warn" }[st])],
  })), { id: "deploy-states" }) : h("p", { class: "muted" }, "no deployment yet"));
  append(out, h("h2", null, "Audit trail"));
  append(out, d.trail.length ? table(["when", "system", "from", "to", "by", "why", "evidence"], d.trail.map((e) => ({
    cells: [when(e.created_at), h("span", { class: "mono" }, short(e.system)), e.from ?? "–", e.to, e.by, e.why,
      e.evidence && Object.keys(e.evidence).length ? h("details", null, h("summary", null, "numbers"), h("pre", null, JSON.stringify(e.evidence, null, 2))) : ""],
  })), { id: "trail" }) : h("p", { class: "muted" }, "no deploy events (a run without a deploy: section promotes directly)"));
  append(out, h("h2", null, "Current pointer"));
  append(out, table(["when", "system", "reason"], d.pointer.map((p) => ({ cells: [when(p.at), h("span", { class: "mono" }, short(p.system)), p.reason] }))));
  return out;
}
