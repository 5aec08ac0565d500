// The sparkmq console: a few views over the broker's JSON API (/api/...), no build step.
"use strict";

const app = () => document.getElementById("app");
const POLL_MS = 2000;
let timer = null;
// Which route() drew the page. A page's answers that arrive after the next route() began (the
// user moved on while they were in flight) are dropped, not drawn over the page now shown.
let drawn = 0;
let flash = null;  // an action's outcome, shown on the page it re-renders: {ok, text}
const history = [];  // overview samples: {t, produced, acked, depth}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

async function call(method, path, body) {
  const init = { method, headers: { "X-SparkMQ-Console": "1" }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const doc = await res.json().catch(() => ({ error: res.statusText }));
  // (a refused login stays on its form, with what the user typed)
  if (res.status === 401 && path !== "/api/login") { showLogin(); throw new Error(doc.error); }
  if (!res.ok) throw new Error(doc.error || res.statusText);
  return doc;
}

const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const bytes = (n) => (n === null || n === undefined ? "–" : n > 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : (n / (1 << 20)).toFixed(1) + " MiB");

function card(label, value, id, cls = "") {
  return el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value " + cls, id }, value));
}

function stop() { if (timer) { clearInterval(timer); timer = null; } }

// Refresh the page drawn by route() number ``seq`` every POLL_MS, while it is the one shown.
function every(seq, refresh) {
  if (seq !== drawn) return;
  stop();
  timer = setInterval(() => { if (seq === drawn) refresh().catch(() => {}); }, POLL_MS);
}

// -- login -------------------------------------------------------------------------------------
function showLogin() {
  drawn++;  // (a page still loading must not start refreshing over the form)
  stop();
  const form = document.getElementById("login-form").content.cloneNode(true);
  app().replaceChildren(form);
  document.getElementById("login").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = e.target;
    try {
      await call("POST", "/api/login", { username: f.username.value, password: f.password.value });
      await whoami();
      route();
    } catch (err) {
      document.getElementById("login-error").textContent = err.message;
    }
  });
}

async function whoami() {
  const me = await call("GET", "/api/whoami");
  document.getElementById("who").textContent = me.security ? "signed in as " + me.user : "security off";
  document.getElementById("logout").hidden = !me.security;
  return me;
}

// -- overview ----------------------------------------------------------------------------------
async function overview() {
  const seq = drawn;
  app().replaceChildren(
    el("h1", {}, "Overview"),
    el("div", { class: "cards", id: "status-cards" }),
    el("div", { class: "charts" },
      el("div", {},
        el("h2", {}, "Messages per second"),
        el("div", { class: "legend" }, el("span", { class: "produced" }, "■ produced"), el("span", { class: "acked" }, "■ acked")),
        el("canvas", { id: "rates", width: 560, height: 180 })),
      el("div", {},
        el("h2", {}, "Depth (all destinations)"),
        el("div", { class: "legend" }, el("span", { class: "depth" }, "■ depth")),
        el("canvas", { id: "depth", width: 560, height: 180 }))),
    el("h2", {}, "Destinations"),
    el("table", { id: "dest-table" },
      el("thead", {}, el("tr", {}, ["Name", "Kind", "Depth", "In flight", "Consumers", "Produced", "Produced/s", "Acked", "Dead-lettered", "Delta lag"].map((h, i) => el("th", { class: i > 1 ? "num" : "" }, h)))),
      el("tbody", { id: "dest-rows" })),
  );
  history.length = 0;
  await refreshOverview();
  every(seq, refreshOverview);
}

