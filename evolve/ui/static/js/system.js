// One system: what it is, its diff to its parent, the decision with its evidence, scores, training
// curve, its layers (memory, tools, workflow) and the rollouts behind it.
import { h, append, api, table, short, score, gain, pct, num, when, badge, json } from "./dom.js";
import { lineChart } from "./charts.js";
import { memoryView, toolsView, workflowView } from "./layers.js";

const enc = encodeURIComponent;

export async function systemPage(ctx, rid, sid) {
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: rid, href: `#/run/${enc(rid)}` }, { label: `system ${short(sid)}` }]);
  ctx.follow(`/api/runs/${enc(rid)}/version`);
  return h("div", { class: "pane", id: "system-panel" }, await systemPanel(ctx, rid, sid));
}

export function diffTable(diff, labels = ["parent", "this system"]) {
  if (!diff.length) return h("p", { class: "muted" }, "no differences");
  return h("table", { class: "diff" }, h("thead", null, h("tr", null, h("th", null, "component"), h("th", null, labels[0]), h("th", null, labels[1]))),
    h("tbody", null, diff.map((d) => h("tr", { dataset: { path: d.path } },
      h("td", { class: "path" }, d.path),
      d.lines ? h("td", { colspan: 2 }, h("pre", null, d.lines.map((l) =>
        h("span", { class: l.startsWith("+") ? "line-add" : l.startsWith("-") ? "line-del" : null }, l + "\n"))))
        : [h("td", { class: "before" }, h("pre", null, shown(d.before))), h("td", { class: "after" }, h("pre", null, shown(d.after)))]))));
}

function shown(v) {
  return v === null ? "(none)" : v === "" ? "(empty)" : json(v);
}

function versus(v, what) {
  if (!v || !v.n) return h("p", { class: "muted" }, `not scored on ${what} against its parent`);
  const taskList = (ids, n) => (n ? h("details", null, h("summary", null, `${n} tasks`), h("p", { class: "mono" }, ids.join(", "), n > ids.length ? ` … (${n - ids.length} more)` : "")) : "0");
  const same = `${v.both} both solve, ${v.neither} neither${v.tied ? `, ${v.tied} tied between` : ""}`;
  return table(["on", "parent", "this", "difference (95% CI, sign test)", "fixed", "broke", "same"], [{
    cells: [`${what} (${v.n} tasks)`, pct(v.a), pct(v.b),
      `${gain(v)}, p=${v.p.toPrecision(2)}`,
      taskList(v.fixed, v.n_fixed), taskList(v.broke, v.n_broke), same],
  }], { class: "versus" });
}

function curveChart(ctx, curve) {
  if (!Array.isArray(curve) || !curve.length) return null;
  const keys = ["reward", "loss", "kl", "dev", "groups_kept", "tokens_per_s"].filter((k) => curve.some((r) => typeof r[k] === "number"));
  const div = h("div", { class: "plot", id: "plot-training" });
  ctx.onMount(() => lineChart(div, "training curve (the operator's record)", curve.map((r) => r.step),
    keys.map((k) => ({ name: k, y: curve.map((r) => (typeof r[k] === "number" ? r[k] : null)) })), { x: "step", dtick: null }));
  return div;
}

export async function systemPanel(ctx, rid, sid) {
  const d = await api(`/api/runs/${enc(rid)}/systems/${enc(sid)}`);
  const status = d.decision ? (d.decision.accepted ? badge("accepted", "ok") : badge("rejected", "bad")) : badge(d.parents.length ? "not judged" : "starting system", "info");
  const parent = d.parents[0];
  const out = h("div", { dataset: { system: d.id } },
    h("h2", null, h("span", { class: "mono" }, short(d.id)), " ", status, " ", d.marks.map((m) => badge(m, "info")),
      d.deploy ? badge(`deploy: ${d.deploy}`, "warn") : null),
    h("div", { class: "muted mono" }, d.id),
    h("p", null, `${d.operator}, generation ${d.generation}, ${when(d.created_at)}`,
      parent ? [" · parent ", h("a", { href: `#/run/${enc(rid)}/lineage?sys=${parent}`, class: "mono" }, short(parent)),
        " · ", h("a", { href: `#/compare?a=${enc(`${rid}:${parent}`)}&b=${enc(`${rid}:${d.id}`)}` }, "compare side by side")] : null,
      d.children.length ? ` · ${d.children.length} children` : null),
    d.rationale ? h("p", null, h("i", null, d.rationale)) : null);
  append(out, h("h3", null, "Scores"), table(["split", "mean [95% interval] (n)"],
    Object.entries(d.scores).filter(([, v]) => v).map(([k, v]) => ({ cells: [k, score(v)] })), { class: "scores" }));
  if (d.decision) {
    append(out, h("h3", null, "Decision"), h("p", { class: "decision" }, d.decision.why));
    if (d.evidence) append(out, versus(d.evidence.minibatch, `the generation ${d.evidence.generation} minibatch`));
    if (d.decision.reeval && d.decision.reeval.length) append(out, h("pre", null, JSON.stringify(d.decision.reeval, null, 2)));
  }
  if (d.vs_parent) {
    append(out, h("h3", null, "Against its parent, task by task"), versus(d.vs_parent.val, "val"));
    if (d.vs_parent.test && d.vs_parent.test.n) append(out, versus(d.vs_parent.test, "test"));
  }
  if (parent) append(out, h("h3", null, "Diff to its parent"), diffTable(d.diff));
  const chart = curveChart(ctx, d.curve);
  if (chart) append(out, h("h3", null, "Training"), chart);
  if (Object.keys(d.info).length) {
    append(out, h("details", null, h("summary", null, "operator's statistics"),
      table(["", ""], Object.entries(d.info).map(([k, v]) => ({ cells: [k, typeof v === "object" ? h("pre", null, json(v)) : String(v)] })))));
  }
  if (d.deploy_trail.length) {
    append(out, h("h3", null, "Deployment"), table(["when", "from", "to", "by", "why"],
      d.deploy_trail.map((e) => ({ cells: [when(e.created_at), e.from ?? "–", e.to, e.by, e.why] }))));
  }
  append(out, h("h3", null, "Components"), components(ctx, rid, d));
  append(out, h("h3", null, "Rollouts"), await rollouts(ctx, rid, d));
  return out;
}

