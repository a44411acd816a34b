// A gateway's trace store: sessions by route and system, their calls (messages, tool calls, answers) and feedback.
import { h, append, api, table, short, badge, json, when, ago, num } from "./dom.js";

const enc = encodeURIComponent;

export async function trafficView(ctx, tid) {
  const offset = Number(ctx.route.query.get("offset") || 0);
  const [sum, list] = await Promise.all([api(`/api/traffic/${enc(tid)}`), api(`/api/traffic/${enc(tid)}/sessions?offset=${offset}&limit=50`)]);
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: `traffic ${tid}` }]);
  ctx.follow(`/api/traffic/${enc(tid)}/version`);
  const page = (o) => { location.hash = `#/traffic/${enc(tid)}?offset=${o}`; };
  return h("div", { id: "traffic" }, h("h1", null, `Traffic: ${tid}`), h("p", { class: "muted mono" }, sum.dir),
    h("p", null, `${num(sum.sessions)} sessions, ${num(sum.calls)} calls, ${num(sum.feedback)} feedback; last call ${ago(sum.last_call)}`),
    h("h2", null, "By route and system"),
    table(["route", "system", "sessions", "scored", "mean first score"], sum.by_route_and_system.map((r) => ({
      cells: [r.route || "–", h("span", { class: "mono" }, short(r.system)), r.sessions, r.scored, r.mean === null ? "–" : r.mean.toFixed(3)],
    }))),
    h("h2", null, `Sessions (newest first; ${offset + 1}–${Math.min(offset + 50, list.total)} of ${list.total})`),
    table(["started", "route", "system", "calls", "score", "feedback", "session"], list.rows.map((r) => ({
      onclick: () => { location.hash = `#/traffic/${enc(tid)}/session/${enc(r.id)}`; },
      cells: [when(r.created), r.route || "–", h("span", { class: "mono" }, short(r.system_id)), r.n_calls,
        r.score === null ? "–" : r.score, r.feedback, h("span", { class: "mono" }, r.id)],
    })), { id: "sessions" }),
    h("div", { class: "toolbar" }, offset > 0 ? h("button", { onclick: () => page(Math.max(0, offset - 50)) }, "newer") : null,
      offset + 50 < list.total ? h("button", { onclick: () => page(offset + 50) }, "older") : null));
}

export async function sessionView(ctx, tid, sid) {
  const s = await api(`/api/traffic/${enc(tid)}/sessions/${enc(sid)}`);
  ctx.setCrumbs([{ label: "runs", href: "#/" }, { label: `traffic ${tid}`, href: `#/traffic/${enc(tid)}` }, { label: `session ${short(sid)}` }]);
  ctx.follow(`/api/traffic/${enc(tid)}/version`);
  const out = h("div", { id: "session" }, h("h1", { class: "mono" }, sid),
    h("p", null, `route ${s.session.route || "–"} · system ${short(s.session.system_id)} · ${s.session.n_calls} calls · started ${when(s.session.created)}`));
  for (const c of s.calls) {
    append(out, h("div", { class: `step llm${c.status !== "ok" ? " err" : ""}` },
      h("b", null, `call ${c.seq}: ${c.api} ${c.model || ""} → ${c.upstream_model || ""}`), " ", badge(c.status, c.status === "ok" ? "ok" : "bad"),
      h("span", { class: "muted" }, ` ${((c.latency_s || 0) * 1000).toFixed(0)} ms, ${c.prompt_tokens || 0}+${c.completion_tokens || 0} tokens`),
      h("details", null, h("summary", null, `${(c.messages || []).length} messages in`),
        (c.messages || []).map((m) => h("div", { class: "msg" }, h("div", { class: "role" }, m.role), h("pre", null, json(m.content ?? m.tool_calls ?? ""))))),
      c.output ? h("div", { class: "msg" }, h("div", { class: "role" }, "answer"), h("pre", null, c.output)) : null,
      (c.tool_calls || []).map((t) => h("div", { class: "msg" }, h("div", { class: "role" }, "tool call"), h("pre", null, `${t.function.name}(${t.function.arguments})`))),
      c.error ? h("pre", { class: "error" }, c.error) : null));
  }
  append(out, h("h2", null, "Feedback"), s.feedback.length ? table(["when", "score", "components", "text", "source"], s.feedback.map((f) => ({
    cells: [when(f.ts), f.score ?? "–", Object.keys(f.components || {}).length ? json(f.components) : "", f.text || "", f.source || ""],
  }))) : h("p", { class: "muted" }, "none"));
  return out;
}