async function refreshOverview() {
  const doc = await call("GET", "/api/overview");
  const s = doc.status;
  document.getElementById("status-cards").replaceChildren(
    card("Phase", s.phase, "phase"),
    card("Role", s.role + (s.ha_mode !== "none" ? " (" + s.ha_mode + ")" : ""), "role"),
    card("Memory", s.memory_state, "memory-state", "state-" + s.memory_state),
    card("Memory used", bytes(s.memory_used_bytes), "memory-used"),
    card("Disk free", bytes(s.disk_free_bytes), "disk-free", s.disk_low ? "state-red" : ""),
    card("Destinations", fmt(s.destinations), "destination-count"),
    card("Uptime", Math.round(s.uptime_s) + " s", "uptime"),
    card("Version", s.version, "version"),
  );
  const now = Date.now() / 1000;
  const totals = { t: now, produced: 0, acked: 0, depth: 0, by: {} };
  for (const d of doc.destinations) {
    totals.produced += d.produced; totals.acked += d.acked; totals.depth += d.depth;
    totals.by[d.name] = d.produced;
  }
  const prev = history[history.length - 1];
  history.push(totals);
  if (history.length > WINDOW + 1) history.shift();
  const rows = doc.destinations.map((d) => {
    const rate = prev && prev.by[d.name] !== undefined ? (d.produced - prev.by[d.name]) / (now - prev.t) : null;
    return el("tr", { "data-name": d.name },
      el("td", {}, el("a", { href: "#/d/" + encodeURIComponent(d.name), class: "dest-link" }, d.name)),
      el("td", {}, el("span", { class: "tag" }, d.kind)),
      el("td", { class: "num depth" }, fmt(d.depth)),
      el("td", { class: "num in-flight" }, fmt(d.in_flight)),
      el("td", { class: "num consumers" }, fmt(d.consumers)),
      el("td", { class: "num produced" }, fmt(d.produced)),
      el("td", { class: "num rate" }, rate === null ? "–" : rate.toFixed(1)),
      el("td", { class: "num acked" }, fmt(d.acked)),
      el("td", { class: "num dead-lettered" }, fmt(d.dead_lettered)),
      el("td", { class: "num delta-lag" }, fmt(d.delta_lag_messages) + " msgs, " + Math.round(d.delta_lag_ms || 0) + " ms"));
  });
  document.getElementById("dest-rows").replaceChildren(...rows);
  drawChart();
}

const WINDOW = 60;  // samples a chart shows (two minutes at one every two seconds)

function drawChart() {
  const rates = { produced: [], acked: [] }, depth = { depth: [] };
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i], dt = Math.max(b.t - a.t, 1e-3);
    rates.produced.push(Math.max(0, (b.produced - a.produced) / dt));
    rates.acked.push(Math.max(0, (b.acked - a.acked) / dt));
    depth.depth.push(b.depth);
  }
  plot("rates", rates);
  plot("depth", depth);
}

function plot(id, series) {
  const canvas = document.getElementById(id);
  if (!canvas) return;
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 48, top = 8, bottom = 8;
  ctx.clearRect(0, 0, w, h);
  const all = Object.values(series).flat();
  const max = Math.max(1, ...all) * 1.1;
  ctx.strokeStyle = "#dde2ea"; ctx.fillStyle = "#6b7585"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
  for (let g = 0; g <= 4; g++) {
    const y = top + (h - top - bottom) * g / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(Math.round(max * (1 - g / 4)).toLocaleString("en-US"), 2, y + 4);
  }
  const colors = { produced: "#1c7ed6", acked: "#2b8a3e", depth: "#d9480f" };
  for (const [name, all_values] of Object.entries(series)) {
    const values = all_values.slice(-WINDOW);
    ctx.strokeStyle = colors[name]; ctx.lineWidth = 2; ctx.beginPath();
    values.forEach((v, i) => {
      const x = left + (w - left) * (i + WINDOW - values.length) / (WINDOW - 1);
      const y = top + (h - top - bottom) * (1 - v / max);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

// -- one destination ----------------------------------------------------------------------------
async function destination(name) {
  const seq = drawn;
  const base = "/api/destinations/" + encodeURIComponent(name);
  const d = await call("GET", base);
  if (seq !== drawn) return;
  const subs = d.subscriptions ? Object.entries(d.subscriptions) : [];
  const figures = d.kind === "queue" ? d : subs.reduce((acc, [, s]) => {
    for (const k of ["depth", "in_flight", "acked", "redelivered", "dead_lettered", "expired"]) acc[k] = (acc[k] || 0) + s[k];
    acc.oldest_unsettled_age_s = Math.max(acc.oldest_unsettled_age_s || 0, s.oldest_unsettled_age_s || 0);
    return acc;
  }, {});
  const result = el("p", { id: "action-result", class: flash ? (flash.ok ? "ok" : "error") : "" }, flash ? flash.text : "");
  flash = null;
  const done = async (ok, text) => { if (seq === drawn) { flash = { ok, text }; await destination(name); } };
  const isSide = name.startsWith("DLQ.") || name.startsWith("EXP.");
  const moveTarget = el("input", { id: "move-target", placeholder: isSide ? "(where each came from)" : "target destination" });
  const subPick = d.kind === "topic" ? el("input", { id: "subscription", placeholder: "subscription", value: subs.length ? subs[0][0] : "" }) : null;
  const sub = () => (subPick ? subPick.value || null : null);
  app().replaceChildren(
    el("h1", {}, el("span", { class: "tag" }, d.kind), " ", el("span", { id: "dest-name" }, name)),
    el("div", { class: "cards" },
      card("Depth", fmt(figures.depth), "d-depth"),
      card("In flight", fmt(figures.in_flight), "d-in-flight"),
      card("Consumers", fmt(d.consumers), "d-consumers"),
      card("Produced", fmt(d.produced), "d-produced"),
      card("Acked", fmt(figures.acked), "d-acked"),
      card("Redelivered", fmt(figures.redelivered), "d-redelivered"),
      card("Dead-lettered", fmt(figures.dead_lettered), "d-dead-lettered"),
      card("Delta lag", fmt(d.delta_lag_messages) + " msgs", "d-delta-lag"),
      card("Oldest unsettled", (figures.oldest_unsettled_age_s || 0).toFixed(1) + " s", "d-oldest"),
      card("Groups owned", fmt(d.groups_owned ?? subs.reduce((a, [, s]) => a + s.groups_owned, 0)), "d-groups"),
      card("Duplicates", fmt(d.duplicates), "d-duplicates")),
    el("h2", {}, "Actions"),
    el("form", { class: "inline", id: "actions", onsubmit: (e) => e.preventDefault() },
      subPick || "",
      el("button", { type: "button", id: "browse", onclick: () => browse(base, sub()) }, "Browse messages"),
      el("button", { type: "button", class: "danger", id: "purge", onclick: async () => {
        if (!confirm("Purge every waiting message of " + name + "?")) return;
        try { const r = await call("POST", base + "/purge", { subscription: sub() }); await done(true, "purged " + r.purged + " message(s)"); }
        catch (err) { await done(false, err.message); }
      } }, "Purge"),
      moveTarget,
      el("button", { type: "button", id: "move", onclick: async () => {
        try {
          const r = await call("POST", base + "/move", { target: moveTarget.value || null, subscription: sub() });
          await done(true, "moved " + r.moved + " message(s)" + Object.entries(r.targets).map(([k, v]) => " → " + k + ": " + v).join(","));
        } catch (err) { await done(false, err.message); }
      } }, isSide ? "Redrive" : "Move")),
    result,
    el("div", { id: "messages" }),
    el("h2", {}, "Consumers"),
    table("consumers", ["Id", "Subscription", "Prefetch", "In flight", "Selector"], (d.consumer_list || []).map((c) => [c.id, c.subscription, c.prefetch, c.in_flight, c.selector || ""])),
    d.kind === "topic" ? el("h2", {}, "Subscriptions") : "",
    d.kind === "topic" ? table("subscriptions", ["Name", "Depth", "In flight", "Consumers", "Groups", "Acked", "Dead-lettered"], subs.map(([n, s]) => [n, s.depth, s.in_flight, s.consumers, s.groups_owned, s.acked, s.dead_lettered])) : "",
    el("h2", {}, "Settings"),
    table("settings", ["Setting", "Value"], Object.entries(d.settings).map(([k, v]) => [k, JSON.stringify(v)])),
  );
}

function table(id, heads, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.length ? rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c)))) : el("tr", {}, el("td", { colspan: heads.length }, "none"))));
}

