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

function ready(div) {
  if (!window.Plotly) { div.textContent = "charts need plotly.min.js, which did not load"; return false; }
  return true;
}

export function lineChart(div, title, x, series, opts = {}) {
  if (!ready(div)) return;
  const traces = series.map((s) => ({ x: s.x || x, y: s.y, name: s.name, mode: "lines+markers", type: "scatter",
    line: { dash: s.dash || "solid" }, connectgaps: true }));
  window.Plotly.newPlot(div, traces, base(title, opts), CONFIG);
}

export function barChart(div, title, x, series, opts = {}) {
  if (!ready(div)) return;
  const traces = series.map((s) => ({ x, y: s.y, name: s.name, type: "bar" }));
  window.Plotly.newPlot(div, traces, { ...base(title, opts), barmode: "group" }, CONFIG);
}
