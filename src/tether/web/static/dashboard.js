// tether dashboard: live regions. No inline script anywhere (the CSP forbids it).
// An element with data-live="URL" is refreshed from URL (a server-rendered, escaped
// fragment) every data-live-every ms, and/or when the SSE stream reports a transition.
(function () {
  "use strict";
  var regions = [];
  var statusEl = null;

  function refresh(region) {
    if (region.busy) { region.again = true; return; }
    if (region.el.contains(document.activeElement) && document.activeElement.tagName === "INPUT") {
      return; // do not yank a form field from under someone typing
    }
    region.busy = true;
    var checked = {};
    region.el.querySelectorAll("input[type=checkbox]:checked").forEach(function (c) {
      checked[c.name + "=" + c.value] = true;
    });
    fetch(region.url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        if (res.redirected || res.status === 401) { window.location.assign("/login"); return null; }
        return res.ok ? res.text() : null;
      })
      .then(function (html) {
        if (html === null) return;
        region.el.innerHTML = html;
        region.el.querySelectorAll("input[type=checkbox]").forEach(function (c) {
          if (checked[c.name + "=" + c.value]) c.checked = true;
        });
      })
      .catch(function () {})
      .finally(function () {
        region.busy = false;
        if (region.again) { region.again = false; setTimeout(function () { refresh(region); }, 150); }
      });
  }

  function debounce(fn, ms) {
    var timer = null;
    return function () {
      if (timer) return;
      timer = setTimeout(function () { timer = null; fn(); }, ms);
    };
  }

  function listen(url, onEvent) {
    if (!window.EventSource) return;
    var source = new EventSource(url);
    source.addEventListener("open", function () { if (statusEl) statusEl.textContent = "live"; });
    source.addEventListener("error", function () { if (statusEl) statusEl.textContent = "live: reconnecting…"; });
    source.addEventListener("transition", function (ev) {
      if (statusEl) statusEl.textContent = "live · last event " + new Date().toLocaleTimeString();
      onEvent(ev);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    statusEl = document.getElementById("live-status");
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var region = { el: el, url: el.getAttribute("data-live"), busy: false, again: false };
      regions.push(region);
      var every = parseInt(el.getAttribute("data-live-every") || "0", 10);
      if (every > 0) setInterval(function () { refresh(region); }, every);
      var sse = el.getAttribute("data-sse");
      if (el.getAttribute("data-live-on") === "sse" && !sse && statusEl) {
        sse = statusEl.getAttribute("data-sse");
      }
      if (sse) listen(sse, debounce(function () { refresh(region); }, 200));
    });
  });
})();
