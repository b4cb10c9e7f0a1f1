// Renders the server-built plotly figures (<div class="plot" data-figure="ID"> + <script id="ID"
// type="application/json">), again after every htmx swap; a timeline bar click loads that step.
// A form with data-progress="ID" shows its htmx upload's progress in <progress id="ID">.
// No inline script or handler anywhere: the pages' Content-Security-Policy allows script files only.
(function () {
  // A phone: no chart toolbar (it would cover the data); elsewhere it shows on hover, in the chart's
  // top margin, and stays out of the Tab order (the data is in the page's tables and numbers).
  var narrow = window.matchMedia("(max-width: 700px)");
  function accessible(div) {
    div.querySelectorAll(".modebar a, .modebar button, .modebar [tabindex]").forEach(function (el) {
      el.setAttribute("tabindex", "-1");
    });
    // The drawing is one image named by the figure's label; plotly's other layers (hover) are hidden.
    div.querySelectorAll("svg.main-svg").forEach(function (svg, i) {
      if (i === 0) {
        svg.setAttribute("role", "img");
        svg.setAttribute("aria-label", div.getAttribute("aria-label") || "chart");
      } else {
        svg.setAttribute("aria-hidden", "true");
      }
    });
  }
  function render(root) {
    root.querySelectorAll("div.plot[data-figure]").forEach(function (div) {
      if (div.dataset.rendered) return;
      var source = document.getElementById(div.dataset.figure);
      if (!source || !window.Plotly) return;
      var fig = JSON.parse(source.textContent);
      div.dataset.rendered = "1";
      div.textContent = "";
      Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true,
        displayModeBar: narrow.matches ? false : "hover",
        modeBarButtonsToRemove: ["lasso2d", "select2d"]}).then(function () { accessible(div); });
      div.on("plotly_afterplot", function () { accessible(div); });
      if (div.dataset.stepUrl) {
        div.on("plotly_click", function (ev) {
          var step = ev.points[0].customdata;
          htmx.ajax("GET", div.dataset.stepUrl.replace("STEP", step),
                    {target: div.dataset.stepTarget, swap: "outerHTML"});
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
