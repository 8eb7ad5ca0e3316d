// dankserve's console: plain JS, no build. Every value is put into the page as text (textContent),
// never as HTML, so a hostile deployment name, model or message shows as the characters it is.
"use strict";

const POLL_MS = 2000;
let key = sessionStorage.getItem("dankserve-key") || "";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function notice(text) { document.getElementById("notice").textContent = text || ""; }

const held = new Map();  // path -> [ETag, body]: a document that changes only with traffic comes back as 304

async function getJson(path) {
  const kept = held.get(path);
  const response = await fetch(path, { headers: headers(kept ? { "If-None-Match": kept[0] } : {}), cache: "no-store" });
  if (response.status === 304 && kept) return kept[1];
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((body.error && body.error.message) || ("HTTP " + response.status));
  const tag = response.headers.get("ETag");
  if (tag) held.set(path, [tag, body]);
  return body;
}

function seconds(value) {
  if (value === null || value === undefined) return "-";
  const s = Math.round(Number(value));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function took(value) {
  if (value === null || value === undefined) return "-";
  const s = Number(value);
  return s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s";
}

function when(at) { return at ? new Date(at * 1000).toLocaleTimeString() : "-"; }

function gib(bytes) {
  return bytes === null || bytes === undefined ? "-" : (Number(bytes) / 2 ** 30).toFixed(1) + " GiB";
}

function compact(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function table(rows, columns) {
  const t = el("table", null, columns.length > 2 ? "wide" : "pairs");
  const head = el("tr");
  for (const [title] of columns) head.appendChild(el("th", title));
  t.appendChild(head);
  for (const row of rows) {
    const tr = el("tr");
    for (const [title, pick] of columns) {
      const td = el("td", pick(row));
      td.dataset.label = title;
      tr.appendChild(td);
    }
    t.appendChild(tr);
  }
  return t;
}

function deploymentCard(d) {
  const card = el("div", null, "card");
  card.dataset.deployment = d.name;
  const title = el("h3");
  title.appendChild(el("span", d.name, "name"));
  title.appendChild(document.createTextNode(" "));
  title.appendChild(el("span", d.state, "state"));
  card.appendChild(title);
  const failure = d.last_failure;
  const predicted = d.predicted || {};
  const rows = [
    ["phase", d.phase + (d.phase_seconds != null ? " (" + seconds(d.phase_seconds) + ")" : "")],
    ["model", d.model], ["endpoint", d.endpoint], ["runtime", compact(d.runtime) + (d.image ? " " + d.image : "")],
    ["uptime", seconds(d.uptime_seconds)], ["boots", d.boots], ["restarts", d.restarts],
    ["boots by kind", compact(d.boots_by_kind)], ["last boot", compact(d.last_boot)],
    ["predicted", compact(predicted)], ["KV cache source", compact(d.kv_cache_source)],
    ["sleeping", d.swap ? compact(d.swap.level || d.state) : "not in a swap group"],
    ["message", compact(d.message)], ["why", compact(d.why)],
    ["last failure", failure ? failure["class"] + ": " + failure.message : "none"],
    ["GPU memory held", gib(d.gpu_memory_held_bytes)],
  ];
  card.appendChild(table(rows, [["field", (r) => r[0]], ["value", (r) => compact(r[1])]]));
  return card;
}

function gpuSummary(deployments) {
  // One bar per GPU: its NVML reading (as status reports it), each deployment's own share of it (its
  // processes' memory on that GPU), the rest held by other processes; asleep or awake, each is listed.
  const gpus = new Map();
  for (const d of deployments) {
    for (const gpu of d.gpus || []) {
      const entry = gpus.get(gpu.index) || { gpu, members: [] };
      entry.members.push([d, gpu.held_bytes]);
      gpus.set(gpu.index, entry);
    }
  }
  const box = el("div", null, "gpus");
  for (const { gpu, members } of [...gpus.values()].sort((a, b) => a.gpu.index - b.gpu.index)) {
    const total = Number(gpu.memory_total_bytes) || 0;
    const section = el("div", null, "gpu");
    section.dataset.gpu = gpu.index;
    section.append(el("p", "GPU " + gpu.index + ": " + gib(gpu.memory_used_bytes) + " used of " + gib(total)));
    const bar = el("div", null, "bar");
    const list = el("ul");
    let shares = 0;
    for (const [d, bytes] of members) {
      shares += Number(bytes || 0);
      const item = el("li", d.name + " (" + d.state + "): " + (bytes == null ? "not read" : gib(bytes)));
      item.dataset.deployment = d.name;
      list.append(item);
      if (total && bytes) bar.append(segment(d.name, bytes, total, "share"));
    }
    const rest = Number(gpu.memory_used_bytes || 0) - shares;
    if (total && rest > 0) {
      bar.append(segment("other", rest, total, "other"));
      list.append(el("li", "other processes: " + gib(rest)));
    }
    section.append(bar, list);
    box.append(section);
  }
  return box;
}

function segment(name, bytes, total, cls) {
  const part = el("span", name, "segment " + cls);
  part.style.width = (100 * Number(bytes) / total).toFixed(2) + "%";  // CSSOM: allowed by the CSP
  part.title = name + ": " + gib(bytes);
  return part;
}

function renderDeployments(status) {
  const body = document.getElementById("deployments-body");
  body.replaceChildren(gpuSummary(status.deployments), ...status.deployments.map(deploymentCard));
  const select = document.getElementById("deployment");
  const chosen = select.value;
  select.replaceChildren(...status.deployments.map((d) => { const o = el("option", d.name); o.value = d.name; return o; }));
  if (chosen) select.value = chosen;
}

function check(entry, name) {
  const found = (entry.checks || []).find((c) => c.check === name);
  return found ? found.verdict + ": " + found.detail : "-";
}

function renderSwap(status) {
  const members = status.deployments.filter((d) => d.swap);
  const body = document.getElementById("swap-body");
  if (!members.length) { body.replaceChildren(el("p", "No swap groups.")); return; }
  const swaps = status.swaps || [];
  body.replaceChildren(table(members, [
    ["group", (d) => d.swap.group], ["deployment", (d) => d.name], ["state", (d) => d.state],
    ["sleep level", (d) => compact(d.swap.level)], ["predicted", (d) => compact(d.predicted)],
    ["swap", (d) => compact(d.swap)],
  ]), el("h3", "Recent swaps"), swaps.length ? table(swaps, [
    ["when", (s) => when(s.at)], ["group", (s) => s.group], ["deployment", (s) => s.deployment],
    ["did", (s) => (s.kind === "sleep" ? "slept" : "woke")], ["level", (s) => s.level], ["took", (s) => took(s.seconds)],
    ["memory check", (s) => check(s, "memory")], ["canary check", (s) => check(s, "canary")],
    ["outcome", (s) => (s.ok ? "ok" : "FAILED: " + s.failure)],
  ]) : el("p", "No swaps since the daemon started."));
}

function renderRequests(recent) {
  const body = document.getElementById("requests-body");
  if (!recent.requests.length) { body.replaceChildren(el("p", "No requests yet.")); return; }
  body.replaceChildren(table(recent.requests, [
    ["when", (r) => when(r.at)], ["key", (r) => r.key], ["model", (r) => r.model], ["code", (r) => r.status],
    ["queued", (r) => took(r.queued_seconds)], ["first byte", (r) => took(r.first_byte_seconds)],
    ["total", (r) => took(r.total_seconds)], ["tokens in", (r) => compact(r.prompt_tokens)],
    ["tokens out", (r) => compact(r.completion_tokens) + (r.tokens_estimated ? " (estimated)" : "")],
  ]));
}

function renderUsage(usage) {
  const body = document.getElementById("usage-body");
  if (!usage.rows.length) { body.replaceChildren(el("p", "No requests yet.")); return; }
  body.replaceChildren(table(usage.rows, [
    ["key", (r) => r.key], ["model", (r) => r.model], ["requests", (r) => r.requests],
    ["2xx", (r) => r["2xx"]], ["4xx", (r) => r["4xx"]], ["5xx", (r) => r["5xx"]],
    ["codes", (r) => compact(r.codes)], ["prompt tokens", (r) => r.prompt_tokens],
    ["completion tokens", (r) => r.completion_tokens],
  ]));
}

function page() { return (location.hash || "#deployments").slice(1); }

function renderStatus(status) {
  if (status.error) { notice("Cannot read the console's data: " + status.error.message); return; }
  renderDeployments(status);
  renderSwap(status);
  logChoices(status);
  notice("");
}

// Server-sent events read through fetch (EventSource cannot send the key's header): each `data:` line's
// JSON handed to `each`; keep-alive comments skipped.
async function readEvents(path, signal, each) {
  const response = await fetch(path, { headers: headers(), cache: "no-store", signal });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error((body.error && body.error.message) || ("HTTP " + response.status));
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    pending += value;
    const events = pending.split("\n\n");
    pending = events.pop();
    for (const event of events) {
      if (!event.startsWith("data: ")) continue;
      let parsed;
      try { parsed = JSON.parse(event.slice(6)); } catch (error) { continue; }
      each(parsed);
    }
  }
}

// The status comes pushed (one document every 2 s for all open pages, at once after an action) while a
// page that shows it is visible; the Requests page polls its two documents (304 while unchanged). A hidden
// tab asks for nothing.
let statusStream = null;

function follow() {
  const wanted = document.visibilityState !== "hidden" && page() !== "usage";
  if (!wanted && statusStream) { statusStream.abort(); statusStream = null; }
  if (!wanted || statusStream) return;
  const controller = new AbortController();
  statusStream = controller;
  readEvents("/ui/api/status/events", controller.signal, renderStatus)
    .catch((error) => { if (error.name !== "AbortError") notice("Cannot read the console's data: " + error.message); })
    .finally(() => {
      if (statusStream !== controller) return;
      statusStream = null;
      setTimeout(follow, POLL_MS);  // the stream ended (a restart of the daemon): follow again
    });
}

async function refresh() {
  follow();
  if (document.visibilityState === "hidden" || page() !== "usage") return;
  try {
    renderUsage(await getJson("/ui/api/usage"));
    renderRequests(await getJson("/ui/api/requests"));
    notice("");
  } catch (error) {
    notice("Cannot read the console's data: " + error.message);
  }
}

// Logs: server-sent events read through fetch (EventSource cannot send the key's header). The stream
// runs only while the Logs page is shown; the page keeps the last LOG_KEEP lines.
const LOG_KEEP = 1000;
let logStream = null;

function logLine(line) {
  const item = el("li", null, "log-line");
  item.append(el("time", line.time), " ", el("span", line.source, "log-source"), " ", el("span", line.message));
  const body = document.getElementById("logs-body");
  body.append(item);
  while (body.childElementCount > LOG_KEEP) body.firstElementChild.remove();
  item.scrollIntoView({ block: "nearest" });
}

function stopLogs() {
  if (logStream) logStream.abort();
  logStream = null;
}

async function startLogs() {
  stopLogs();
  const controller = new AbortController();
  logStream = controller;
  const deployment = document.getElementById("logs-deployment").value;
  const state = document.getElementById("logs-state");
  document.getElementById("logs-body").replaceChildren();
  const path = "/ui/api/logs" + (deployment ? "?deployment=" + encodeURIComponent(deployment) : "");
  state.textContent = "following" + (deployment ? " " + deployment : " every deployment and the daemon");
  try {
    await readEvents(path, controller.signal, logLine);
    state.textContent = "the stream ended; choose a deployment to follow again";
  } catch (error) {
    if (error.name !== "AbortError") state.textContent = "Cannot read the logs: " + error.message;
  }
}

function logChoices(status) {
  const select = document.getElementById("logs-deployment");
  const names = (status.deployments || []).map((d) => d.name);
  const have = Array.from(select.options).slice(1).map((o) => o.value);
  if (names.join("\n") === have.join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(new Option("all", ""), ...names.map((n) => new Option(n, n)));
  select.value = names.includes(chosen) ? chosen : "";
}

function show() {
  const shown = page();
  for (const section of document.querySelectorAll(".page")) section.classList.toggle("shown", section.id === shown);
  if (shown === "logs" && !logStream) startLogs();
  if (shown !== "logs") stopLogs();
}

async function act(event) {
  event.preventDefault();
  const action = document.getElementById("action").value;
  const deployment = document.getElementById("deployment").value;
  const what = action === "reload" ? "reload the configuration" : action + " " + deployment;
  if (!window.confirm("Really " + what + "?")) return;
  const answer = document.getElementById("answer");
  answer.textContent = "asking the daemon to " + what + "...";
  const response = await fetch("/ui/api/action", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", "X-Dankserve-Console": "1" }),
    body: JSON.stringify({ action, deployment }),
  });
  const body = await response.json().catch(() => ({}));
  answer.textContent = "HTTP " + response.status + "\n" + JSON.stringify(body, null, 2);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    key = document.getElementById("key").value.trim();
    sessionStorage.setItem("dankserve-key", key);
    if (statusStream) statusStream.abort();
    statusStream = null;
    refresh();
    if (logStream) startLogs();
  });
  document.getElementById("action-form").addEventListener("submit", act);
  document.getElementById("logs-deployment").addEventListener("change", startLogs);
  window.addEventListener("hashchange", () => { show(); refresh(); });
  document.addEventListener("visibilitychange", refresh);
  show();
  refresh();
  setInterval(refresh, POLL_MS);
});
