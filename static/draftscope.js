// Renders the server-built plotly figures (<div class="plot" data-figure="ID"> + <script id="ID"
// type="application/json">), again after every htmx swap; a timeline bar click loads that step.
// A form with data-progress="ID" shows its htmx upload's progress in <progress id="ID">.
// No inline script or handler anywhere: the pages' Content-Security-Policy allows script files only.
(function () {
  function render(root) {
    root.querySelectorAll("div.plot[data-figure]").forEach(function (div) {
      if (div.dataset.rendered) return;
      var source = document.getElementById(div.dataset.figure);
      if (!source || !window.Plotly) return;
      var fig = JSON.parse(source.textContent);
      div.dataset.rendered = "1";
      div.textContent = "";
      Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true,
        modeBarButtonsToRemove: ["lasso2d", "select2d"]});
      if (div.dataset.stepUrl) {
        div.on("plotly_click", function (ev) {
          var step = ev.points[0].customdata;
          htmx.ajax("GET", div.dataset.stepUrl.replace("STEP", step), {target: div.dataset.stepTarget});
        });
      }
    });
  }
  function progress(ev, fraction) {
    var form = ev.target.closest && ev.target.closest("form[data-progress]");
    var bar = form && document.getElementById(form.dataset.progress);
    if (bar && fraction !== null) bar.value = fraction * 100;
  }
  document.addEventListener("htmx:xhr:loadstart", function (ev) { progress(ev, 0); });
  document.addEventListener("htmx:xhr:progress", function (ev) {
    progress(ev, ev.detail.lengthComputable ? ev.detail.loaded / ev.detail.total : null);
  });
  document.addEventListener("DOMContentLoaded", function () { render(document); });
  document.addEventListener("htmx:afterSettle", function (ev) { render(ev.target); });
})();
