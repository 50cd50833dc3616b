// conveyor dashboard: plain JavaScript and SVG, served by the admin interface.
// No build step, no framework, no request to any other host. Pages (by the URL hash):
//   #/                      overview: instance, journal, charts, queues, clients, replication
//   #/queue/NAME            one queue: charts, subscribers, messages with state, holder, deadline
//   #/queue/NAME/filter/F   the same, listing only the messages whose body matches content filter F
//   #/explain/NAME/BOOKMARK why one message is or is not being delivered
// Everything is rebuilt from the admin API every REFRESH_MS (not while a form field with
// text in it has the focus, so typing is never wiped out); text is always set with
// textContent (never innerHTML), so no value from the server is interpreted as markup.
"use strict";

const REFRESH_MS = 2000;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
let timer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

async function api(path) {
  const resp = await fetch(path, { cache: "no-store" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.message || body.error || resp.statusText);
  return body;
}

const fmt = {
  n: (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US", { maximumFractionDigits: 1 })),
  s(v) {
    if (v === null || v === undefined) return "–";
    if (v < 120) return v.toFixed(1) + " s";
    if (v < 7200) return (v / 60).toFixed(1) + " min";
    return (v / 3600).toFixed(1) + " h";
  },
  // Bytes, rounded: "120 B", "1.5 KiB", "512 KiB" (a mean is a float: never its 16 digits).
  b(v) {
    if (v === null || v === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 || Math.abs(v) >= 100 ? Math.round(v).toString() : v.toFixed(1)) + " " + units[i];
  },
  // A configured duration, exact: the largest unit it is a whole number of ("30 s", "5 min", "1 h", "1 d").
  dur(v) {
    if (v === null || v === undefined) return "–";
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
      if (v >= size && v % size === 0) return `${v / size} ${unit}`;
    }
    return Number(v).toLocaleString("en-US", { maximumFractionDigits: 3 }) + " s";
  },
  t: (v) => (v ? new Date(v * 1000).toLocaleTimeString() : "–"),
  ms: (v) => (v === null || v === undefined ? "–" : (v * 1000).toFixed(2) + " ms"),
};

function card(k, v, small, cls) {
  return h("div", { class: "card" }, h("div", { class: "k" }, k), h("div", { class: (small ? "v small" : "v") + (cls ? " " + cls : "") }, v));
}

// A path that wraps only after a slash, never inside a name (not even at a hyphen):
// each "name/" is one unbreakable span, with a <wbr> between them.
function pathText(p) {
  const out = [];
  for (const part of p.split(/(?<=\/)/)) out.push(h("span", { class: "seg" }, part), h("wbr"));
  out.pop();
  return out;
}

// A queue's effective settings (the admin JSON's `settings`, defaults included), and what
// each one's null means.
const SETTINGS = [
  ["Semantics"], ["FairnessModel"], ["Leasing"],
  ["LeasePeriod", "infinite", "dur"], ["Expiration", "never", "dur"], ["DeferredAckExpiration", "never", "dur"],
  ["MaxBacklog", "unlimited"], ["MaxPerSubscriptionBacklog", "unlimited"], ["TargetQueueDepth", "none"],
  ["MaxCancels", "unlimited"], ["MaxDeliveries", "unlimited"],
  ["Priority", "none"], ["BarrierExpression", "none"], ["Filter", "none"],
  ["UnderlyingTopic"], ["DefaultPublishTarget", "none"], ["RecoveryPoint", "epoch"], ["FileBackedMetadata"],
  ["RetryBackoff", "none", "durs"], ["OrderingKey", "none"], ["MaxInFlightPerKey", "none"],
];

function settingsList(settings) {
  const known = new Set(SETTINGS.map(([k]) => k));
  const rows = SETTINGS.filter(([k]) => k in settings).concat(Object.keys(settings).filter((k) => !known.has(k)).map((k) => [k]));
  return h("dl", { class: "settings" }, rows.map(([k, none, kind]) => {
    const v = settings[k];
    const text = v === null || v === undefined ? (none || "none")
      : typeof v === "boolean" ? (v ? "enabled" : "disabled")
      : kind === "dur" ? fmt.dur(v) : kind === "durs" ? v.map(fmt.dur).join(", ")
      : typeof v === "number" ? fmt.n(v) : String(v);
    return h("div", { "data-setting": k }, h("dt", {}, k), h("dd", { class: v === null ? "muted" : "" }, text));
  }));
}

function table(headers, rows, numeric) {
  numeric = numeric || [];
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((x, i) => h("th", { class: numeric.includes(i) ? "n" : "" }, x)))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c, i) => h("td", { class: numeric.includes(i) ? "n" : "" }, c ?? "–"))))
      : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none"))));
}

