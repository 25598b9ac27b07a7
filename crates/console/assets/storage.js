// The storage page: pools and their volumes, then the device graph as a
// tree with each node's state, and the actions taken there.
"use strict";
(() => {
  const { call, el, table, act, bytes } = App;

  function volumeRows(pool, volumes) {
    const byParent = new Map();
    for (const v of volumes) {
      const key = v.parent || "";
      if (!byParent.has(key)) byParent.set(key, []);
      byParent.get(key).push(v);
    }
    const rows = [];
    const walk = (parent, depth) => {
      for (const v of byParent.get(parent) || []) {
        const at = { pool, volume: v.name };
        rows.push(el("tr", { "data-volume": v.name },
          el("td", {}, "\u00a0\u00a0".repeat(depth) + (depth ? "└ " : "") + v.name),
          el("td", {}, v.kind), el("td", { class: "num" }, bytes(v.size)), el("td", { class: "num" }, bytes(v.own)),
          el("td", {}, v.device || ""),
          el("td", {},
            el("button", { type: "button", class: "small", "data-action": "snapshot", onclick: () => act("Snapshot " + v.name,
              "Take a snapshot of " + pool + "/" + v.name + ".", [{ name: "name", label: "Snapshot name", value: v.name + "-snap" }],
              f => call("volumeSnapshot", at, { name: f.name })) }, "Snapshot"),
            el("button", { type: "button", class: "small", "data-action": "clone", onclick: () => act("Clone " + v.name,
              "Make a writable clone of " + pool + "/" + v.name + ".", [{ name: "name", label: "Clone name", value: v.name + "-clone" }],
              f => call("volumeClone", at, { name: f.name })) }, "Clone"))));
        walk(v.name, depth + 1);
      }
    };
    walk("", 0);
    return rows;
  }

  function poolSection(pool, volumes) {
    const percent = pool.size ? (100 * pool.used / pool.size) : 0;
    return el("section", { class: "pool", "data-pool": pool.name },
      el("h3", {}, "Pool " + pool.name),
      el("p", {},
        el("progress", { max: 100, value: percent, "aria-label": "pool " + pool.name + " used" }),
        ` used ${bytes(pool.used)} of ${bytes(pool.size)} (${percent.toFixed(1)} %), provisioned ${bytes(pool.provisioned)}, ` +
        (pool.soft_threshold ? `soft threshold ${pool.soft_threshold}` : "no soft threshold") +
        (pool.soft_threshold_reached ? " (reached)" : "")),
      table(["volume", "kind", "size ", "own ", "device", "actions"], volumeRows(pool.name, volumes)));
  }

  // The actions each kind of node offers.
  function actions(node, siblings) {
    const name = node.name, buttons = [];
    const button = (label, action, run) => buttons.push(el("button", { type: "button", class: "small", "data-action": action, onclick: run }, label));
    if (node.kind === "raid") {
      const members = (node.settings.members || "").split(",").map(s => s.trim()).filter(Boolean);
      button("Scrub", "scrub", () => act("Scrub " + name, "Read every stripe of " + name + " and check its parity.", [],
        () => call("raidScrub", { array: name }, {})));
      button("Fail a member", "fail", () => act("Fail a member of " + name,
        "The member is marked failed: the array runs degraded until a spare is rebuilt.", [{ name: "member", label: "Member", options: members }],
        f => call("raidFail", { array: name }, { member: f.member })));
      button("Replace a member", "replace", () => act("Replace a member of " + name,
        "The new device is copied beside the member and takes its place when complete.",
        [{ name: "member", label: "Member", options: members }, { name: "device", label: "New device", options: siblings }],
        f => call("raidReplace", { array: name }, { member: f.member, device: f.device })));
      button("Add a spare", "add", () => act("Add a spare to " + name,
        "The device becomes a hot spare; a degraded array starts rebuilding onto it.", [{ name: "device", label: "Device", options: siblings }],
        f => call("raidAdd", { array: name }, { device: f.device })));
    }
    if (node.kind === "cache") {
      button("Flush", "flush", () => act("Flush " + name, "Write every dirty block of " + name + " to its slow device.", [],
        () => call("cacheFlush", { cache: name }, {})));
    }
    if (node.kind === "faulty") {
      button("Fail", "device-fail", () => act("Fail " + name, name + " fails every read and write from now until healed.", [],
        () => call("deviceFault", { faulty: name }, { fault: "fail" })));
      button("Heal", "device-heal", () => act("Heal " + name, name + " serves again.", [],
        () => call("deviceFault", { faulty: name }, { fault: "heal" })));
    }
    return buttons;
  }

  function nodeView(node, unused) {
    const state = Object.entries(node.state || {});
    const sync = node.state && node.state.sync;
    const percent = sync ? parseFloat((sync.match(/([\d.]+)%/) || [0, 0])[1]) : null;
    const bad = state.some(([k, v]) => /degraded|failed|rebuild|missing|error/.test(k + " " + v) && !/nothing|^0$/.test(v));
    return el("li", {},
      el("div", { class: "node", "data-device": node.name },
        el("span", { class: "name" }, node.name), el("span", { class: "kind" }, node.kind + (node.size ? ", " + bytes(node.size) : "")),
        node.open ? null : el("span", { class: "bad" }, " not open"),
        state.length ? el("dl", { class: bad ? "warn" : null }, state.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-state": k }, v)])) : null,
        sync ? el("p", {}, el("progress", { max: 100, value: percent, "aria-label": node.name + " " + sync }), " " + sync) : null,
        el("div", {}, actions(node, unused))),
      node.children.length ? el("ul", {}, node.children.map(c => nodeView(c, unused))) : null);
  }

  App.register("storage", {
    refresh: 2000,
    async render(main) {
      const [pools, volumes, objects] = await Promise.all([
        call("pools"), call("volumes"), call("objects")]);
      const trees = await Promise.all(objects.devices.map(d => call("device", { device: d.name })));
      const below = new Set();
      const mark = n => n.children.forEach(c => { below.add(c.name); mark(c); });
      trees.forEach(mark);
      const roots = trees.filter(t => !below.has(t.name));
      const served = new Set(objects.targets.flatMap(t => t.luns.concat(t.groups.flatMap(g => g.luns)).map(l => l.device))
        .concat(objects.nbd ? objects.nbd.exports.map(x => x.device) : []));
      const unused = roots.filter(t => !served.has(t.name)).map(t => t.name);
      main.replaceChildren(el("h1", {}, "Storage"),
        el("h2", {}, "Pools"),
        ...(pools.pools.length ? pools.pools.map(p => poolSection(p, volumes.volumes.filter(v => v.pool === p.name)))
          : [el("p", { class: "muted" }, "No pools.")]),
        el("h2", {}, "Devices"),
        el("p", { class: "hint" }, "Each device with what it is built on; RAID members, caches and RBD images show their state."),
        el("div", { class: "tree", id: "device-tree" }, el("ul", {}, roots.map(r => nodeView(r, unused)))));
    },
  });
})();
