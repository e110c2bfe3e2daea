"use strict";
// The charts: the last 15 minutes the router keeps (GET dashboard/series, every 5 s), drawn with the
// uPlot inlined above this script. One row of charts per model, one per engine; a line per model or
// per engine in each. Each chart's element says how many points it drew (data-points), for people
// reading the page's source and for the browser test.
(() => {
  const CHARTS = [
    { key: "rate", title: "requests/s", unit: "req/s" },
    { key: "errors", title: "errors/s", unit: "err/s" },
    { key: "ttft", title: "time to first token p50 / p95", unit: "ms", pair: ["ttft_p50_ms", "ttft_p95_ms"] },
    { key: "itl_p50_ms", title: "inter-token latency p50", unit: "ms" },
    { key: "kv_usage", title: "KV-cache usage", unit: "%", scale: 100 },
    { key: "waiting", title: "requests waiting (engine queue)", unit: "req" },
  ];
  const COLORS = ["#0969da", "#1a7f37", "#cf222e", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781"];
  const plots = new Map(); // chart id -> {plot, labels}
  const PER_ENGINE_LINES = 16; // lines on one engine chart; the rest are listed as not drawn

  function lines(subjects, chart) {
    // [label, values] per line: a model or an engine, and for TTFT its p50 and p95
    const out = [];
    for (const [label, series] of subjects) {
      const keys = chart.pair || [chart.key];
      keys.forEach((k, i) => {
        const values = (series[k] || []).map((v) => (v === null || v === undefined ? null : v * (chart.scale || 1)));
        out.push([chart.pair ? `${label} ${i ? "p95" : "p50"}` : label, values, i]);
      });
    }
    return out;
  }

  function draw(box, id, chart, times, drawn) {
    const labels = drawn.map(([label]) => label).join("\n");
    const data = [times, ...drawn.map(([, values]) => values)];
    const points = drawn.reduce((n, [, values]) => n + values.filter((v) => v !== null).length, 0);
    let held = plots.get(id);
    let cell = box.querySelector(`[data-chart="${id}"]`);
    if (!cell) {
      cell = document.createElement("div");
      cell.className = "chart";
      cell.dataset.chart = id;
      box.appendChild(cell);
    }
    cell.dataset.points = String(points);
    cell.dataset.lines = String(drawn.length);
    if (held && held.labels === labels) {
      held.plot.setData(data);
      return;
    }
    if (held) held.plot.destroy();
    cell.replaceChildren();
    const width = Math.max(260, Math.floor(box.clientWidth / 3) - 16);
    const opts = {
      title: `${chart.title} (${chart.unit})`,
      width,
      height: 170,
      scales: { x: { time: true } },
      axes: [{ stroke: "#888" }, { stroke: "#888", size: 48 }],
      legend: { show: drawn.length <= 8 },
      series: [{}, ...drawn.map(([label, , dash], i) => ({
        label,
        stroke: COLORS[Math.floor(i / (chart.pair ? 2 : 1)) % COLORS.length],
        dash: dash ? [5, 4] : undefined,
        width: 1.5,
        spanGaps: false,
      }))],
    };
    held = { plot: new uPlot(opts, data, cell), labels };
    plots.set(id, held);
  }

  function render(body) {
    const times = body.times || [];
    const models = Object.entries(body.models || {});
    const engines = Object.entries(body.engines || {}).map(([url, e]) => [e.name + (e.present ? "" : " (gone)"), e]);
    const shown = engines.slice(0, PER_ENGINE_LINES);
    const left = engines.length - shown.length + (body.engines_uncharted || 0);
    document.getElementById("charts-note").textContent =
      `last ${Math.round((body.span_s || 900) / 60)} min, a point every ${body.step_s || 5} s` +
      (left > 0 ? ` · ${left} engine(s) not drawn (the router charts ${PER_ENGINE_LINES} per chart)` : "");
    const modelBox = document.getElementById("model-charts");
    const engineBox = document.getElementById("engine-charts");
    for (const chart of CHARTS) {
      draw(modelBox, "model-" + chart.key, chart, times, lines(models, chart));
      draw(engineBox, "engine-" + chart.key, chart, times, lines(shown, chart));
    }
  }

  let failing = false;
  async function poll() {
    try {
      const answer = await fetch("dashboard/series", { cache: "no-store" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      render(await answer.json());
      failing = false;
    } catch (err) {
      if (!failing) document.getElementById("charts-note").textContent = "the router's series could not be read: " + err;
      failing = true;
    }
  }
  poll();
  setInterval(poll, 5000);
})();