// A line chart of one or more series over the sample times, drawn in SVG.
function chart(title, t, series) {
  const W = 600, H = 170, L = 48, R = 10, T = 10, B = 22;
  const el = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", "data-title": title });
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  max = max > 0 ? max * 1.1 : 1.1;
  const t0 = t.length ? t[0] : 0, t1 = t.length > 1 ? t[t.length - 1] : t0 + 1;
  const x = (tv) => L + ((tv - t0) / (t1 - t0 || 1)) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  el.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  el.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const frac of [0, 0.5, 1]) {
    const lab = svg("text", { x: L - 4, y: y(max * frac / 1.1) + 4, "text-anchor": "end" });
    lab.textContent = fmt.n(max * frac / 1.1);
    el.append(lab);
  }
  const span = svg("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  span.textContent = t.length > 1 ? `last ${fmt.s(t1 - t0)}` : "collecting…";
  el.append(span);
  series.forEach((s, i) => {
    const pts = [];
    s.values.forEach((v, k) => { if (v !== null && k < t.length) pts.push(`${x(t[k]).toFixed(1)},${y(v).toFixed(1)}`); });
    if (pts.length) el.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2, "data-series": s.name }));
  });
  const legend = h("div", { class: "legend" }, series.map((s, i) => h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }),
    `${s.name} ${fmt.n(s.values.length ? s.values[s.values.length - 1] : null)}`)));
  return h("div", { class: "panel" }, h("h2", {}, title), el, legend);
}

// Per-second rates from a cumulative counter series.
function rate(t, values) {
  return values.map((v, i) => (i === 0 ? null : Math.max(0, (v - values[i - 1]) / ((t[i] - t[i - 1]) || 1))));
}

function queueLink(name) { return h("a", { href: "#/queue/" + encodeURIComponent(name) }, name); }

function setState(tree) {
  document.getElementById("instance-name").textContent = `${tree.name} · ${tree.version}`;
  const st = document.getElementById("state");
  st.textContent = tree.failed ? "failed" : tree.ready ? "ready" : "starting";
  st.className = "pill " + (tree.failed ? "bad" : tree.ready ? "ok" : "warn");
}

