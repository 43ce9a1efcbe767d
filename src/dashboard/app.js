// The raftq dashboard: polls GET /v1/cluster and GET /v1/report on the node that served the
// page, renders them as tables, and keeps the last minutes of samples for the charts.
// No dependencies and no build step; every value is written with textContent.
"use strict";

const TOKEN_KEY = "raftq-token";
const HISTORY_MS = 5 * 60 * 1000;
const PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];

// Options come in the fragment, which never reaches a server: #token=…&interval=2000
const params = new URLSearchParams(location.hash.slice(1));
if (params.has("token")) {
  sessionStorage.setItem(TOKEN_KEY, params.get("token"));
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}
const INTERVAL_MS = Math.min(60000, Math.max(250, Number(params.get("interval")) || 2000));

/** Samples of the last minutes: {t, cluster, report}, oldest first. */
const samples = [];
let timer = null;

const $ = (id) => document.getElementById(id);

function fmt(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "–";
}

function fmtRate(n) {
  if (typeof n !== "number" || !isFinite(n)) return "–";
  return n >= 100 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1);
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

/** A cell; `check` names the value for tests and scrapers (data-check). */
function cell(text, check, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (check) td.setAttribute("data-check", check);
  if (cls) td.className = cls;
  return td;
}

function setCheck(key, text) {
  const el = document.querySelector(`[data-check="${key}"]`);
  if (el) el.textContent = text;
}

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function getJson(path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { headers, cache: "no-store", redirect: "error" });
  const text = await resp.text();
  let body = null;
  try { body = JSON.parse(text); } catch (_) { /* reported below */ }
  if (!resp.ok) {
    const what = body && body.title
      ? `${resp.status} ${body.title}${body.detail ? ": " + body.detail : ""}`
      : `${resp.status} ${resp.statusText}`;
    throw new HttpError(resp.status, `${path}: ${what}`);
  }
  if (body === null) throw new HttpError(resp.status, `${path}: not JSON`);
  return body;
}

function showLogin(message) {
  $("login").hidden = false;
  $("main").hidden = true;
  setStatus(message, true);
  setHealth("no access", "bad");
}

function setStatus(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.className = isError ? "error" : "muted";
}

function setHealth(text, kind) {
  const h = $("health");
  h.textContent = text;
  h.className = "badge " + kind;
}

async function poll() {
  timer = null;
  try {
    const [cluster, report] = await Promise.all([getJson("/v1/cluster"), getJson("/v1/report")]);
    const t = Date.now();
    samples.push({ t, cluster, report });
    while (samples.length > 2 && samples[0].t < t - HISTORY_MS) samples.shift();
    $("login").hidden = true;
    $("main").hidden = false;
    render(cluster, report);
    setStatus(`updated ${new Date(t).toLocaleTimeString()} · every ${INTERVAL_MS / 1000} s`, false);
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      showLogin(e.message);
      return; // resumes when a token is entered
    }
    setStatus(`cannot reach this node: ${e.message}`, true);
    setHealth("unreachable", "bad");
  }
  timer = setTimeout(poll, INTERVAL_MS);
}

/** Per-second rate of a counter between the last two samples; null with fewer than two. */
function rate(get) {
  if (samples.length < 2) return null;
  const a = samples[samples.length - 2];
  const b = samples[samples.length - 1];
  const va = get(a.report);
  const vb = get(b.report);
  if (typeof va !== "number" || typeof vb !== "number" || b.t <= a.t) return null;
  return Math.max(0, vb - va) / ((b.t - a.t) / 1000);
}

function render(cluster, report) {
  const leader = cluster.leader_id;
  const here = cluster.node_id;
  setCheck("cluster/node_id", String(here));
  setCheck("cluster/leader_id", leader == null ? "none" : String(leader));
  setCheck("cluster/term", fmt(cluster.term));
  setCheck("cluster/commit_index", fmt(cluster.commit_index));
  setCheck("cluster/last_applied", fmt(cluster.last_applied));
  setCheck("cluster/snapshot_index", cluster.snapshot ? fmt(cluster.snapshot.index) : "none");
  setCheck("cluster/snapshot_bytes", cluster.snapshot ? fmtBytes(cluster.snapshot.bytes) : "–");

  if (leader == null) setHealth("no leader", "bad");
  else if (cluster.last_applied + 1000 < cluster.commit_index) setHealth("catching up", "warn");
  else setHealth(leader === here ? "healthy · leader" : `healthy · follower of ${leader}`, "ok");

  const members = $("members");
  members.replaceChildren();
  for (const m of cluster.members) {
    const tr = document.createElement("tr");
    const role = m.id === leader ? "leader" : m.voter ? "follower" : "learner";
    const lag = m.matched_index == null ? null : Math.max(0, cluster.commit_index - m.matched_index);
    tr.append(
      cell(String(m.id) + (m.id === here ? " (this node)" : ""), `member/${m.id}/id`),
      cell(m.url, null, "text"),
      cell(role, `member/${m.id}/role`),
      cell(m.matched_index == null ? "–" : fmt(m.matched_index), `member/${m.id}/matched_index`),
      cell(lag == null ? "–" : fmt(lag), `member/${m.id}/lag`),
    );
    members.append(tr);
  }
  const note = $("members-note");
  note.replaceChildren();
  if (leader !== here && cluster.leader_url) {
    note.append("Replication progress is known to the leader only: ");
    const a = document.createElement("a");
    a.href = cluster.leader_url.replace(/\/+$/, "") + "/";
    a.textContent = "open the leader's dashboard";
    note.append(a, ".");
  }

  const topics = $("topics");
  topics.replaceChildren();
  const subs = $("subscriptions");
  subs.replaceChildren();
  for (const [name, t] of Object.entries(report.topics)) {
    const tr = document.createElement("tr");
    const d = t.discarded || {};
    tr.append(
      cell(name, `topic/${name}/name`, "text"),
      cell(fmt(t.records), `topic/${name}/records`),
      cell(fmt(t.published), `topic/${name}/published`),
      cell(fmtRate(rate((r) => r.topics[name] && r.topics[name].published)), `topic/${name}/published_per_s`),
      cell(fmt(t.deduplicated), `topic/${name}/deduplicated`),
      cell(`${fmt(d.retention)} / ${fmt(d.max_deliveries)} / ${fmt(d.rejected)}`, `topic/${name}/discarded`),
    );
    topics.append(tr);
    for (const [sub, s] of Object.entries(t.subscriptions)) {
      const key = `sub/${name}/${sub}`;
      const row = document.createElement("tr");
      const acked = (r) => r.topics[name] && r.topics[name].subscriptions[sub] && r.topics[name].subscriptions[sub].acked;
      row.append(
        cell(name, null, "text"),
        cell(sub, `${key}/name`, "text"),
        cell(fmt(s.backlog), `${key}/backlog`),
        cell(fmt(s.in_flight), `${key}/in_flight`),
        cell(fmt(s.cursor), `${key}/cursor`),
        cell(fmt(s.delivered), `${key}/delivered`),
        cell(fmt(s.acked), `${key}/acked`),
        cell(fmtRate(rate(acked)), `${key}/acked_per_s`),
        cell(fmt(s.redelivered), `${key}/redelivered`),
        cell(fmt(s.expired_leases), `${key}/expired_leases`),
        cell(fmt(s.dead_lettered), `${key}/dead_lettered`),
      );
      subs.append(row);
    }
  }
  if (!topics.children.length) {
    const tr = document.createElement("tr");
    const td = cell("no topics yet", null, "text");
    td.colSpan = 6;
    tr.append(td);
    topics.append(tr);
  }

  drawCharts();
}