async function browse(base, subscription) {
  const q = subscription ? "?limit=50&subscription=" + encodeURIComponent(subscription) : "?limit=50";
  const box = document.getElementById("messages");
  try {
    const rows = await call("GET", base + "/messages" + q);
    box.replaceChildren(el("h2", {}, "Waiting messages (first " + rows.length + ")"),
      table("message-table", ["Offset", "Priority", "Group", "Headers", "Body"], rows.map((m) => [
        m.offset, m.priority, m.group_id || "", Object.entries(m.headers).map(([k, v]) => k + "=" + v).join(", "),
        el("div", { class: "body" }, (m.encoding === "base64" ? "base64: " : "") + m.body + (m.body_truncated ? " …" : ""))])));
  } catch (err) { box.replaceChildren(el("p", { class: "error" }, err.message)); }
}

// -- Kafka groups and transactions ---------------------------------------------------------------
async function kafka() {
  const seq = drawn;
  app().replaceChildren(el("h1", {}, "Kafka groups"), el("div", { id: "kafka-groups" }),
    el("h2", {}, "Kafka transactions"), el("div", { id: "kafka-transactions" }));
  await refreshKafka();
  every(seq, refreshKafka);
}

async function refreshKafka() {
  const [groups, txns] = await Promise.all([
    call("GET", "/api/kafka/groups"), call("GET", "/api/kafka/transactions")]);
  document.getElementById("kafka-groups").replaceChildren(
    table("kafka-table", ["Group", "Kind", "State", "Generation", "Members", "Lag"], groups.map((g) => [
      g.group, g.kind, g.state, String(g.generation), String(g.member_count),
      Object.entries(g.lag).map(([t, n]) => t + ": " + fmt(n)).join(", ") || "–"])));
  // (a user sees its own transactional ids; the broker's admin everyone's, with their user)
  const rows = table("kafka-txn-table",
    ["Transactional id", "User", "State", "Producer", "Epoch", "Open for", "Partitions", "Kept"],
    txns.map((t) => [
      t.transactional_id, t.owner, t.state, String(t.producer_id), String(t.producer_epoch),
      t.open_for_s === null ? "–" : t.open_for_s.toFixed(1) + " s of " + t.timeout_s + " s",
      t.partitions.join(", ") || "–", fmt(t.kept_bytes) + " B"]));
  if (txns.length) rows.querySelectorAll("tbody tr").forEach((tr, i) => tr.setAttribute("data-tid", txns[i].transactional_id));
  document.getElementById("kafka-transactions").replaceChildren(
    txns.length ? rows : el("p", { id: "no-kafka-transactions" }, "No transactional producers."));
}