async function overview(app) {
  const [tree, hist] = await Promise.all([api("/amps/instance"), api("/api/history")]);
  setState(tree);
  const j = tree.journal;
  const queues = Object.values(tree.queues);
  const total = (k) => queues.reduce((a, q) => a + q[k], 0);
  const names = Object.keys(hist.queues);
  const sum = (field) => hist.t.map((_, k) => names.reduce((a, n) => a + hist.queues[n][field][k], 0));
  app.replaceChildren(
    h("div", { class: "cards", id: "overview-cards" },
      card("uptime", fmt.s(tree.uptime)), card("clients", fmt.n(tree.client_count)),
      card("subscriptions", fmt.n(tree.subscriptions.length)), card("queues", fmt.n(queues.length)),
      card("messages queued", fmt.n(total("queue_depth"))), card("in flight", fmt.n(total("in_flight"))),
      card("journal", j.in_memory ? "in memory" : fmt.b(j.bytes) + (j.segments ? ` · ${j.segments} seg` : "")),
      card("durable position", fmt.n(j.durable_end)),
      card("commit latency (mean / max)", `${fmt.ms(j.commit_seconds_mean)} / ${fmt.ms(j.commit_seconds_max)}`, true),
      card("group commit (mean)", j.commit_records_mean === null ? "–" : `${fmt.n(j.commit_records_mean)} rec · ${fmt.b(j.commit_bytes_mean)}`, true),
      card("journal directory", j.directory ? pathText(j.directory) : "–", true, "path")),
    h("div", { class: "grid2" },
      chart("Queue depth (deepest queues)", hist.t, names.map((n) => ({ name: n, values: hist.queues[n].queue_depth }))),
      chart("In flight (leased or awaiting ack)", hist.t, names.map((n) => ({ name: n, values: hist.queues[n].in_flight }))),
      chart("Rates, messages/s (these queues)", hist.t, [
        { name: "enqueued", values: rate(hist.t, sum("enqueued")) },
        { name: "delivered", values: rate(hist.t, sum("delivered")) },
        { name: "acknowledged", values: rate(hist.t, sum("acknowledged")) }]),
      chart("Journal, records/s", hist.t, [{ name: "records", values: rate(hist.t, hist.instance.journal_records) }])),
    h("div", { class: "panel", id: "queues" }, h("h2", {}, "Queues"),
      table(["queue", "depth", "available", "in flight", "consumers", "inactive", "oldest", "enqueued", "delivered", "acked", "expired"],
        queues.sort((a, b) => b.queue_depth - a.queue_depth).map((q) => [queueLink(q.name), fmt.n(q.queue_depth), fmt.n(q.available),
          fmt.n(q.in_flight), fmt.n(q.consumers), fmt.n(q.inactive_message_count), fmt.s(q.seconds_behind),
          fmt.n(q.enqueued), fmt.n(q.delivered), fmt.n(q.acknowledged), fmt.n(q.expired)]), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])),
    h("div", { class: "panel", id: "clients" }, h("h2", {}, "Clients"),
      table(["id", "name", "user", "address", "connected", "subs", "msgs in", "msgs out", "unsent"],
        Object.values(tree.clients).map((c) => [c.id, c.name, c.user, c.address, fmt.s(c.connected_for), c.subscriptions,
          fmt.n(c.messages_in), fmt.n(c.messages_out), fmt.b(c.unsent_bytes)]), [0, 5, 6, 7, 8])),
    h("div", { class: "panel", id: "subscriptions" }, h("h2", {}, "Subscriptions"),
      table(["client", "id", "topic", "kind", "filter", "outstanding / backlog"],
        tree.subscriptions.map((s) => [s.client, s.sub_id, s.topic, s.kind, s.filter,
          s.kind === "queue" ? `${s.outstanding} / ${s.max_backlog}` : s.kind === "replay" ? (s.replaying ? "replaying" : "live") : ""]))),
    h("div", { class: "panel", id: "replication" }, h("h2", {}, "Replication"),
      table(["destination", "state", "sync", "behind", "behind (s)", "sent", "last error"],
        tree.replication.outgoing.map((l) => [l.destination, l.state, l.sync ? (l.downgraded ? "sync (downgraded)" : "sync") : "async",
          fmt.b(l.bytes_behind), fmt.s(l.seconds_behind), fmt.n(l.records_sent), l.last_error]), [3, 4, 5]),
      tree.replication.incoming.length ? table(["source", "group", "received through", "received", "recorded", "gaps"],
        tree.replication.incoming.map((l) => [l.source, l.group, fmt.n(l.received_through), fmt.n(l.records_received),
          fmt.n(l.records_recorded), fmt.n(l.gaps)]), [2, 3, 4, 5]) : null));
}

