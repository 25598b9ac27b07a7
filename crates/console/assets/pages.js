// The overview (what is served, who is connected, health, live I/O), the
// jobs and the configuration pages.
"use strict";
(() => {
  const { call, el, table, notice, live, WINDOW_MS } = App;
  const fixed = (v, digits) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);
  const mbps = v => fixed(v / 1e6, 2);

  // ---- overview --------------------------------------------------------
  function liveKey(s) { return s.export !== undefined ? "nbd " + s.export : s.target + " LUN " + s.lun; }

  function liveRows() {
    const last = live.samples[live.samples.length - 1];
    if (!last) return [];
    const luns = last.luns.map(l => el("tr", { "data-key": liveKey(l) },
      el("th", { scope: "row" }, liveKey(l)),
      el("td", { class: "num iops" }, fixed(l.iops, 0)),
      el("td", { class: "num" }, mbps(l.read_bytes)), el("td", { class: "num" }, mbps(l.write_bytes)),
      el("td", { class: "num" }, fixed(l.p50_us, 1)), el("td", { class: "num" }, fixed(l.p99_us, 1)),
      el("td", { class: "num" }, fixed(l.p999_us, 1))));
    const exports = last.exports.map(x => el("tr", { "data-key": liveKey(x) },
      el("th", { scope: "row" }, liveKey(x)),
      el("td", { class: "num iops" }, fixed(x.iops, 0)),
      el("td", { class: "num", colspan: 2 }, mbps(x.bytes) + " total"),
      el("td", { class: "num", colspan: 3 }, "-")));
    return luns.concat(exports);
  }

  function series(pick) {
    const byKey = new Map();
    for (const s of live.samples) {
      for (const item of s.luns.concat(s.exports)) {
        const v = pick(item);
        if (v === null || v === undefined) continue;
        const key = liveKey(item);
        if (!byKey.has(key)) byKey.set(key, []);
        byKey.get(key).push([s.t, v]);
      }
    }
    return [...byKey.entries()].map(([name, points]) => ({ name, points }));
  }

  function drawLive() {
    const body = document.getElementById("live-body");
    if (!body) return;
    body.replaceChildren(...liveRows());
    const charts = [
      ["chart-iops", s => s.iops, ""],
      ["chart-bytes", s => (s.bytes !== undefined ? s.bytes : s.read_bytes + s.write_bytes), "B/s"],
      ["chart-p99", s => s.p99_us, "µs"],
    ];
    let legend = [];
    for (const [id, pick, unit] of charts) {
      const data = series(pick);
      if (id === "chart-iops") legend = data.map(d => d.name);
      Chart.draw(document.getElementById(id), data, WINDOW_MS, unit);
    }
    document.getElementById("chart-legend").replaceChildren(...legend.map((name, i) => {
      const swatch = el("b", { "aria-hidden": "true" }, "— ");
      swatch.style.color = Chart.COLOURS[i % Chart.COLOURS.length];
      return el("span", {}, swatch, name);
    }));
    const initiators = document.getElementById("initiators-body");
    const last = live.samples[live.samples.length - 1];
    if (initiators && last) {
      initiators.replaceChildren(...last.initiators.map(i => el("tr", {},
        el("td", {}, i.initiator), el("td", {}, i.target + " LUN " + i.lun),
        el("td", { class: "num" }, fixed(i.iops, 0)), el("td", { class: "num" }, mbps(i.bytes)))));
    }
  }
  live.listeners.push(drawLive);

  function liveSection() {
    const figure = (id, caption) => el("figure", {}, el("figcaption", { id: id + "-caption" }, caption),
      el("canvas", { id, role: "img", "aria-labelledby": id + "-caption" }));
    return el("section", { id: "overview-live", "aria-labelledby": "live-title" },
      el("h2", { id: "live-title" }, "Live I/O (each second, last 15 minutes)"),
      el("div", { class: "charts" },
        figure("chart-iops", "IOPS"), figure("chart-bytes", "Throughput"), figure("chart-p99", "Latency p99")),
      el("p", { class: "legend", id: "chart-legend" }),
      el("div", { class: "scroll" }, el("table", { id: "live" },
        el("thead", {}, el("tr", {}, ["LUN / export", "IOPS", "read MB/s", "write MB/s", "p50 µs", "p99 µs", "p99.9 µs"]
          .map((h, i) => el("th", { scope: "col", class: i ? "num" : null }, h)))),
        el("tbody", { id: "live-body" }))),
      el("h3", {}, "Active initiators"),
      el("div", { class: "scroll" }, el("table", {},
        el("thead", {}, el("tr", {}, ["initiator", "LUN", "IOPS", "MB/s"].map(h => el("th", { scope: "col" }, h)))),
        el("tbody", { id: "initiators-body" }))));
  }

  async function staticSection() {
    const [status, sessions] = await Promise.all([call("status"), call("sessions")]);
    const health = status.degraded.length
      ? table(["severity", "kind", "name", "problem"], status.degraded.map(d => el("tr", {},
          el("td", { class: "bad" }, d.severity), el("td", {}, d.kind), el("td", {}, d.name), el("td", {}, d.problem))),
          { id: "degraded" })
      : el("p", { class: "good", id: "healthy" }, "Healthy: nothing is degraded.");
    return el("div", { id: "overview-static" },
      el("h2", {}, "Health"), health,
      el("h2", {}, "Portals"),
      table(["address", "listening", "sessions "], status.portals.map(p => el("tr", {},
        el("td", {}, p.address), el("td", { class: p.listening ? "good" : "bad" }, p.listening ? "yes" : "no"),
        el("td", { class: "num" }, p.sessions)))),
      el("h2", {}, "Targets"),
      table(["target", "LUN", "device", "pool", "group", "state"], status.targets.flatMap(t => t.luns.map(l => el("tr", {},
        el("td", {}, t.name), el("td", {}, l.lun), el("td", {}, l.device), el("td", {}, l.pool || ""),
        el("td", {}, l.group || ""), el("td", { class: l.state === "ok" ? "good" : "bad" }, l.problem || l.state)))),
        { id: "luns" }),
      el("h2", {}, "NBD exports"),
      table(["export", "device", "state"], status.nbd_exports.map(x => el("tr", {},
        el("td", {}, x.name), el("td", {}, x.device), el("td", { class: x.state === "ok" ? "good" : "bad" }, x.problem || x.state)))),
      el("h2", {}, "Sessions"),
      table(["initiator", "target / export", "portal", "transport", "digests", "MRDSL"], sessions.sessions.map(s => el("tr", {},
        el("td", {}, s.initiator || s.peer || ""), el("td", {}, s.target || s.export || ""), el("td", {}, s.portal || ""),
        el("td", {}, s.transport), el("td", {}, [s.header_digest, s.data_digest].filter(Boolean).join(" / ")),
        el("td", {}, s.max_recv_data_segment_length ? s.max_recv_data_segment_length.target : "")))));
  }

  App.register("overview", {
    refresh: 5000,
    async render(main, switched) {
      const fresh = await staticSection();
      if (switched || !document.getElementById("overview-live")) {
        main.replaceChildren(el("h1", {}, "Overview"), liveSection(), fresh);
      } else {
        document.getElementById("overview-static").replaceWith(fresh);
      }
      drawLive();
    },
  });

  // ---- jobs ------------------------------------------------------------
  App.register("jobs", {
    refresh: 1000,
    async render(main) {
      const pools = (await call("pools")).pools;
      const jobs = (await Promise.all(pools.map(p => call("poolJobs", { pool: p.name }))))
        .flatMap(j => j.jobs);
      const status = await call("status");
      const arrays = status.devices.filter(d => d.kind === "raid");
      const trees = await Promise.all(arrays.map(d => call("device", { device: d.name })));
      const syncs = trees.filter(t => t.state.sync).map(t => {
        const percent = parseFloat((t.state.sync.match(/([\d.]+)%/) || [0, 0])[1]);
        return el("tr", { "data-array": t.name },
          el("td", {}, t.name), el("td", {}, t.state.sync.split(" ")[0]), el("td", {}, "running"),
          el("td", {}, el("progress", { max: 100, value: percent, "aria-label": t.name + " " + t.state.sync }), " " + t.state.sync));
      });
      const rows = jobs.map(j => el("tr", {},
        el("td", {}, j.pool + "/" + (j.volume || "")), el("td", {}, j.operation), el("td", { class: j.state === "failed" ? "bad" : null }, j.state),
        el("td", {}, el("progress", { max: 100, value: j.percent || 0, "aria-label": j.operation + " " + (j.percent || 0) + "%" }),
          " " + fixed(j.percent, 1) + "%")));
      main.replaceChildren(el("h1", {}, "Jobs"),
        el("p", { class: "hint" }, "Long operations: RAID rebuilds, resyncs and scrubs, and pool jobs, running and finished."),
        table(["object", "operation", "state", "progress"], syncs.concat(rows), { id: "jobs" }));
    },
  });

  // ---- configuration ---------------------------------------------------
  async function diff(text) {
    return (await call("configDiff", {}, text, { "X-Config-Origin": "console" })).changes;
  }

  function showChanges(changes) {
    document.getElementById("config-diff").textContent = changes.length ? changes.join("\n") : "No change.";
  }

  function showError(e) {
    document.getElementById("config-error").textContent = e ? "Refused (" + (e.status || "error") + "): " + e.message : "";
  }

  async function apply() {
    const text = document.getElementById("config-text").value;
    showError(null);
    try {
      const changes = await diff(text);
      showChanges(changes);
      const losses = changes.filter(c => c.startsWith("!"));
      let force = false;
      if (losses.length) {
        const ok = await App.confirm("Apply and replace data?",
          "This change replaces data that LUNs serve; it is lost:\n" + losses.join("\n"));
        if (!ok) return;
        force = true;
      }
      const done = await call("configApply", {}, text, { "X-Config-Origin": "console" }, force ? "?force=true" : "");
      notice("Applied: " + (done.changes.length ? done.changes.join("; ") : "no change"), false);
      document.getElementById("config-applied").textContent = "Applied.";
    } catch (e) {
      showError(e);
    }
  }

  App.register("config", {
    async render(main) {
      const running = await call("config");
      const file = el("input", { type: "file", id: "config-file", accept: ".toml,text/plain" });
      file.addEventListener("change", async () => {
        if (file.files[0]) document.getElementById("config-text").value = await file.files[0].text();
      });
      main.replaceChildren(el("h1", {}, "Configuration"),
        el("p", { class: "hint" }, "The running configuration" + (running.path ? " (" + running.path + ")" : " (the built-in default)") +
          ". Edit it or load a file, look at the difference, then apply: the whole file is validated first and nothing is changed unless all of it can be."),
        el("label", { for: "config-text" }, "Configuration (TOML)"),
        el("textarea", { id: "config-text", spellcheck: "false" }, running.toml),
        el("div", { class: "toolbar" },
          el("label", { for: "config-file" }, "Load a file: "), file,
          el("button", { type: "button", id: "config-diff-button", class: "quiet", onclick: async () => {
            showError(null);
            try { showChanges(await diff(document.getElementById("config-text").value)); } catch (e) { showError(e); }
          } }, "Show difference"),
          el("button", { type: "button", id: "config-apply", onclick: apply }, "Apply"),
          el("button", { type: "button", class: "quiet", onclick: () => App.show() }, "Reload running")),
        el("p", { class: "error", id: "config-error", role: "alert" }),
        el("p", { class: "good", id: "config-applied", role: "status" }),
        el("h2", {}, "Difference from the running configuration"),
        el("pre", { class: "diff", id: "config-diff" }, "Press “Show difference”."));
    },
  });
})();