// -- a cluster's members and who owns what --------------------------------------------------------
async function cluster() {
  const seq = drawn;
  app().replaceChildren(el("h1", {}, "Cluster"), el("div", { id: "cluster" }));
  await refreshCluster();
  every(seq, refreshCluster);
}

async function refreshCluster() {
  const c = await call("GET", "/api/cluster");
  const box = document.getElementById("cluster");
  if (!c.cluster) {
    box.replaceChildren(el("p", { id: "not-a-cluster" }, "This broker is not a cluster member (cluster.zookeeper is empty)."));
    return;
  }
  const members = Object.keys(c.members).sort();
  const placing = new Set(c.placing);
  const pinned = new Set(c.pinned || []);
  const owners = Object.entries(c.owners).sort(([a], [b]) => a.localeCompare(b));
  const pinRow = (name, owner) => {
    const pick = el("select", { class: "pin-to", "aria-label": "pin " + name + " to" },
      el("option", { value: "" }, "unpinned: placement decides"),
      ...members.map((m) => el("option", { value: m }, m)));
    pick.value = pinned.has(name) && members.includes(owner) ? owner : "";
    const go = el("button", { class: "pin" }, "Pin");
    go.addEventListener("click", async () => {
      go.disabled = true;
      try {
        await call("POST", "/api/cluster/pin", { name, member: pick.value || null });
        await refreshCluster();
      } catch (err) { box.prepend(el("p", { class: "error", id: "pin-error" }, err.message)); }
    });
    return el("td", {}, pick, " ", go);
  };
  box.replaceChildren(
    el("div", { class: "cards" },
      card("Member", c.member_id, "cluster-member"),
      card("Session", c.session, "cluster-session", c.session === "connected" ? "" : "state-red"),
      card("Leader", c.leader || "being chosen", "cluster-leader"),
      card("Members", String(members.length), "cluster-members"),
      card("Serving here", String(Object.keys(c.serving).length), "cluster-serving"),
      card("Moves", fmt(c.moves), "cluster-moves")),
    el("h2", {}, "Members"),
    table("member-table", ["Member", "Endpoint", "Kafka", "Host", "PID"], members.map((m) => {
      const d = c.members[m];
      return [m + (m === c.member_id ? " (this one)" : ""), d.endpoint, d.kafka || "–", d.host, String(d.pid)];
    })),
    el("h2", {}, "Who owns what"),
    el("table", { id: "owner-table" },
      el("thead", {}, el("tr", {}, ["Destination", "Owner", "Epoch", "", "Move"].map((h, i) => el("th", { class: i === 2 ? "num" : "" }, h)))),
      el("tbody", {}, ...owners.map(([name, o]) => el("tr", { "data-name": name },
        el("td", {}, name),
        el("td", { class: "owner" }, o.member),
        el("td", { class: "num epoch" }, String(o.epoch)),
        el("td", { class: "placing" }, placing.has(name) ? "being taken on" : pinned.has(name) ? "pinned" : ""),
        pinRow(name, o.member))))),
  );
}

// -- configuration -----------------------------------------------------------------------------
async function config() {
  const seq = drawn;
  const doc = await call("GET", "/api/config");
  if (seq !== drawn) return;
  app().replaceChildren(el("h1", {}, "Configuration"), el("pre", { id: "config" }, JSON.stringify(doc, null, 2)));
}

// -- routing -----------------------------------------------------------------------------------
async function route() {
  const seq = ++drawn;
  stop();
  const hash = location.hash || "#/";
  try {
    if (hash.startsWith("#/d/")) await destination(decodeURIComponent(hash.slice(4)));
    else if (hash === "#/config") await config();
    else if (hash === "#/kafka") await kafka();
    else if (hash === "#/cluster") await cluster();
    else await overview();
  } catch (err) {
    if (seq === drawn && !document.getElementById("login")) app().replaceChildren(el("p", { class: "error", id: "page-error" }, err.message));
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("logout").addEventListener("click", async () => {
    await call("POST", "/api/logout").catch(() => {});
    showLogin();
  });
  try { await whoami(); } catch { return; }
  route();
});
