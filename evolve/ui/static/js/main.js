// The router and the live loop: each view says which version URL it follows; when that version
// changes (the run wrote), the view is drawn again in place, keeping scroll positions.
import { h, api } from "./dom.js";
import { runsView } from "./runs.js";
import { runView } from "./run.js";
import { systemPage } from "./system.js";
import { rolloutView } from "./trajectory.js";
import { compareView, compareRunsView } from "./compare.js";
import { trafficView, sessionView } from "./traffic.js";
import { preload } from "./charts.js";

const view = document.getElementById("view");
const live = document.getElementById("live");
const crumbs = document.getElementById("crumbs");
const POLL_MS = 1500;
let drawing = 0;
let followed = null; // {url, version}

function parse() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, qs] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(qs || "") };
}

function setCrumbs(items) {
  crumbs.replaceChildren(...items.flatMap((it, i) => [i ? h("span", null, "/") : null,
    it.href ? h("a", { href: it.href }, it.label) : h("span", null, it.label)]).filter(Boolean));
}

async function dispatch(route, ctx) {
  const [a, b, c, d] = route.parts;
  if (!a) return runsView(ctx);
  if (a === "run" && c === "system" && d) return systemPage(ctx, b, d);
  if (a === "run" && c === "rollout" && d) return rolloutView(ctx, b, Number(d));
  if (a === "run" && b) return runView(ctx, b, c || "overview");
  if (a === "compare" && b && c) return compareRunsView(ctx, b, c);
  if (a === "compare") return compareView(ctx);
  if (a === "traffic" && c === "session" && d) return sessionView(ctx, b, d);
  if (a === "traffic" && b) return trafficView(ctx, b);
  return h("p", { class: "error" }, `no page ${location.hash}`);
}

function keptScroll() {
  const out = { window: window.scrollY };
  document.querySelectorAll("[data-keep]").forEach((el) => { out[el.dataset.keep] = [el.scrollLeft, el.scrollTop]; });
  return out;
}

function restoreScroll(saved) {
  if (!saved) return;
  window.scrollTo(0, saved.window);
  document.querySelectorAll("[data-keep]").forEach((el) => {
    const at = saved[el.dataset.keep];
    if (at) { el.scrollLeft = at[0]; el.scrollTop = at[1]; }
  });
}

export async function draw(again = false) {
  const mine = ++drawing;
  const route = parse();
  const mounted = [];
  const ctx = {
    route, setCrumbs, again, redraw: () => draw(true),
    follow: (url, version) => { followed = { url, version }; },
    onMount: (fn) => mounted.push(fn),
  };
  if (!again) followed = null;
  const saved = again ? keptScroll() : null;
  let el;
  try {
    el = await dispatch(route, ctx);
  } catch (e) {
    console.error(e);
    el = h("p", { class: "error" }, String((e && e.message) || e));
  }
  if (mine !== drawing) return; // a newer drawing started meanwhile
  view.replaceChildren(el);
  for (const fn of mounted) {
    try { fn(); } catch (e) { console.error(e); }
  }
  restoreScroll(saved);
  live.className = followed ? "on" : "";
  live.textContent = followed ? "live" : "";
  document.body.dataset.drawn = String(mine); // tests wait on this
}

async function poll() {
  if (followed) {
    try {
      const v = await api(followed.url);
      const now = JSON.stringify(v.version ?? v);
      if (followed.version === undefined) followed.version = now;
      else if (now !== followed.version) {
        followed.version = now;
        await draw(true);
      }
    } catch (e) { /* the server is gone or busy: try again next time */ }
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("hashchange", () => draw(false));
draw(false).then(() => (window.requestIdleCallback || setTimeout)(preload));
setTimeout(poll, POLL_MS);
