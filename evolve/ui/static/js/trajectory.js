// One rollout: the messages, each model call (its sampled tokens coloured by log-prob when the
// tokenizer is known), each tool call with its result or error, the reward's components and feedback.
import { h, append, api, table, short, badge, json } from "./dom.js";

const enc = encodeURIComponent;

function tokens(step) {
  const texts = step.token_texts, lps = step.logprobs;
  if (!texts || !lps) return null;
  const box = h("div", { class: "tokens" });
  texts.forEach((t, i) => {
    const lp = lps[i];
    const p = lp === undefined || lp === null ? null : Math.exp(lp);
    const bg = p === null ? "transparent" : `hsl(${Math.round(120 * p)}, 70%, ${85 - 10 * p}%)`;
    append(box, h("span", { class: "tok", style: { background: bg }, title: p === null ? "no log-prob" : `log-prob ${lp.toFixed(3)}, p ${p.toFixed(3)}` }, t || "·"));
  });
  return h("div", null, h("div", { class: "muted" }, "sampled tokens, coloured by probability (red low, green high); hover for the log-prob"), box);
}

function llmStep(step, i) {
  const lp = step.logprobs;
  const mean = lp && lp.length ? lp.reduce((a, b) => a + b, 0) / lp.length : null;
  return h("div", { class: "step llm", dataset: { step: i, kind: "llm" } },
    h("b", null, `model call ${i}: ${step.role} (${step.model})`),
    h("span", { class: "muted" }, ` ${step.prompt_tokens || 0}+${step.completion_tokens || 0} tokens, ${(step.duration || 0).toFixed(2)} s`,
      step.temperature !== null && step.temperature !== undefined ? `, T=${step.temperature}` : "",
      step.finish_reason ? `, ${step.finish_reason}` : "", mean !== null ? `, mean log-prob ${mean.toFixed(3)}` : ""),
    h("details", { open: (step.messages || []).length <= 3 }, h("summary", null, `${(step.messages || []).length} messages in`),
      (step.messages || []).map((m) => h("div", { class: "msg" }, h("div", { class: "role" }, m.role), h("pre", null, m.content)))),
    h("div", { class: "msg" }, h("div", { class: "role" }, "output"), h("pre", { class: "output" }, step.output)),
    tokens(step));
}

function toolStep(step, i) {
  return h("div", { class: `step tool${step.error ? " err" : ""}`, dataset: { step: i, kind: "tool", tool: step.name } },
    h("b", null, `tool call ${i}: `, h("span", { class: "mono" }, step.name)),
    h("span", { class: "muted" }, ` ${(step.duration || 0).toFixed(3)} s`), step.error ? [" ", badge("error", "bad")] : null,
    h("div", { class: "msg" }, h("div", { class: "role" }, "arguments"), h("pre", { class: "args" }, json(step.args))),
    step.error ? h("div", { class: "msg" }, h("div", { class: "role" }, "error"), h("pre", { class: "error tool-error" }, step.error))
      : h("div", { class: "msg" }, h("div", { class: "role" }, "result"), h("pre", { class: "result" }, json(step.result))));
}

export async function rolloutView(ctx, rid, seq) {
  const { row, trajectory: t } = await api(`/api/runs/${enc(rid)}/rollouts/${seq}`);
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: rid, href: `#/run/${enc(rid)}` },
    { label: `system ${short(t.system_id)}`, href: `#/run/${enc(rid)}/lineage?sys=${t.system_id}` }, { label: `rollout ${seq}` }]);
  const r = t.reward;
  const out = h("div", { id: "trajectory", dataset: { seq } },
    h("h1", null, `task ${t.task_id}`, " ", row.error ? badge("failed", "bad") : badge(`score ${row.score.toFixed(2)}`, row.score > 0 ? "ok" : "warn")),
    h("p", null, "system ", h("a", { class: "mono", href: `#/run/${enc(rid)}/lineage?sys=${t.system_id}` }, short(t.system_id)),
      ` · ${row.split} / ${row.phase} · generation ${row.generation} · sample ${row.sample} · ${t.tokens} tokens · ${(t.duration || 0).toFixed(2)} s`,
      t.cost ? ` · $${t.cost.toFixed(5)}` : ""));
  if (t.error) append(out, h("h3", null, "Error"), h("pre", { class: "error" }, t.error),
    t.infra ? h("p", null, badge(`the world failed: ${t.infra.category}`, "warn"), t.infra.message) : null);
  append(out, h("h3", null, "Reward"));
  if (r) {
    append(out, h("p", null, `score ${r.score}`), r.error ? h("pre", { class: "error" }, `reward error: ${r.error}`) : null,
      Object.keys(r.components || {}).length ? table(["component", "value"], Object.entries(r.components).map(([k, v]) => ({ cells: [k, v] })), { class: "components" }) : null,
      r.feedback ? h("div", null, h("div", { class: "muted" }, "feedback"), h("pre", { class: "feedback" }, r.feedback)) : null);
  } else append(out, h("p", { class: "muted" }, "no reward recorded"));
  append(out, h("h3", null, `Steps (${(t.steps || []).length})`));
  (t.steps || []).forEach((st, i) => append(out, st.kind === "tool" ? toolStep(st, i) : llmStep(st, i)));
  append(out, h("h3", null, "Output"), h("pre", { class: "final" }, json(t.output)));
  return out;
}

