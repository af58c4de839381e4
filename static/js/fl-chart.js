/* Charts of Fairlane's pages: <canvas data-chart="ID"> is drawn from the JSON in the
   element #ID (Django's json_script): {"labels": [...], "unit": "USD",
   "datasets": [{"label": "...", "data": [...]}]}, as stacked bars in the page's palette.
   Drawn again when htmx swaps content in, so polled fragments can carry charts. */
(function () {
  "use strict";
  var PALETTE = ["#2b6cb0", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#319795", "#d69e2e",
                 "#718096"];

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function money(value, unit) {
    if (unit !== "USD" || value === 0) return value;
    return "$" + (value >= 0.01 ? value.toFixed(2) : Number(value.toPrecision(2)).toString());
  }

  function draw(canvas) {
    var source = document.getElementById(canvas.dataset.chart);
    if (!source || !window.Chart) return;
    var data = JSON.parse(source.textContent);
    if (canvas._chart) canvas._chart.destroy();
    var ink = css("--fl-muted") || "#666";
    var grid = css("--fl-border") || "#ddd";
    canvas._chart = new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: data.datasets.map(function (d, i) {
          return {label: d.label, data: d.data, backgroundColor: PALETTE[i % PALETTE.length],
                  borderWidth: 0};
        })
      },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        interaction: {mode: "index", intersect: false},
        scales: {
          x: {stacked: true, ticks: {color: ink, maxRotation: 0, autoSkip: true},
              grid: {display: false}},
          y: {stacked: true, beginAtZero: true, grid: {color: grid},
              ticks: {color: ink, callback: function (v) { return money(v, data.unit); }},
              title: {display: true, text: data.unit, color: ink}}
        },
        plugins: {legend: {position: "bottom", labels: {color: ink}}}
      }
    });
  }

  function drawAll(root) {
    (root || document).querySelectorAll("canvas[data-chart]").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", function () { drawAll(); });
  // htmx:load fires on every element htmx adds, also one that replaced itself (outerHTML).
  document.addEventListener("htmx:load", function (event) { drawAll(event.target); });
  window.flChart = {draw: draw, drawAll: drawAll};
})();
