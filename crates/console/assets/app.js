// The console's frame: the API through the session, the confirmation
// dialog, page switching by the address's #fragment, and the live samples.
"use strict";
const App = (() => {
  const pages = {};
  let current = null, timer = null;

  // Every API route the console uses, written as docs/admin.md lists them
  // ("METHOD /v1/path/{param}"); tests/console.rs checks that each one is
  // documented there and answers, so no other path may be called.
  const ROUTES = {
    status: "GET /v1/status",
    sessions: "GET /v1/sessions",
    objects: "GET /v1/objects",
    config: "GET /v1/config",
    configDiff: "POST /v1/config/diff",
    configApply: "POST /v1/config/apply",
    device: "GET /v1/devices/{device}",
    deviceFault: "POST /v1/devices/{faulty}/fault",
    pools: "GET /v1/pools",
    poolJobs: "GET /v1/pools/{pool}/jobs",
    volumes: "GET /v1/volumes",
    volumeSnapshot: "POST /v1/volumes/{pool}/{volume}/snapshot",
    volumeClone: "POST /v1/volumes/{pool}/{volume}/clone",
    raidScrub: "POST /v1/raid/{array}/scrub",
    raidFail: "POST /v1/raid/{array}/fail",
    raidReplace: "POST /v1/raid/{array}/replace",
    raidAdd: "POST /v1/raid/{array}/add",
    cacheFlush: "POST /v1/caches/{cache}/flush",
    live: "GET /v1/stats/live",
  };

  // The method and path of route `name` with its {params} filled in.
  function route(name, params, query) {
    const [method, template] = ROUTES[name].split(" ");
    const path = template.replace(/\{(\w+)\}/g, (_, k) => encodeURIComponent(params[k]));
    return [method, "/console/api" + path + (query || "")];
  }

  // Every call goes through /console/api (the session cookie is confined
  // to /console); changes carry X-Console so no other site can make them.
  async function call(name, params, body, extraHeaders, query) {
    const [method, path] = route(name, params || {}, query);
    const headers = Object.assign({}, extraHeaders || {});
    if (method !== "GET") headers["X-Console"] = "1";
    let payload = body;
    if (body !== undefined && typeof body !== "string") {
      payload = JSON.stringify(body);
      headers["Content-Type"] = "application/json";
    }
    const answer = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
    if (answer.status === 401) { location.href = "/console/login"; throw new Error("logged out"); }
    let value = null;
    try { value = await answer.json(); } catch (_) { value = { error: "the answer was not JSON" }; }
    if (!answer.ok) {
      const error = new Error((value && value.error) || ("HTTP " + answer.status));
      error.status = answer.status;
      throw error;
    }
    return value;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function table(headers, rows, attrs) {
    return el("div", { class: "scroll" }, el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map(h => el("th", { scope: "col", class: h.endsWith(" ") ? "num" : null }, h.trim())))),
      el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "none"))])));
  }

  function notice(text, bad) {
    const box = document.getElementById("notice");
    box.replaceChildren(el("p", { class: bad ? "error" : null, id: bad ? "notice-error" : "notice-ok" }, text));
  }

  // Resolves to the dialog's fields when confirmed, null when cancelled.
  function confirm(title, text, fields) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    const box = document.getElementById("confirm-fields");
    box.replaceChildren(...(fields || []).map(f => el("label", {}, f.label,
      f.options
        ? el("select", { name: f.name, id: "confirm-" + f.name }, f.options.map(o => el("option", { value: o }, o)))
        : el("input", { type: "text", name: f.name, id: "confirm-" + f.name, value: f.value || "", required: true }))));
    return new Promise(resolve => {
      dialog.addEventListener("close", () => {
        if (dialog.returnValue !== "ok") return resolve(null);
        const values = {};
        for (const input of box.querySelectorAll("input, select")) values[input.name] = input.value;
        resolve(values);
      }, { once: true });
      dialog.returnValue = "";
      dialog.showModal();
    });
  }

  // An action behind the dialog: the call, then what it answered.
  async function act(title, text, fields, call) {
    const values = await confirm(title, text, fields);
    if (!values) return;
    try {
      const answer = await call(values);
      notice(title + ": " + (answer.done || "done"), false);
    } catch (e) {
      notice(title + " refused (" + (e.status || "error") + "): " + e.message, true);
    }
    show();
  }

  function register(name, page) { pages[name] = page; }

  async function show() {
    const name = (location.hash || "#overview").slice(1);
    const page = pages[name] || pages.overview;
    for (const a of document.querySelectorAll("header nav a")) {
      if (a.getAttribute("href") === "#" + name) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const switched = current !== page;
    current = page;
    clearTimeout(timer);
    const main = document.getElementById("page");
    try {
      await page.render(main, switched);
    } catch (e) {
      main.replaceChildren(el("p", { class: "error" }, "Could not load the page: " + e.message));
    }
    if (switched) main.focus({ preventScroll: true });
    if (page.refresh) timer = setTimeout(show, page.refresh);
  }

  // The live samples: the history, then one a second over SSE.
  const live = { samples: [], listeners: [] };
  const WINDOW_MS = 15 * 60 * 1000;
  function connect() {
    const events = new EventSource(route("live", {})[1]);
    events.addEventListener("history", e => { live.samples = JSON.parse(e.data); live.listeners.forEach(f => f()); });
    events.onmessage = e => {
      live.samples.push(JSON.parse(e.data));
      const cut = Date.now() - WINDOW_MS;
      while (live.samples.length && live.samples[0].t < cut) live.samples.shift();
      live.listeners.forEach(f => f());
    };
  }

  function bytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  }

  window.addEventListener("hashchange", show);
  document.addEventListener("DOMContentLoaded", () => { connect(); show(); });
  return { call, el, table, notice, confirm, act, register, show, live, WINDOW_MS, bytes };
})();
