// Plotly (served from the plotly wheel: /static/vendor/plotly.min.js), drawn once the div is on the page.
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

function base(title, opts = {}) {
  return {
    title: { text: title, font: { size: 13 } }, margin: { l: 50, r: 10, t: 36, b: 70 }, legend: { orientation: "h", y: -0.3 },
    xaxis: { title: { text: opts.x || "generation", standoff: 4 }, dtick: opts.dtick === undefined ? 1 : opts.dtick },
    yaxis: opts.percent ? { tickformat: ".0%", rangemode: "tozero" } : { rangemode: "tozero" },
    paper_bgcolor: "#fff", plot_bgcolor: "#fff",
  };
}

// Plotly is 4.6 MB: loaded when the first chart is drawn, not with the page
let loading = null;
function plotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const el = document.createElement("script");
      el.src = "/static/vendor/plotly.min.js";
      el.onload = () => resolve(window.Plotly);
      el.onerror = () => { loading = null; reject(new Error("plotly.min.js did not load")); };
      document.head.append(el);
    });
  }
  return loading;
}

// fetched while the reader looks at the first page, so that the first chart need not wait for it
export function preload() { plotly().catch(() => {}); }

async function ready(div) {
  try { await plotly(); return true; } catch (e) { div.textContent = `charts: ${e.message}`; return false; }
}

export async function lineChart(div, title, x, series, opts = {}) {
  if (!(await ready(div))) return;
  const traces = series.map((s) => ({ x: s.x || x, y: s.y, name: s.name, mode: "lines+markers", type: "scatter",
    line: { dash: s.dash || "solid" }, connectgaps: true }));
  window.Plotly.newPlot(div, traces, base(title, opts), CONFIG);
}

export async function barChart(div, title, x, series, opts = {}) {
  if (!(await ready(div))) return;
  const traces = series.map((s) => ({ x, y: s.y, name: s.name, type: "bar" }));
  window.Plotly.newPlot(div, traces, { ...base(title, opts), barmode: "group" }, CONFIG);
}
