// Building the page without ever parsing data as HTML: h() makes elements, strings become text nodes.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") Object.assign(el.style, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, ...children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export class ApiError extends Error {}

export async function api(path) {
  const r = await fetch(path, { headers: { accept: "application/json" }, credentials: "same-origin" });
  let body = null;
  try { body = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) throw new ApiError((body && body.error) || `${r.status} ${r.statusText}`);
  return body;
}

export const short = (id) => (id ? String(id).slice(0, 8) : "–");
export const pct = (x, d = 1) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(d)}%`);
export function num(x, d = 0) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Math.abs(x) >= 1e6) return `${(x / 1e6).toFixed(1)}M`;
  if (Math.abs(x) >= 1e4) return `${(x / 1e3).toFixed(1)}k`;
  return x.toFixed(d);
}
// Seconds: one decimal below 10 (a short run is not "0"), whole above.
export function secs(x) { return num(x, typeof x === "number" && Math.abs(x) < 10 ? 1 : 0); }
export function money(x) { return x ? `$${x.toFixed(x < 1 ? 4 : 2)}` : "$0"; }
export function when(ts) { return ts ? new Date(ts * 1000).toLocaleString() : "–"; }
export function ago(ts) {
  if (!ts) return "–";
  const s = Date.now() / 1000 - ts;
  if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return when(ts);
}
// A score with its 95% interval (Wilson for scores in [0, 1]: asymmetric, so [low, high], never ±).
export function score(sc) {
  if (!sc) return "–";
  const ci = sc.low === null || sc.low === undefined ? "" : ` [${(100 * sc.low).toFixed(1)}, ${(100 * sc.high).toFixed(1)}]`;
  return `${pct(sc.mean)}${ci} (n=${sc.n})`;
}
// A paired difference in points with its 95% interval: ±x while symmetric, [low, high] once cut at ±100.
export function gain(v, unit = " pts") {
  if (!v || v.diff === null || v.diff === undefined) return "–";
  const d = `${(100 * v.diff).toFixed(1)}${unit}`;
  if (v.low === null || v.low === undefined) return v.ci95 === null || v.ci95 === undefined ? d : `${d} ±${(100 * v.ci95).toFixed(1)}`;
  const sym = v.ci95 !== null && Math.abs(v.low - (v.diff - v.ci95)) < 1e-9 && Math.abs(v.high - (v.diff + v.ci95)) < 1e-9;
  return sym ? `${d} ±${(100 * v.ci95).toFixed(1)}` : `${d} [${(100 * v.low).toFixed(1)}, ${(100 * v.high).toFixed(1)}]`;
}
export function json(v) {
  if (typeof v === "string") return v;
  const flat = JSON.stringify(v);
  return flat !== undefined && flat.length <= 100 ? flat : JSON.stringify(v, null, 2);
}

export function table(headers, rows, opts = {}) {
  const head = h("tr", null, headers.map((c) => h("th", { class: c.num ? "num" : null, title: c.title }, c.label ?? c)));
  const body = rows.map((r) => {
    const tr = h("tr", { class: r.onclick ? "click" : null, onclick: r.onclick, dataset: r.data },
      r.cells.map((v, i) => h("td", { class: headers[i].num ? "num" : null }, v)));
    return tr;
  });
  return h("table", { id: opts.id, class: opts.class }, h("thead", null, head), h("tbody", null, body));
}

export function badge(text, kind) { return h("span", { class: `badge ${kind || ""}` }, text); }

export function statusBadge(status) {
  const kind = { finished: "ok", running: "info", failed: "bad", stopped: "warn" }[status];
  return badge(status, kind);
}

export function card(k, v, title) { return h("div", { class: "card", title }, h("div", { class: "k" }, k), h("div", { class: "v" }, v)); }
