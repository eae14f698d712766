// Plotly charts from figures the server built (data and layout). A run page fetches them from its chart data URL
// and, while the run is active, fetches again every few seconds and redraws in place with Plotly.react (zoom kept
// through layout.uirevision). The comparison page embeds its figures in a json_script element.
(function () {
  var CONFIG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"]};
  // Plotly's mode bar (its toolbar) shows over a chart's top right on a hover or a tap. A title that does not fit
  // beside it is wrapped to the chart's width and set below it, so the bar never covers it and no word is cut off;
  // the phase names drawn above the plot keep their room under it.
  var MODEBAR_PX = 240, MODEBAR_ROW_PX = 30, TITLE_LINE_PX = 18, LABELS_PX = 30;
  var measure = document.createElement("canvas").getContext("2d");

  function lines(text, font, width) {
    measure.font = font;
    var found = [], line = "";
    text.split(" ").forEach(function (word) {
      var longer = line ? line + " " + word : word;
      if (line && measure.measureText(longer).width > width) {
        found.push(line);
        line = word;
      } else {
        line = longer;
      }
    });
    return found.concat(line ? [line] : []);
  }

  function fitted(el, layout) {
    var title = layout.title || {}, font = layout.font || {};
    if (!title.text) return layout;
    var css = ((title.font || {}).size || 14) + "px " + (font.family || "sans-serif");
    var width = el.clientWidth - 16;
    measure.font = css;
    if (measure.measureText(title.text).width <= width - MODEBAR_PX) return layout;
    var wrapped = lines(title.text, css, width), margin = layout.margin || {}, height = layout.height || 300;
    return Object.assign({}, layout, {
      title: Object.assign({}, title, {text: wrapped.join("<br>"), yref: "container", yanchor: "middle",
                                       y: 1 - (MODEBAR_ROW_PX + wrapped.length * TITLE_LINE_PX / 2) / height}),
      margin: Object.assign({}, margin, {t: MODEBAR_ROW_PX + wrapped.length * TITLE_LINE_PX + LABELS_PX})
    });
  }

  // A chart with nothing to draw yet says so in words: an empty plot would show a meaningless default axis.
  function sayEmpty(el, figure) {
    if (el.dataset.empty === figure.empty) return;
    if (el.dataset.rendered) Plotly.purge(el);
    el.textContent = "";
    var title = document.createElement("h3"), why = document.createElement("p");
    title.textContent = figure.title;
    why.textContent = figure.empty;
    el.append(title, why);
    el.classList.remove("js-plotly-plot");
    el.classList.add("chart-empty");
    el.dataset.empty = figure.empty;
    delete el.dataset.rendered;
  }

  var shown = [], refit = null;

  function draw(figures) {
    shown = figures;
    figures.forEach(function (figure) {
      var el = document.querySelector('[data-chart="' + figure.id + '"]');
      if (!el) return;
      if (figure.empty) return sayEmpty(el, figure);
      if (el.dataset.empty) {
        el.textContent = "";
        el.classList.remove("chart-empty");
        delete el.dataset.empty;
      }
      Plotly.react(el, figure.data, fitted(el, figure.layout), CONFIG);
      el.dataset.rendered = "true";
    });
  }

  function describe(payload) {
    var points = payload.points ? payload.points.toLocaleString("en-US") : "no";
    var thinned = payload.bucket_steps > 1 ? " (min/max of every " + payload.bucket_steps + " steps drawn)" : "";
    if (payload.active) return "Live, refreshed every " + payload.refresh_s + " s · " + points + " steps" + thinned;
    return "Run " + payload.state + " · " + points + " steps" + thinned;
  }

  function live(section) {
    var status = section.querySelector("[data-chart-status]");
    var summary = document.getElementById("run-summary");
    function load() {
      if (document.visibilityState === "hidden") {  // no polling from a background tab; resume when it shows
        document.addEventListener("visibilitychange", load, {once: true});
        return;
      }
      fetch(section.dataset.src, {credentials: "same-origin", headers: {Accept: "application/json"}})
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (payload) {
          draw(payload.figures);
          summary.innerHTML = payload.summary_html;
          status.textContent = describe(payload);
          section.dataset.state = payload.state;
          if (payload.active) setTimeout(load, payload.refresh_s * 1000);
        })
        .catch(function (error) {
          status.textContent = "Could not load the charts (" + error.message + "); trying again in 15 s.";
          setTimeout(load, 15000);
        });
    }
    load();
  }

  // A turned phone or a resized window fits the titles again to the charts' new width.
  window.addEventListener("resize", function () {
    clearTimeout(refit);
    refit = setTimeout(function () { draw(shown); }, 200);
  });

  document.addEventListener("DOMContentLoaded", function () {
    var section = document.getElementById("run-charts");
    if (section) live(section);
    var embedded = document.getElementById("figures-data");
    if (embedded) draw(JSON.parse(embedded.textContent));
  });
})();
