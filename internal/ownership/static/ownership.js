// The ownership page refreshes itself: every data-refresh-ms it fetches
// /fragment (the server renders and escapes it) and swaps it in. A failed
// fetch keeps the last good data on the page and says so.
(function () {
  "use strict";
  var body = document.body;
  var live = document.getElementById("live");
  var status = document.getElementById("status");
  var every = parseInt(body.getAttribute("data-refresh-ms"), 10) || 2000;
  var refreshes = 0;
  function say(text, cls) {
    status.textContent = text;
    status.className = cls;
  }
  function tick() {
    fetch("/fragment", { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        refreshes++;
        body.setAttribute("data-refreshes", String(refreshes));
        say("live: refreshed " + new Date().toLocaleTimeString() + ", every " + every / 1000 + "s", "ok");
      })
      .catch(function (e) {
        say("refresh failed (" + e.message + "): showing the data of the last good refresh", "bad");
      })
      .then(function () {
        setTimeout(tick, every);
      });
  }
  setTimeout(tick, every);
})();
