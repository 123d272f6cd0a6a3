// Gangway console: refreshes the live part of a page (the <main> whose
// data-refresh names seconds) by fetching the page again and swapping it
// in, while the tab is visible. No other script runs on these pages.
(function () {
  "use strict";
  var main = document.getElementById("live");
  if (!main) return;
  var every = parseInt(main.getAttribute("data-refresh") || "0", 10);
  if (!(every > 0)) return;
  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    // Leave a page alone while someone types in one of its fields.
    var active = document.activeElement;
    if (active && main.contains(active) && /INPUT|SELECT|TEXTAREA/.test(active.tagName)) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.redirected || !r.ok) { if (r.status === 401 || r.redirected) window.location.reload(); return null; }
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        if (!fresh) return;
        if (fresh.innerHTML !== main.innerHTML) main.innerHTML = fresh.innerHTML;
        document.title = doc.title;
        main.setAttribute("data-refreshed", String(Date.now()));
        var again = parseInt(fresh.getAttribute("data-refresh") || "0", 10);
        if (!(again > 0)) { clearInterval(timer); }
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }
  var timer = setInterval(refresh, every * 1000);
})();