function components(ctx, rid, d) {
  const box = h("div", { id: "layer" });
  const show = async (which) => {
    box.replaceChildren(h("p", { class: "muted" }, "loading…"));
    try {
      const el = which === "prompts" ? prompts(d.system) : which === "memory" ? await memoryView(rid, d.id)
        : which === "tools" ? await toolsView(rid, d.id) : which === "workflow" ? await workflowView(rid, d.id) : models(d.system);
      box.replaceChildren(el);
    } catch (e) { box.replaceChildren(h("p", { class: "error" }, String(e.message || e))); }
  };
  const bar = h("div", { class: "toolbar" }, ["prompts", "models", "memory", "tools", "workflow"].map((w) =>
    h("button", { dataset: { layer: w }, onclick: () => show(w) }, w)));
  append(box, prompts(d.system));
  return h("div", null, bar, box);
}

function prompts(system) {
  const entries = Object.entries(system.prompts || {});
  if (!entries.length) return h("p", { class: "muted" }, "no prompt components");
  return h("div", null, entries.map(([k, v]) => h("div", null, h("b", null, k), h("pre", null, v))));
}

function models(system) {
  return table(["role", "backend", "name", "base", "adapter", "params"], Object.entries(system.models || {}).map(([role, m]) => ({
    cells: [role, m.backend, m.name, m.base ? `${m.base.kind} ${short(m.base.sha256)} (${num(m.base.size)} B)` : "–",
      m.adapter ? `${m.adapter.kind} ${short(m.adapter.sha256)} (${num(m.adapter.size)} B)` : "–", h("pre", null, json(m.params))],
  })));
}

async function rollouts(ctx, rid, d) {
  const box = h("div", null);
  const split = h("select", null, h("option", { value: "" }, "all splits"), (d.splits || ["train", "val", "test"]).map((x) => h("option", { value: x }, x)));
  const failed = h("input", { type: "checkbox" });
  let offset = 0;
  const list = h("div", null);
  const load = async () => {
    const p = new URLSearchParams({ offset, limit: 25 });
    if (split.value) p.set("split", split.value);
    if (failed.checked) p.set("failed", "1");
    const r = await api(`/api/runs/${enc(rid)}/systems/${enc(d.id)}/rollouts?${p}`);
    list.replaceChildren(
      h("p", { class: "muted" }, `${r.total} rollouts${r.total > 25 ? `, ${offset + 1}–${Math.min(offset + 25, r.total)}` : ""}`),
      table(["#", "split", "phase", "gen", "task", "sample", "score", "error", "tokens", "calls", "seconds"], r.rows.map((t) => ({
        onclick: () => { location.hash = `#/run/${enc(rid)}/rollout/${t.seq}`; },
        data: { seq: t.seq },
        cells: [t.seq, t.split, t.phase, t.generation, t.task_id, t.sample, t.score.toFixed(2),
          t.error ? badge("failed", "bad") : t.reward_error ? badge("reward failed", "warn") : "", t.tokens, t.calls, t.duration.toFixed(2)],
      })), { class: "rollouts" }),
      h("div", { class: "toolbar" },
        offset > 0 ? h("button", { onclick: () => { offset = Math.max(0, offset - 25); load(); } }, "previous") : null,
        offset + 25 < r.total ? h("button", { onclick: () => { offset += 25; load(); } }, "next") : null));
  };
  split.addEventListener("change", () => { offset = 0; load(); });
  failed.addEventListener("change", () => { offset = 0; load(); });
  append(box, h("div", { class: "toolbar" }, split, h("label", null, failed, " failed only")), list);
  await load();
  return box;
}
