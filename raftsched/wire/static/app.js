// The raftsched dashboard (part of raftsched, under its licence; no third-party code).
// Data only ever reaches the page through textContent and attributes, never as HTML.
"use strict";

const TOKEN_KEY = "raftsched-token";
const REFRESH_MS = 2000;
const FEED_MAX = 200;
const NEXT_TTL_MS = 30000;   // how long one job's "next fire times" answer is reused
// The page polls this node's state as it is: watching never commits read barriers
// through the Raft log. The health badge says when the node is cut off.
const STALE = "stale=true";

let token = sessionStorage.getItem(TOKEN_KEY);
let role = null;
let timer = null;
let feedAbort = null;
let runsBefore = null;       // the job page's paging cursor (null: the newest page)
let logView = null;          // the run log shown on the job page: {run, stream, seq}
const LOG_CHUNK = 65536;     // bytes of a log shown at first (its end), then followed
const nextCache = new Map(); // job id -> {at, version, data}

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function iso(ms) { return ms == null ? "-" : new Date(ms).toISOString().replace(".000Z", "Z"); }

const zoneFormats = new Map();  // zone -> Intl.DateTimeFormat (built once: they are slow)
const pad2 = (n) => String(n).padStart(2, "0");

// ms as the wall time in zone tz, ISO 8601 with its offset (2026-03-29T02:30:00+02:00),
// as the job page's fire times read: a job's times are all in its schedule's zone.
function zoned(ms, tz) {
  if (ms == null) return "-";
  if (!tz || tz === "UTC") return iso(ms);
  let fmt = zoneFormats.get(tz);
  if (!fmt) {
    try {
      fmt = new Intl.DateTimeFormat("en-US", { timeZone: tz, hourCycle: "h23", year: "numeric",
        month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" });
    } catch (e) { return iso(ms); }  // a zone this browser does not know: UTC, said so
    zoneFormats.set(tz, fmt);
  }
  const p = Object.fromEntries(fmt.formatToParts(ms).map((x) => [x.type, x.value]));
  const wall = Date.UTC(+p.year, +p.month - 1, +p.day, +p.hour, +p.minute, +p.second);
  const off = Math.round((wall - Math.floor(ms / 1000) * 1000) / 60000);
  const sign = off < 0 ? "-" : "+";
  return `${p.year}-${p.month}-${p.day}T${p.hour}:${p.minute}:${p.second}` +
    `${sign}${pad2(Math.floor(Math.abs(off) / 60))}:${pad2(Math.abs(off) % 60)}`;
}

// A timestamp is never broken across lines (a browser breaks after its hyphens): each
// one in a text goes into a nowrap span; the words around it may wrap.
const STAMP = /\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:\d\d)?/g;
function withTimes(text) {
  const out = [];
  let at = 0;
  for (const m of String(text).matchAll(STAMP)) {
    if (m.index > at) out.push(text.slice(at, m.index));
    out.push(el("span", { class: "when" }, m[0]));
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

function span(ms) {
  if (ms == null) return "-";
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(ms)} ms`;
  if (a < 120000) return `${(ms / 1000).toFixed(a < 10000 ? 1 : 0)} s`;
  if (a < 7200000) return `${Math.round(ms / 60000)} min`;
  if (a < 172800000) return `${(ms / 3600000).toFixed(1)} h`;
  return `${Math.round(ms / 86400000)} days`;
}

function rel(ms, now) {
  if (ms == null) return "-";
  const d = ms - now;
  return d >= 0 ? `in ${span(d)}` : `${span(-d)} ago`;
}

function toast(text, isError) {
  const t = $("toast");
  t.textContent = text;
  t.className = isError ? "error" : "ok";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

class ApiError extends Error {
  constructor(status, code, message) { super(`${code}: ${message}`); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(`api/v1/${path}`, {
    method, headers, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (!resp.ok) {
    const err = (data && data.error) || { code: `http_${resp.status}`, message: resp.statusText };
    if (resp.status === 401) logout(err.message);
    throw new ApiError(resp.status, err.code, err.message);
  }
  return data;
}

// ------------------------------------------------------------------ token

function takeTokenFromAddress() {
  const m = /(?:^#|&)token=([0-9a-fA-F]{16,128})/.exec(location.hash);
  if (m) {
    token = m[1];
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search + "#/");
    return true;
  }
  return false;
}

function logout(message) {
  token = null;
  role = null;
  sessionStorage.removeItem(TOKEN_KEY);
  if (feedAbort) feedAbort.abort();
  showLogin(message || "");
}

function showLogin(message) {
  for (const id of ["overview-page", "job-page", "feed-box"]) $(id).hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("login-error").textContent = message;
  $("role").textContent = "";
}

async function start() {
  if (!token) { showLogin(""); return; }
  try {
    role = (await api("GET", "token")).role;
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) showLogin(String(e.message || e));
    return;
  }
  $("login").hidden = true;
  $("logout").hidden = false;
  $("role").textContent = role === "admin" ? "admin" : "read-only";
  document.body.classList.toggle("is-admin", role === "admin");
  $("feed-box").hidden = false;
  startFeed();
  route();
}

// ------------------------------------------------------------------ pages

function route() {
  clearTimeout(timer);
  const m = /^#\/jobs\/(.+)$/.exec(location.hash);
  $("overview-page").hidden = !!m;
  $("job-page").hidden = !m;
  closeLog();
  if (m) { runsBefore = null; refreshJob(decodeURIComponent(m[1])); }
  else refreshOverview();
}

function later(fn) { clearTimeout(timer); timer = setTimeout(fn, REFRESH_MS); }

async function refreshOverview() {
  try {
    const [st, jobs] = await Promise.all([api("GET", "status"), api("GET", `jobs?limit=500&${STALE}`)]);
    renderStatus(st);
    await renderJobs(jobs, st.now_ms || Date.now());
  } catch (e) {
    $("health").textContent = "unreachable";
    $("health").className = "badge down";
    $("summary").textContent = String(e.message || e);
  }
  if (!$("overview-page").hidden && token) later(refreshOverview);
}

function renderStatus(st) {
  $("node-name").textContent = `node ${st.node}`;
  $("health").textContent = st.health;
  $("health").className = `badge ${st.health}`;
  $("summary").textContent = st.summary;
  $("leader").textContent = st.leader || "none";
  $("term").textContent = st.term;
  // The log index applied here vs the commit index (both count every entry; the
  // state machine's own count of commands, st.applied, does not).
  const lag = st.apply_lag != null ? st.apply_lag : null;
  $("lag").textContent = lag == null ? "-" : `${lag} entries`;
  $("jobs-count").textContent = st.jobs;
  $("active-runs").textContent = st.active_runs;
  const http = st.http || {};
  const rows = (st.nodes || []).map((n) => el("tr", { "data-node": n.node_id, class: n.alive && n.connected ? "" : "down" },
    el("td", {}, n.node_id, n.node_id === st.leader ? el("span", { class: "badge leader" }, "leader") : null),
    el("td", { class: "alive" }, n.alive ? "yes" : "no"),
    el("td", {}, n.connected ? "yes" : "no"),
    el("td", {}, n.pid ?? "-"),
    el("td", {}, n.slots ?? "-"),
    el("td", {}, n.inflight ?? "-"),
    el("td", { class: Math.abs(n.skew_ms || 0) > 1000 ? "warn" : "" }, n.skew_ms == null ? "-" : `${n.skew_ms} ms`),
    el("td", {}, n.last_seen_ms == null ? "-" : rel(n.last_seen_ms, st.now_ms)),
    el("td", {}, http[n.node_id] ? el("a", { href: `${st.http_scheme || "http"}://${http[n.node_id]}/` }, http[n.node_id]) : "-")));
  $("members").tBodies[0].replaceChildren(...rows);
  renderBackfills(st.backfills || []);
  renderConcurrency(st.concurrency || []);
}

// Backfills (running and the last finished), each cancellable while it runs.
function renderBackfills(items) {
  $("backfills-box").hidden = items.length === 0;
  const cancel = (bf) => async () => {
    try {
      await api("POST", `backfills/${encodeURIComponent(bf.id)}/cancel`, {});
      toast(`${bf.id}: cancelled`);
    } catch (e) { toast(`${bf.id}: ${e.message}`, true); }
    refreshOverview();
  };
  $("backfills").tBodies[0].replaceChildren(...items.map((bf) => el("tr", { "data-backfill": bf.id, class: bf.state },
    el("td", {}, bf.id),
    el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(bf.job)}` }, bf.job)),
    el("td", { class: "bf-state" }, bf.state + (bf.reason ? ` (${bf.reason})` : "")),
    el("td", { class: "bf-done" }, `${bf.done}/${bf.fire_times}`),
    el("td", {}, `${iso(bf.from_ms)} \u2013 ${iso(bf.to_ms)}`),
    el("td", {}, (bf.active || []).join(", ") || "-"),
    el("td", {}, Object.entries(bf.counts || {}).map(([k, v]) => `${k}=${v}`).join(" ") || "-"),
    el("td", { class: "admin-only" }, bf.state === "running"
      ? el("button", { type: "button", class: "cancel", onclick: cancel(bf) }, "cancel") : ""))));
}

// Each concurrency key: its runs on nodes against its max, and the runs queued for it.
function renderConcurrency(keys) {
  $("concurrency-box").hidden = keys.length === 0;
  $("concurrency").tBodies[0].replaceChildren(...keys.map((k) => el("tr", { "data-key": k.key, class: k.running >= k.max ? "full" : "" },
    el("td", {}, k.key), el("td", { class: "running" }, k.running), el("td", {}, k.max),
    el("td", { class: "queued" }, k.queued), el("td", {}, (k.jobs || []).join(", ")))));
}

async function nextFor(job) {
  const hit = nextCache.get(job.id);
  const now = Date.now();
  // Reused while it still has fire times to show: a 1 s job's answer is stale within
  // seconds (its fires passed), and an empty "later" column for the rest of the TTL
  // read as a job with no future (and made the dashboard test wait 30 s for them).
  const ahead = hit ? hit.data.fires.filter((f) => f.at_ms > (job.next_ms || now)).length : 0;
  if (hit && hit.version === job.version && now - hit.at < NEXT_TTL_MS
      && (ahead >= 2 || hit.data.fires.length < 3)) return hit.data;
  const data = await api("GET", `jobs/${encodeURIComponent(job.id)}/next?count=3&${STALE}`);
  nextCache.set(job.id, { at: now, version: job.version, data });
  return data;
}

function actionButtons(job, onDone) {
  const act = (op, body) => async () => {
    try {
      const r = await api("POST", `jobs/${encodeURIComponent(job.id)}/${op}`, body || {});
      toast(op === "trigger" ? `triggered ${r.run_id}` : `${job.id}: ${op}d`);
    } catch (e) { toast(`${job.id}: ${e.message}`, true); }
    onDone();
  };
  return el("span", { class: "actions" },
    job.paused ? el("button", { type: "button", class: "resume", onclick: act("resume") }, "resume")
      : el("button", { type: "button", class: "pause", onclick: act("pause") }, "pause"),
    el("button", { type: "button", class: "trigger", onclick: act("trigger") }, "trigger"));
}

async function renderJobs(list, now) {
  const jobs = list.jobs || [];
  // The dependency graph as this page shows it: each job's dependents ("then ...").
  const then = new Map();
  for (const j of jobs) for (const parent of j.spec.after || []) then.set(parent, [...(then.get(parent) || []), j.id]);
  const previews = await Promise.all(jobs.slice(0, 100).map((j) => nextFor(j).catch(() => null)));
  const rows = jobs.map((j, i) => {
    const p = previews[i];
    const last = j.last || null;
    const later = p && !j.paused ? p.fires.filter((f) => f.at_ms > (j.next_ms || 0)).slice(0, 2) : [];
    // All three in the schedule's zone (UTC until the preview has said which); the
    // node's own local time when it has one (its zone rules are the ones that fire).
    const tz = p ? p.tz : "UTC";
    const local = (ms) => {
      const f = tz === "UTC" ? null : p.fires.find((x) => x.at_ms === ms);
      return f ? f.local : zoned(ms, tz);
    };
    return el("tr", { "data-job": j.id, class: j.done ? "done" : j.paused ? "paused" : "" },
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id),
        j.spec.http ? el("span", { class: "kind", title: `${j.spec.http.method} ${j.spec.http.url}` }, "http") : null),
      el("td", { class: "schedule", title: JSON.stringify(j.spec.schedule || { after: j.spec.after }) },
        ...withTimes(p ? p.description : j.spec.after ? `after ${j.spec.after.join(", ")}` : JSON.stringify(j.spec.schedule)),
        j.spec.concurrency ? el("span", { class: "badge key", title: "concurrency key and max" }, `${j.spec.concurrency.key} \u2264${j.spec.concurrency.max}`) : null,
        then.has(j.id) ? el("div", { class: "then" }, `then ${then.get(j.id).join(", ")}`) : null),
      el("td", { title: `times in ${tz}` },
        // done: nothing will fire again (a one-shot that ran, a job past its end).
        el("div", { class: "next", title: j.done || j.paused ? null : iso(j.next_ms) },
          ...(j.done ? ["done"] : j.paused ? ["paused"] : j.spec.after ? [`after ${j.spec.after.join(", ")}`]
            : withTimes(`${local(j.next_ms)} (${rel(j.next_ms, now)})`))),
        ...later.map((f) => el("div", { class: `later${f.dst_change ? " dst" : ""}`, title: f.utc },
          ...withTimes(`then ${local(f.at_ms)}${f.dst_change ? ` (DST day ${f.dst_change})` : ""}`)))),
      el("td", { class: "last" }, last ? el("span", { class: `st ${last.state}`, title: last.reason || "" }, last.state) : "-"),
      el("td", {}, (j.active || []).length),
      el("td", { class: "paused-cell" }, j.paused ? "yes" : "no"),
      el("td", { class: "admin-only" }, actionButtons(j, refreshOverview)));
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  $("jobs-more").textContent = list.total > jobs.length ? `${jobs.length} of ${list.total} jobs shown` : "";
}

async function refreshJob(id) {
  const path = `jobs/${encodeURIComponent(id)}`;
  try {
    const [job, next, runs] = await Promise.all([
      api("GET", `${path}?${STALE}`), api("GET", `${path}/next?count=10&${STALE}`),
      api("GET", `${path}/runs?limit=50&${STALE}${runsBefore ? `&before=${runsBefore[runsBefore.length - 1]}` : ""}`)]);
    if (location.hash !== `#/jobs/${encodeURIComponent(id)}`) return;  // left meanwhile
    renderJob(job, next, runs);
  } catch (e) {
    $("job-title").textContent = id;
    $("job-desc").textContent = String(e.message || e);
  }
  if (!$("job-page").hidden && token && location.hash === `#/jobs/${encodeURIComponent(id)}`) {
    later(() => refreshJob(id));
  }
}

function renderJob(job, next, runs) {
  $("job-title").textContent = job.id + (job.paused ? " (paused)" : "");
  $("job-title").dataset.paused = job.paused ? "yes" : "no";
  $("job-desc").textContent = `${next.description}; ${job.done ? "done; " : ""}version ${job.version}; last: ${job.last ? job.last.state : "-"}`;
  $("job-title").dataset.done = job.done ? "yes" : "no";
  $("job-exec").textContent = executor(job.spec);
  const reload = () => refreshJob(job.id);
  const act = (op) => async () => {
    try {
      const r = await api("POST", `jobs/${encodeURIComponent(job.id)}/${op}`, {});
      toast(op === "trigger" ? `triggered ${r.run_id}` : `${job.id}: ${op}d`);
    } catch (e) { toast(`${job.id}: ${e.message}`, true); }
    reload();
  };
  $("job-pause").onclick = act("pause");
  $("job-resume").onclick = act("resume");
  $("job-trigger").onclick = act("trigger");
  $("job-pause").hidden = job.paused;
  $("job-resume").hidden = !job.paused;
  $("fires-zone").textContent = next.tz;
  // A UTC schedule's local time is its UTC time: one column, not two that say the same.
  $("fires").classList.toggle("utc-only", next.tz === "UTC");
  $("fires").tBodies[0].replaceChildren(...next.fires.map((f, i) => el("tr", { class: f.dst_change ? "dst" : "" },
    el("td", {}, i + 1), el("td", {}, `${next.tz === "UTC" ? f.utc : f.local} ${f.weekday || ""}`),
    el("td", { class: "utc" }, f.utc),
    el("td", {}, f.dst_change ? `DST day (${f.dst_change})` : ""))));
  renderRuns(runs.runs || []);
  $("job-spec").textContent = JSON.stringify(job.spec, null, 2);
}

// What a run of the job does, in one line (an HTTP job's request, a command, a callable).
function executor(spec) {
  const h = spec.http;
  if (h) {
    const expect = h.expect ? `status ${h.expect.join(", ")}` : "a 2xx status";
    return `HTTP: ${h.method} ${h.url}, succeeds on ${expect}` +
      (h.timeout ? `, request timeout ${h.timeout}` : "") + (h.ca ? `, CA ${h.ca}` : "");
  }
  if (spec.command) return `runs: ${JSON.stringify(spec.command)}`;
  return spec.call ? `calls: ${spec.call}` : "";
}

// ------------------------------------------------------------------ run logs

// The run's full log, read from the node that ran it (through this node): its last
// LOG_CHUNK bytes, then followed (a poll kept open at the node) until the run ends.
// The panel lives outside the runs table, so the table's refresh does not close it.
function openLog(run, stream) {
  logView = { run, stream, seq: (logView ? logView.seq : 0) + 1 };
  $("run-log").hidden = false;
  $("log-run").textContent = run;
  $("log-where").textContent = "";
  $("log-text").textContent = "";
  $("log-state").textContent = "loading\u2026";
  $("log-stdout").classList.toggle("on", stream === "stdout");
  $("log-stderr").classList.toggle("on", stream === "stderr");
  $("run-log").scrollIntoView({ block: "nearest" });
  followLog(logView);
}

async function followLog(view) {
  const path = `runs/${encodeURIComponent(view.run)}/logs?stream=${view.stream}`;
  let offset = -LOG_CHUNK;
  let first = true;
  while (logView === view) {
    let r;
    try {
      r = await api("GET", `${path}&offset=${offset}${first ? "" : "&wait=5"}`);
    } catch (e) {
      if (logView === view) $("log-state").textContent = String(e.message || e);
      return;
    }
    if (logView !== view) return;
    if (first && r.offset > 0) $("log-text").append(`[${r.offset} earlier bytes not shown]\n`);
    first = false;
    $("log-text").append(r.text);
    $("log-where").textContent = r.node ? `attempt ${r.attempt} on ${r.node}` : `(${r.state})`;
    const other = r.stream === "stdout" ? "stderr" : "stdout";
    const more = r.sizes && r.sizes[other] ? `; ${r.sizes[other]} bytes on ${other}` : "";
    if (r.removed) { $("log-state").textContent = `removed by the node's limits (${r.removed})`; return; }
    if (r.done && r.next_offset >= r.size) {
      $("log-state").textContent = `${r.size} bytes, complete${more}`;
      return;
    }
    $("log-state").textContent = `${r.size} bytes so far, following\u2026${more}`;
    offset = r.next_offset;
    if (!r.node) await new Promise((res) => setTimeout(res, REFRESH_MS));  // not placed yet
  }
}

function closeLog() { logView = null; $("run-log").hidden = true; }

// A range record (an outage, a pause: count fire times from scheduled_ms to until_ms)
// is one row, with its count and its end: it must not read as a single miss.
function times(r) { return r.count > 1 ? ` \u00d7${r.count}` : ""; }
function fireTimes(r) {
  return r.until_ms != null && r.until_ms !== r.scheduled_ms
    ? `${iso(r.scheduled_ms)} \u2013 ${iso(r.until_ms)}` : iso(r.scheduled_ms);
}

function renderRuns(runs) {
  const tl = $("timeline");
  tl.replaceChildren();
  if (runs.length) {
    const lo = runs[runs.length - 1].scheduled_ms;
    const hi = Math.max(runs[0].scheduled_ms, lo + 1);
    for (const r of runs) {
      const x = 100 * (r.scheduled_ms - lo) / (hi - lo);
      const tick = el("span", { class: `tick st ${r.state}`, "data-run": r.run_id,
        title: `${r.run_id} ${r.state}${times(r)} on ${r.node || "-"} (${fireTimes(r)})` });
      tick.style.left = `calc(${x.toFixed(2)}% - 4px)`;  // CSSOM: the CSP refuses style attributes
      tl.append(tick);
    }
  }
  $("runs").tBodies[0].replaceChildren(...runs.map((r) => {
    // executed_ms: when it began to run (a start is committed ahead of its fire time).
    const began = r.executed_ms != null ? r.executed_ms : r.started_ms;
    const late = began != null ? began - r.scheduled_ms : null;
    const took = began != null && r.finished_ms != null ? r.finished_ms - began : null;
    return el("tr", { id: `run-${r.run_id}`, "data-run": r.run_id, "data-state": r.state },
      el("td", {}, r.run_id), el("td", { class: "fire" }, ...withTimes(fireTimes(r))),
      el("td", {}, el("span", { class: `st ${r.state}` }, r.state), times(r)),
      el("td", {}, late == null ? "-" : span(late)), el("td", {}, r.node || "-"),
      el("td", {}, r.attempt), el("td", {}, took == null ? "-" : span(took)),
      el("td", {}, r.exit_code ?? "-"), el("td", { class: "reason" }, r.reason || ""),
      el("td", {}, r.node ? el("button", { type: "button", class: "log", "data-run": r.run_id,
        onclick: () => openLog(r.run_id, "stdout") }, "log") : null,
        r.tail ? el("details", {}, el("summary", {}, "tail"), el("pre", {}, r.tail)) : ""));
  }));
  const id = decodeURIComponent((/^#\/jobs\/(.+)$/.exec(location.hash) || [, ""])[1]);
  $("runs-older").hidden = runs.length < 50;
  $("runs-newer").hidden = !runsBefore;
  $("runs-older").onclick = () => { runsBefore = [...(runsBefore || []), runs[runs.length - 1].scheduled_ms]; refreshJob(id); };
  $("runs-newer").onclick = () => { runsBefore = null; refreshJob(id); };
}

// ------------------------------------------------------------------ live feed

function feedText(ev) {
  switch (ev.event) {
    case "run.assigned": return `${ev.run_id} assigned to ${ev.on} (fence ${ev.fence})`;
    case "run.started": return `${ev.run_id} started on ${ev.on} (fence ${ev.fence})`;
    case "run.ended": return `${ev.run_id} ${ev.outcome} on ${ev.on || "-"}: ${ev.reason}`;
    case "run.missed": return `${ev.run_id} ${ev.outcome}: ${ev.reason}`;
    case "leader.changed": return `leader is now ${ev.leader || "none"} (term ${ev.term})`;
    case "node.lost": return `node ${ev.subject} lost`;
    case "node.back": return `node ${ev.subject} back`;
    case "quorum.lost": return `${ev.node} lost the quorum (${span(ev.without_ms)} without): ` +
      "it starts nothing, and stops its runs";
    case "quorum.back": return `${ev.node} has the quorum again (after ${span(ev.without_ms)})`;
    case "stream.open": return `connected to ${ev.node}'s event stream`;
    case "stream.dropped": return `dropped by ${ev.node}: ${ev.reason}`;
    default: return `${ev.job_id || ""} ${ev.event.replace("job.", "")}`;
  }
}

// A run is two lines, its start and its end: its assignment (a moment before its start)
// would be a third.
const FEED_HIDDEN = new Set(["run.assigned"]);
const CLUSTER_EVENTS = /^(leader|node|quorum)\./;

function addFeed(ev) {
  if (FEED_HIDDEN.has(ev.event)) return;
  const feed = $("feed");
  const cls = ev.outcome ? `st ${ev.outcome}` : (CLUSTER_EVENTS.test(ev.event) ? "cluster" : "");
  feed.prepend(el("li", { "data-event": ev.event, "data-job": ev.job_id, class: cls },
    el("time", {}, new Date(ev.ts_ms || Date.now()).toISOString().slice(11, 23)), " ", feedText(ev)));
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
  if (ev.event.startsWith("job.") || ev.event === "run.ended") nextCache.delete(ev.job_id);
}

async function startFeed() {
  // EventSource cannot send an Authorization header: read the SSE stream with fetch.
  if (feedAbort) feedAbort.abort();
  const ctl = new AbortController();
  feedAbort = ctl;
  let backoff = 500;
  while (token && !ctl.signal.aborted) {
    try {
      const resp = await fetch("api/v1/events", { headers: { Authorization: `Bearer ${token}` }, signal: ctl.signal, cache: "no-store" });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      $("feed-state").textContent = "live";
      $("feed-state").className = "badge ok";
      backoff = 500;
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const data = chunk.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) { try { addFeed(JSON.parse(data)); } catch (e) { /* not JSON: ignore */ } }
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    $("feed-state").textContent = "reconnecting";
    $("feed-state").className = "badge degraded";
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 5000);
  }
}

// ------------------------------------------------------------------ wiring

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromAddress();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token-input").value.trim();
    $("token-input").value = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    start();
  });
  $("logout").addEventListener("click", () => logout(""));
  $("log-stdout").addEventListener("click", () => { if (logView) openLog(logView.run, "stdout"); });
  $("log-stderr").addEventListener("click", () => { if (logView) openLog(logView.run, "stderr"); });
  $("log-close").addEventListener("click", closeLog);
  window.addEventListener("hashchange", () => {
    if (takeTokenFromAddress() || !role) start(); else route();
  });
  start();
});
