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

async function getJson(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((body.error && body.error.message) || ("HTTP " + response.status));
  return body;
}

function seconds(value) {
  if (value === null || value === undefined) return "-";
  const s = Math.round(Number(value));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

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
    ["sleeping", d.swap ? compact(d.swap.sleep_level || d.state) : "not in a swap group"],
    ["message", compact(d.message)], ["why", compact(d.why)],
    ["last failure", failure ? failure["class"] + ": " + failure.message : "none"],
    ["GPU memory held", gib(d.gpu_memory_held_bytes)],
  ];
  card.appendChild(table(rows, [["field", (r) => r[0]], ["value", (r) => compact(r[1])]]));
  return card;
}

function gpuSummary(deployments) {
  // Each GPU once: its NVML reading (as status reports it) and who is placed on it, asleep or awake.
  const gpus = new Map();
  for (const d of deployments) {
    for (const gpu of d.gpus || []) {
      const entry = gpus.get(gpu.index) || { gpu, members: [] };
      entry.members.push(d);
      gpus.set(gpu.index, entry);
    }
  }
  const box = el("div", null, "gpus");
  for (const { gpu, members } of gpus.values()) {
    const line = el("p", "GPU " + gpu.index + ": " + gib(gpu.memory_used_bytes) + " of " + gib(gpu.memory_total_bytes) + " ");
    if (gpu.memory_total_bytes) {
      const bar = el("progress");
      bar.max = Number(gpu.memory_total_bytes);
      bar.value = Number(gpu.memory_used_bytes || 0);
      line.appendChild(bar);
    }
    const list = el("ul");
    for (const d of members) list.appendChild(el("li", d.name + " (" + d.state + "): holds " + gib(d.gpu_memory_held_bytes)));
    box.append(line, list);
  }
  return box;
}

function renderDeployments(status) {
  const body = document.getElementById("deployments-body");
  body.replaceChildren(gpuSummary(status.deployments), ...status.deployments.map(deploymentCard));
  const select = document.getElementById("deployment");
  const chosen = select.value;
  select.replaceChildren(...status.deployments.map((d) => { const o = el("option", d.name); o.value = d.name; return o; }));
  if (chosen) select.value = chosen;
}

function renderSwap(status) {
  const members = status.deployments.filter((d) => d.swap);
  const body = document.getElementById("swap-body");
  if (!members.length) { body.replaceChildren(el("p", "No swap groups.")); return; }
  body.replaceChildren(table(members, [
    ["group", (d) => d.swap.group], ["deployment", (d) => d.name], ["state", (d) => d.state],
    ["sleep level", (d) => compact(d.swap.sleep_level)], ["predicted", (d) => compact(d.predicted)],
    ["swap", (d) => compact(d.swap)],
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

async function refresh() {
  try {
    const status = await getJson("/ui/api/status");
    renderDeployments(status);
    renderSwap(status);
    logChoices(status);
    renderUsage(await getJson("/ui/api/usage"));
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
  try {
    const response = await fetch(path, { headers: headers(), cache: "no-store", signal: controller.signal });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      state.textContent = "Cannot read the logs: " + ((body.error && body.error.message) || ("HTTP " + response.status));
      return;
    }
    state.textContent = "following" + (deployment ? " " + deployment : " every deployment and the daemon");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      const events = pending.split("\n\n");
      pending = events.pop();
      for (const event of events) {
        if (!event.startsWith("data: ")) continue;  // a keep-alive comment
        try { logLine(JSON.parse(event.slice(6))); } catch (error) { /* not a line: skipped */ }
      }
    }
    state.textContent = "the stream ended; choose a deployment to follow again";
  } catch (error) {
    if (error.name !== "AbortError") state.textContent = "The log stream broke: " + error.message;
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
  const page = (location.hash || "#deployments").slice(1);
  for (const section of document.querySelectorAll(".page")) section.classList.toggle("shown", section.id === page);
  if (page === "logs" && !logStream) startLogs();
  if (page !== "logs") stopLogs();
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
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    key = document.getElementById("key").value.trim();
    sessionStorage.setItem("dankserve-key", key);
    refresh();
    if (logStream) startLogs();
  });
  document.getElementById("action-form").addEventListener("submit", act);
  document.getElementById("logs-deployment").addEventListener("change", startLogs);
  window.addEventListener("hashchange", show);
  show();
  refresh();
  setInterval(refresh, POLL_MS);
});
