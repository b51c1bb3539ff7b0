// The dashboard page: renders each snapshot the agent sends over SSE.
// Plain browser JavaScript, no build step; uPlot draws the charts.

(() => {
  const $ = (id) => document.getElementById(id);
  const MAX_ROWS = 500;
  let snap = null;
  const charts = {};

  const fmtAge = (ms) => {
    if (ms === null || ms === undefined) return "";
    const s = Math.round(ms / 1000);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.round(s / 60)} min`;
    if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  };
  const fmtTime = (ms) => (ms ? new Date(ms).toLocaleString() : "");
  const fmtNum = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString());
  const cell = (text, cls) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  };

  function renderFleet() {
    const now = Date.now();
    const q = $("filter").value.trim().toLowerCase();
    const st = $("state").value;
    const offlineMs = Number($("offline-min").value || 0) * 60000;
    let rows = snap.fleet.filter((p) => (!q || p.name.toLowerCase().includes(q)) && (!st || (st === "open" ? p.state === "open" : p.state !== "open")));
    const by = $("sort").value;
    const cmp = {
      name: (a, b) => a.name.localeCompare(b.name),
      state: (a, b) => a.state.localeCompare(b.state) || a.name.localeCompare(b.name),
      backlog: (a, b) => b.backlog_messages - a.backlog_messages,
      oldest: (a, b) => (a.oldest_unsent_at ?? Infinity) - (b.oldest_unsent_at ?? Infinity),
      seen: (a, b) => (a.last_seen ?? 0) - (b.last_seen ?? 0),
    }[by];
    rows.sort(cmp);
    const total = rows.length;
    rows = rows.slice(0, MAX_ROWS);
    $("fleet-count").textContent = `${snap.fleet.filter((p) => p.state === "open").length} open of ${snap.fleet.length}` + (total > MAX_ROWS ? `, showing ${MAX_ROWS} of ${total}` : "");
    const body = document.createElement("tbody");
    for (const p of rows) {
      const tr = document.createElement("tr");
      tr.dataset.peer = p.name;
      tr.dataset.state = p.state;
      if (p.state !== "open" && offlineMs > 0 && p.last_seen && now - p.last_seen > offlineMs) tr.classList.add("long-offline");
      tr.append(
        cell(p.name),
        cell(p.kind),
        cell(p.state, "state"),
        cell(fmtTime(p.since)),
        cell(p.state === "open" ? "now" : p.last_seen ? `${fmtAge(now - p.last_seen)} ago` : "never"),
        cell(p.rtt_ms === null ? "" : String(p.rtt_ms), "num"),
        cell(fmtNum(p.connects), "num"),
        cell(fmtNum(p.backlog_messages), "num"),
        cell(fmtNum(p.backlog_bytes), "num"),
        cell(p.oldest_unsent_at === null ? "" : fmtAge(now - p.oldest_unsent_at), "num"),
        cell(p.cert_not_after ? new Date(p.cert_not_after).toISOString().slice(0, 10) : ""),
        cell(p.last_error ?? ""),
      );
      body.append(tr);
    }
    $("fleet").replaceChild(body, $("fleet").tBodies[0]);
  }

  function renderChannels() {
    const body = document.createElement("tbody");
    for (const c of snap.channels) {
      const tr = document.createElement("tr");
      tr.dataset.channel = c.channel;
      tr.append(
        cell(c.channel),
        cell(fmtNum(c.messages), "num"),
        cell(fmtNum(c.bytes), "num"),
        cell(c.publish_per_s.toFixed(1), "num"),
        cell(c.delivery_per_s.toFixed(1), "num"),
        cell(c.subscribers.map((s) => `${s.name} (${s.lag})`).join(", ")),
      );
      body.append(tr);
    }
    $("channels").replaceChild(body, $("channels").tBodies[0]);
  }

  function chart(id, title, series, unit) {
    const h = snap.history;
    const data = [h.map((p) => p.t), ...series.map(([key]) => h.map((p) => p[key]))];
    const el = $(id);
    el.dataset.points = String(h.length);
    if (!charts[id]) {
      const colors = ["#2563eb", "#dc2626", "#16a34a"];
      charts[id] = new uPlot(
        {
          title,
          width: Math.max(360, el.clientWidth || 420),
          height: 200,
          series: [{}, ...series.map(([, label], i) => ({ label, stroke: colors[i], width: 1.5, spanGaps: true }))],
          // Always the last hour, however few points there are yet.
          scales: { x: { time: true, range: () => [Date.now() / 1000 - 3600, Date.now() / 1000] } },
          axes: [{}, { label: unit }],
        },
        data,
        el,
      );
    } else charts[id].setData(data);
  }

  function renderCharts() {
    chart("chart-ingest", "Ingest", [["ingest_per_s", "messages/s"]], "msg/s");
    chart(
      "chart-disk",
      "Publish to disk",
      [
        ["disk_p50_ms", "p50"],
        ["disk_p99_ms", "p99"],
      ],
      "ms",
    );
    chart(
      "chart-handler",
      "Publish to handler",
      [
        ["handler_p50_ms", "p50"],
        ["handler_p99_ms", "p99"],
      ],
      "ms",
    );
    chart(
      "chart-fsync",
      "fsync",
      [
        ["fsync_p50_ms", "p50"],
        ["fsync_p99_ms", "p99"],
      ],
      "ms",
    );
  }

  function renderAudit() {
    const sel = $("audit-event");
    const kinds = [...new Set(snap.audit.map((e) => e.event))].sort();
    for (const k of kinds) if (![...sel.options].some((o) => o.value === k)) sel.append(new Option(k, k));
    const want = sel.value;
    const q = $("audit-filter").value.trim().toLowerCase();
    const list = document.createElement("ul");
    list.id = "audit";
    for (const e of [...snap.audit].reverse()) {
      const line = JSON.stringify(e);
      if ((want && e.event !== want) || (q && !line.toLowerCase().includes(q))) continue;
      const li = document.createElement("li");
      li.textContent = line;
      list.append(li);
      if (list.children.length >= 100) break;
    }
    $("audit").replaceWith(list);
  }

  function render() {
    if (!snap) return;
    const t0 = performance.now();
    const a = snap.agent;
    $("name").textContent = a.name;
    $("about").textContent = `${a.role}, keyop ${a.version}, up ${fmtAge(a.uptime_s * 1000)}, sync ${a.sync}`;
    if ($("offline-min").value === "") $("offline-min").value = String(Math.round(a.offline_after_ms / 60000));
    renderFleet();
    renderChannels();
    renderCharts();
    renderAudit();
    // How long the last render took (ms), for the 5,000-peer measurement (bench/dashboard.ts).
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(1);
  }

  for (const id of ["filter", "state", "sort", "offline-min", "audit-event", "audit-filter"]) $(id).addEventListener("input", render);
  // The whole snapshot first, then what changed: rows by name, and the chart points when there are new ones.
  let rows = new Map();
  const live = () => ($("live").textContent = `live, ${new Date().toLocaleTimeString()}`);
  const es = new EventSource("/api/events");
  es.addEventListener("snapshot", (ev) => {
    snap = JSON.parse(ev.data);
    rows = new Map(snap.fleet.map((r) => [r.name, r]));
    live();
    render();
  });
  es.addEventListener("update", (ev) => {
    if (!snap) return;
    const u = JSON.parse(ev.data);
    for (const r of u.fleet_changed) rows.set(r.name, r);
    for (const name of u.fleet_removed) rows.delete(name);
    snap = { ...snap, agent: u.agent, channels: u.channels, audit: u.audit, history: u.history ?? snap.history, fleet: [...rows.values()] };
    live();
    render();
  });
  es.onerror = () => ($("live").textContent = "reconnecting…");
})();