/** Series of per-second rates of a counter, one point per pair of consecutive samples. */
function rateSeries(get) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    const va = get(a.report);
    const vb = get(b.report);
    if (typeof va === "number" && typeof vb === "number" && b.t > a.t) {
      out.push({ t: b.t, v: Math.max(0, vb - va) / ((b.t - a.t) / 1000) });
    }
  }
  return out;
}

function gaugeSeries(get) {
  const out = [];
  for (const s of samples) {
    const v = get(s.report);
    if (typeof v === "number") out.push({ t: s.t, v });
  }
  return out;
}

function drawCharts() {
  const last = samples[samples.length - 1].report;
  const published = new Map();
  const acked = new Map();
  const backlog = new Map();
  const inFlight = new Map();
  for (const [name, t] of Object.entries(last.topics)) {
    published.set(name, rateSeries((r) => r.topics[name] && r.topics[name].published));
    for (const sub of Object.keys(t.subscriptions)) {
      const label = `${name}/${sub}`;
      const of = (r) => r.topics[name] && r.topics[name].subscriptions[sub];
      acked.set(label, rateSeries((r) => of(r) && of(r).acked));
      backlog.set(label, gaugeSeries((r) => of(r) && of(r).backlog));
      inFlight.set(label, gaugeSeries((r) => of(r) && of(r).in_flight));
    }
  }
  drawChart($("chart-published"), published, "/s");
  drawChart($("chart-acked"), acked, "/s");
  drawChart($("chart-backlog"), backlog, "");
  drawChart($("chart-in-flight"), inFlight, "");
}

/** A round upper bound for the y axis. */
function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function drawChart(canvas, series, unit) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  const pad = { l: 56, r: 10, t: 28, b: 22 };
  const now = Date.now();
  const t0 = now - HISTORY_MS;
  let max = 0;
  let points = 0;
  for (const pts of series.values()) {
    points = Math.max(points, pts.length);
    for (const p of pts) max = Math.max(max, p.v);
  }
  const top = niceMax(max);
  canvas.setAttribute("data-samples", String(points));
  canvas.setAttribute("data-series", [...series.keys()].join(" "));
  canvas.setAttribute("aria-label", `${series.size} series, ${points} samples, max ${fmtRate(max)}${unit}`);

  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#dde1ea";
  ctx.fillStyle = "#6a7285";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = pad.t + ((h - pad.t - pad.b) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(pad.l, y);
    ctx.lineTo(w - pad.r, y);
    ctx.stroke();
    ctx.fillText(String(Number((top * (1 - i / 4)).toPrecision(3))) + unit, pad.l - 6, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let m = 0; m <= 5; m++) {
    const x = pad.l + ((w - pad.l - pad.r) * m) / 5;
    ctx.fillText(m === 5 ? "now" : `-${5 - m}m`, x, h - pad.b + 6);
  }
  if (!series.size) {
    ctx.textBaseline = "middle";
    ctx.fillText("nothing to show yet", w / 2, h / 2);
    return;
  }
  const xOf = (t) => pad.l + ((w - pad.l - pad.r) * (t - t0)) / HISTORY_MS;
  const yOf = (v) => pad.t + (h - pad.t - pad.b) * (1 - v / top);
  let i = 0;
  let legendX = pad.l;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  for (const [name, pts] of series) {
    const color = PALETTE[i % PALETTE.length];
    i += 1;
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach((p, j) => {
      const x = Math.max(pad.l, xOf(p.t));
      if (j === 0) ctx.moveTo(x, yOf(p.v));
      else ctx.lineTo(x, yOf(p.v));
    });
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.fillRect(legendX, 9, 10, 10);
    ctx.fillStyle = "#1d2330";
    ctx.fillText(name, legendX + 14, 14);
    legendX += 24 + ctx.measureText(name).width;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    if (timer === null) poll();
  });
  poll();
});
