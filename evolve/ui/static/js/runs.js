// The first page: every run (task, status, budget spent, baseline and best with intervals) and trace store.
import { h, append, api, table, short, score, gain as withInterval, num, secs, money, ago, statusBadge, badge } from "./dom.js";

function spent(used, budget) {
  const parts = [];
  for (const [k, label, f] of [["rollouts", "rollouts", num], ["calls", "calls", num], ["tokens", "tokens", num],
                               ["usd", "money", money], ["seconds", "s", secs]]) {
    const u = k === "usd" ? used.cost : used[k];
    if (budget[k] !== undefined) parts.push(`${f(u)} / ${f(budget[k])} ${label}`);
    else if (u) parts.push(`${f(u)} ${label}`);
  }
  return parts.join(", ");
}

const picked = new Set(); // runs ticked for comparing, kept across live redraws

export async function runsView(ctx) {
  const data = await api("/api/runs");
  ctx.setCrumbs([{ label: "runs" }]);
  ctx.follow("/api/runs", JSON.stringify(data));
  const out = h("div", null, h("h1", null, "Runs"));
  if (!data.runs.length) append(out, h("p", { class: "muted" }, "No run here yet; it appears when it starts."));
  else {
    const compare = h("button", { id: "compare-runs", disabled: picked.size !== 2, onclick: () => {
      const [a, b] = [...picked];
      location.hash = `#/compare/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
    } }, "compare the two ticked runs");
    const tick = (rid) => h("input", { type: "checkbox", checked: picked.has(rid), dataset: { pick: rid },
      onclick: (e) => e.stopPropagation(),
      onchange: (e) => { if (e.target.checked) picked.add(rid); else picked.delete(rid); compare.disabled = picked.size !== 2; } });
    for (const rid of [...picked]) if (!data.runs.some((r) => r.id === rid)) picked.delete(rid);
    append(out, h("div", { class: "toolbar" }, compare));
    append(out, table(
      ["", "run", "task", "status", { label: "generation", num: true }, { label: "systems", num: true }, "budget spent",
        "baseline val", "best val", "best test", "gain (test)", "updated"],
      data.runs.map((r) => {
        const g = r.paired && r.paired.test;
        const gain = g && g.n ? withInterval(g, "") : "–";
        const gens = r.budget.generations !== undefined ? `${r.generation ?? 0} / ${r.budget.generations}` : num(r.generation);
        return {
          onclick: () => { location.hash = `#/run/${encodeURIComponent(r.id)}`; },
          data: { run: r.id },
          cells: [tick(r.id), h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.id), `${r.name}${r.world ? ` (${r.world})` : ""}`,
            [statusBadge(r.status), r.stop_reason && r.status !== "running" ? h("div", { class: "muted" }, r.stop_reason) : null],
            gens, r.systems, spent(r.used, r.budget),
            r.baseline ? score(r.baseline.val) : "–", r.best ? [score(r.best.val), h("div", { class: "muted mono" }, short(r.best.id))] : "–",
            r.best ? score(r.best.test) : "–", gain, ago(r.updated)],
        };
      }), { id: "runs" }));
  }
  if (data.traffic.length) {
    append(out, h("h2", null, "Live traffic (gateway trace stores)"));
    append(out, table(["store", "sessions", "calls", "feedback", "last call"], data.traffic.map((t) => ({
      onclick: () => { location.hash = `#/traffic/${encodeURIComponent(t.id)}`; },
      cells: [h("a", { href: `#/traffic/${encodeURIComponent(t.id)}` }, t.id), t.sessions, t.calls, t.feedback, ago(t.last_call)],
    }))));
  }
  if (data.problems.length) {
    append(out, h("h2", null, "Not readable"));
    for (const p of data.problems) append(out, h("p", null, badge("skipped", "warn"), h("span", { class: "mono" }, p.path), ": ", p.error));
  }
  return out;
}