async function queuePage(app, name, filter) {
  const q = encodeURIComponent(name);
  // A browse with a content filter changes nothing; a filter the server cannot compile
  // is its 400, shown above the (then empty) list rather than instead of the page.
  const browse = filter
    ? api(`/api/queues/${q}/details?limit=200&filter=${encodeURIComponent(filter)}`).catch((err) => ({ error: err.message, messages: [] }))
    : null;
  const [tree, stats, details, hist, found] = await Promise.all([api("/api/summary"),
    api(`/api/queues/${q}`), api(`/api/queues/${q}/details?limit=200`), api(`/api/history?queues=${q}`), browse]);
  const listed = found || details;
  const owners = listed.messages.some((m) => m.owner);
  setState(tree);
  const hq = hist.queues[name] || { queue_depth: [], in_flight: [], enqueued: [], delivered: [], acknowledged: [] };
  const now = Date.now() / 1000;
  const input = h("input", { name: "bookmark", placeholder: "bookmark or journal position", "aria-label": "bookmark" });
  const filterInput = h("input", { name: "filter", placeholder: "content filter, e.g. /qty > 10", "aria-label": "content filter" });
  filterInput.value = filter || "";
  app.replaceChildren(
    h("h1", {}, "Queue ", name),
    h("div", { class: "cards", id: "queue-cards" },
      card("depth", fmt.n(stats.queue_depth)), card("available", fmt.n(stats.available)), card("in flight", fmt.n(stats.in_flight)),
      card("consumers", fmt.n(stats.consumers)), card("inactive", fmt.n(stats.inactive_message_count)),
      card("oldest unacked", fmt.s(stats.seconds_behind)), card("oldest lease", fmt.s(stats.age_of_oldest_lease))),
    stats.settings ? h("div", { class: "panel", id: "settings" }, h("h2", {}, "Settings"), settingsList(stats.settings)) : null,
    h("div", { class: "grid2" },
      chart("Depth and in flight", hist.t, [{ name: "depth", values: hq.queue_depth }, { name: "in flight", values: hq.in_flight }]),
      chart("Rates, messages/s", hist.t, [{ name: "enqueued", values: rate(hist.t, hq.enqueued) },
        { name: "delivered", values: rate(hist.t, hq.delivered) }, { name: "acknowledged", values: rate(hist.t, hq.acknowledged) }])),
    h("div", { class: "panel" }, h("h2", {}, "Subscribers"),
      table(["subscriber", "client", "outstanding", "max backlog"],
        details.cursors.map((c) => [c.subscriber, c.client, c.outstanding, c.max_backlog]), [2, 3])),
    h("div", { class: "panel", id: "messages" }, h("h2", {}, "Messages"),
      h("form", { class: "explain", onsubmit: (ev) => { ev.preventDefault(); if (input.value) location.hash = `#/explain/${q}/${encodeURIComponent(input.value)}`; } },
        input, h("button", { type: "submit" }, "Explain")),
      h("form", { class: "explain", id: "browse", onsubmit: (ev) => {
        ev.preventDefault();
        location.hash = `#/queue/${q}` + (filterInput.value ? `/filter/${encodeURIComponent(filterInput.value)}` : "");
      } }, filterInput, h("button", { type: "submit" }, "Filter")),
      found && found.error ? h("p", { class: "error", id: "filter-error" }, "Filter refused: " + found.error) : null,
      filter && !found.error ? h("p", { class: "muted" }, "Messages whose body matches ", h("code", {}, filter), ", leased or available; nothing is changed.") : null,
      table(["bookmark", "state", "holder", ...(owners ? ["owner"] : []), "lease left", "deliveries", "published", ""],
        listed.messages.map((m) => [m.bookmark ?? m.position, m.state, m.holder_client ? `${m.holder_client} (${m.holder})` : m.holder,
          ...(owners ? [m.owner ?? ""] : []),
          m.lease_deadline ? fmt.s(Math.max(0, m.lease_deadline - now)) : m.state === "leased" ? "infinite" : "", m.deliveries, fmt.t(m.published_at),
          h("a", { href: `#/explain/${q}/${encodeURIComponent(m.bookmark ?? m.position)}` }, "explain")]), [owners ? 5 : 4]),
      listed.messages_truncated ? h("p", { class: "muted" }, filter ? "The first 200 matching messages are listed." : "The first 200 available messages are listed.") : null));
}

async function explainPage(app, name, bookmark) {
  const q = encodeURIComponent(name);
  const [tree, e] = await Promise.all([api("/api/summary"), api(`/api/queues/${q}/explain?bookmark=${encodeURIComponent(bookmark)}`)]);
  setState(tree);
  app.replaceChildren(
    h("h1", {}, "Message ", bookmark, " in ", queueLink(name)),
    h("div", { class: "panel", id: "explanation" },
      h("div", { class: "verdict " + e.verdict }, e.verdict.replaceAll("_", " ")),
      h("p", {}, e.summary),
      e.reasons.length ? h("ul", {}, e.reasons.map((r) => h("li", {}, r))) : null,
      h("div", { class: "cards" }, card("state", e.state), card("deliveries", e.deliveries), card("cancels", e.cancels),
        card("published", fmt.t(e.published_at)), card("lease deadline", e.lease_deadline ? fmt.t(e.lease_deadline) : e.state === "leased" ? "none (endless lease)" : "–"),
        card("older messages ahead", fmt.n(e.ahead)))),
    h("div", { class: "panel" }, h("h2", {}, "Subscribers of the queue"),
      table(["subscriber", "client", "filter", "backlog", "verdict", "why"],
        e.subscribers.map((s) => [s.key, s.client, s.filter, `${s.outstanding} / ${s.max_backlog}`, s.verdict.replaceAll("_", " "), s.why]))));
}

async function render() {
  const app = document.getElementById("app");
  const typing = document.activeElement;
  if (typing && typing.tagName === "INPUT" && typing.value && app.contains(typing)) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "queue" && parts[1]) await queuePage(app, parts[1], parts[2] === "filter" ? parts.slice(3).join("/") : "");
    else if (parts[0] === "explain" && parts[1] && parts[2]) await explainPage(app, parts[1], parts.slice(2).join("/"));
    else await overview(app);
    document.body.dataset.loaded = String(Date.now());
  } catch (err) {
    app.replaceChildren(h("p", { class: "error" }, "Cannot load statistics: " + err.message));
    const st = document.getElementById("state");
    st.textContent = "unreachable";
    st.className = "pill bad";
  }
}

function schedule() {
  clearTimeout(timer);
  render().finally(() => { timer = setTimeout(schedule, REFRESH_MS); });
}

window.addEventListener("hashchange", schedule);
schedule();
