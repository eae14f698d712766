// Money that accrues while the page is open: every element with data-usd (cost when rendered) and data-rate
// ($/h while billing) is advanced once a second from the moment it appeared on the page.
(function () {
  function tick() {
    var now = performance.now();
    document.querySelectorAll("[data-usd]").forEach(function (el) {
      if (el._t0 === undefined) el._t0 = now;
      var usd = parseFloat(el.dataset.usd) + parseFloat(el.dataset.rate || "0") * (now - el._t0) / 3600000;
      el.textContent = "$" + usd.toFixed(el.dataset.digits ? parseInt(el.dataset.digits, 10) : 4);
    });
  }
  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);
})();
