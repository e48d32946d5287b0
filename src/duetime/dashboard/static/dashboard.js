// duetime dashboard: progressive enhancement only. Every page works without this file;
// with it, times read in the browser's zone, the [data-live] part of a page refreshes
// itself every few seconds, destructive buttons ask first, "select all" works, and on a
// phone, where a table's rows are cards, each cell is written after its column's heading.
"use strict";

(function () {
  const FRAGMENT_HEADER = "X-Duetime-Fragment";
  const LIVE_KEY = "duetime.live";

  function pad(number) {
    return String(number).padStart(2, "0");
  }

  // <time data-local datetime="...Z">UTC text</time> -> local "YYYY-MM-DD HH:MM:SS";
  // the UTC text stays in the title.
  function localize(root) {
    root.querySelectorAll("time[data-local]").forEach(function (element) {
      const moment = new Date(element.getAttribute("datetime"));
      if (Number.isNaN(moment.getTime())) {
        return;
      }
      element.textContent =
        moment.getFullYear() + "-" + pad(moment.getMonth() + 1) + "-" + pad(moment.getDate()) +
        " " + pad(moment.getHours()) + ":" + pad(moment.getMinutes()) + ":" + pad(moment.getSeconds());
    });
  }

  // Each body cell's column heading as its data-label: the phone layout, where a row is
  // a card, writes it before the cell. A cell under a rowspan or colspan is matched to
  // the column it stands in.
  function labelCells(root) {
    root.querySelectorAll("table").forEach(function (table) {
      const head = table.tHead && table.tHead.rows[0];
      if (!head) {
        return;
      }
      const headings = [];
      Array.from(head.cells).forEach(function (cell) {
        for (let n = 0; n < cell.colSpan; n++) {
          headings.push(cell.textContent.trim());
        }
      });
      const spanned = []; // per column: rows still taken by a rowspan from above
      Array.from(table.tBodies).forEach(function (body) {
        Array.from(body.rows).forEach(function (row) {
          let column = 0;
          Array.from(row.cells).forEach(function (cell) {
            while (spanned[column] > 0) {
              column++;
            }
            if (headings[column] && !cell.hasAttribute("data-label")) {
              cell.setAttribute("data-label", headings[column]);
            }
            for (let n = 0; n < cell.colSpan; n++) {
              spanned[column + n] = (spanned[column + n] || 0) + cell.rowSpan;
            }
            column += cell.colSpan;
          });
          for (let n = 0; n < spanned.length; n++) {
            spanned[n] = Math.max(0, (spanned[n] || 0) - 1);
          }
        });
      });
    });
  }

  function zoneName() {
    try {
      const parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(new Date());
      const zone = parts.find(function (part) { return part.type === "timeZoneName"; });
      return zone ? zone.value : "";
    } catch (error) {
      return "";
    }
  }

  function setStatus(text) {
    document.querySelectorAll("[data-live-status]").forEach(function (element) {
      element.textContent = " · " + text;
      element.hidden = false;
    });
  }

  // Someone is in the middle of something in the region: a ticked box, a field in focus.
  function busy(region) {
    if (region.querySelector("input[type=checkbox]:checked")) {
      return true;
    }
    const active = document.activeElement;
    return Boolean(active && region.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function setUpLive() {
    const region = document.querySelector("[data-live]");
    const toggle = document.querySelector("[data-live-toggle]");
    const every = Number(document.body.dataset.refreshMs) || 5000;
    if (!region || !toggle) {
      return;
    }
    let on = window.localStorage.getItem(LIVE_KEY) !== "off";
    let inFlight = false;
    let stopped = false;
    const label = toggle.querySelector("[data-live-label]");

    function show() {
      toggle.setAttribute("aria-pressed", on ? "true" : "false");
      label.textContent = on ? "Live" : "Paused";
    }

    toggle.hidden = false;
    show();
    toggle.addEventListener("click", function () {
      on = !on;
      window.localStorage.setItem(LIVE_KEY, on ? "on" : "off");
      show();
      if (on) {
        refresh();
      }
    });

    async function refresh() {
      if (!on || stopped || inFlight || document.hidden || busy(region)) {
        return;
      }
      inFlight = true;
      try {
        const response = await fetch(window.location.href, {
          headers: { [FRAGMENT_HEADER]: "live" },
          credentials: "same-origin",
          cache: "no-store",
        });
        if (response.status === 401) {
          stopped = true;
          toggle.classList.add("stale");
          setStatus("signed out: reload the page to sign in again");
          return;
        }
        if (!response.ok) {
          toggle.classList.add("stale");
          setStatus("refresh failed (" + response.status + "); retrying");
          return;
        }
        const html = await response.text();
        if (busy(region)) {
          return; // the user started something while the request was out
        }
        const open = new Set();
        region.querySelectorAll("details[data-keep][open]").forEach(function (element) {
          open.add(element.dataset.keep);
        });
        region.innerHTML = html;
        region.querySelectorAll("details[data-keep]").forEach(function (element) {
          element.open = open.has(element.dataset.keep);
        });
        localize(region);
        labelCells(region);
        toggle.classList.remove("stale");
        const now = new Date();
        setStatus("updated " + pad(now.getHours()) + ":" + pad(now.getMinutes()) + ":" + pad(now.getSeconds()));
      } catch (error) {
        toggle.classList.add("stale");
        setStatus("refresh failed (dashboard out of reach); retrying");
      } finally {
        inFlight = false;
      }
    }

    window.setInterval(refresh, every);
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden) {
        refresh();
      }
    });
  }

  function setUpConfirm() {
    document.addEventListener("submit", function (event) {
      const button = event.submitter;
      const question = (button && button.dataset.confirm) || event.target.dataset.confirm;
      if (question && !window.confirm(question)) {
        event.preventDefault();
      }
    });
  }

  function setUpSelectAll() {
    document.addEventListener("change", function (event) {
      const box = event.target;
      if (!(box instanceof HTMLInputElement) || !box.hasAttribute("data-select-all")) {
        return;
      }
      const form = box.closest("form");
      if (form) {
        form.querySelectorAll("input[name=ids]").forEach(function (item) {
          item.checked = box.checked;
        });
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    localize(document);
    labelCells(document);
    const zone = zoneName();
    document.querySelectorAll("[data-zone]").forEach(function (element) {
      element.textContent = zone ? " (" + zone + ")" : "";
    });
    setUpLive();
    setUpConfirm();
    setUpSelectAll();
  });
})();
