// mlxd's dashboard: polls GET /admin/status, draws it, and calls the /admin routes.
// Plain DOM, no library; every value from the service goes in as text, never as HTML
// (a client's user agent is whatever that client says it is).
"use strict";

const POLL_MS = 2000;
const KEY_STORAGE = "mlxd.adminKey";

const state = { status: null, polledAt: 0, timer: null, busy: new Set() };

// ------------------------------------------------------------------ helpers

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "-";
  let value = Number(bytes);
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (Math.abs(value) < 1024 || unit === "GiB") return unit === "B" ? `${value.toFixed(0)} B` : `${value.toFixed(1)} ${unit}`;
    value /= 1024;
  }
  return `${value.toFixed(1)} GiB`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, Math.floor(seconds));
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  if (s >= 60) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${s}s`;
}

function percent(value) { return value === null || value === undefined ? "-" : `${Math.round(100 * value)}%`; }
function rate(value) { return value ? Number(value).toFixed(1) : "-"; }

function modelPath(id) { return id.split("/").map(encodeURIComponent).join("/"); }

// ------------------------------------------------------------------ the key

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey(message) {
  $("key-panel").hidden = false;
  $("key-error").textContent = message || "";
  $("service-state").textContent = "needs the admin key";
  $("service-state").className = "badge error";
  $("key-input").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  $("key-panel").hidden = true;
  poll();
});

class KeyNeeded extends Error {}

async function call(method, path) {
  const response = await fetch(path, { method, headers: authHeaders(), cache: "no-store" });
  if (response.status === 401 || response.status === 403) {
    const hadKey = sessionStorage.getItem(KEY_STORAGE) !== null;
    sessionStorage.removeItem(KEY_STORAGE);
    askForKey(hadKey ? "that key was refused; enter the admin key" : "");
    throw new KeyNeeded();
  }
  let body = null;
  try { body = await response.json(); } catch (_) { /* an empty or non-JSON answer */ }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : `${response.status} ${response.statusText}`;
    throw new Error(message);
  }
  return body;
}

// ------------------------------------------------------------------ polling

async function poll() {
  clearTimeout(state.timer);
  try {
    const status = await call("GET", "/admin/status");
    state.status = status;
    state.polledAt = Date.now();
    $("key-panel").hidden = true;
    $("error").textContent = "";
    render(status);
  } catch (error) {
    if (!(error instanceof KeyNeeded)) {
      $("error").textContent = `cannot reach the service: ${error.message}`;
      $("service-state").textContent = "unreachable";
      $("service-state").className = "badge error";
    }
  }
  state.timer = setTimeout(poll, POLL_MS);
}

async function act(action, modelId) {
  const key = `${action}:${modelId}`;
  if (state.busy.has(key)) return;
  state.busy.add(key);
  if (state.status) renderModels(state.status);
  const path = action === "restart" ? `/admin/workers/${modelPath(modelId)}/restart`
                                    : `/admin/models/${modelPath(modelId)}/${action}`;
  $("action-result").textContent = `${action} ${modelId} ...`;
  const started = Date.now();
  try {
    await call("POST", path);
    $("action-result").textContent = `${action} ${modelId}: done in ${((Date.now() - started) / 1000).toFixed(1)} s`;
  } catch (error) {
    if (!(error instanceof KeyNeeded)) $("action-result").textContent = `${action} ${modelId} failed: ${error.message}`;
  } finally {
    state.busy.delete(key);
    poll();
  }
}

// ------------------------------------------------------------------ drawing

function render(status) {
  renderTop(status);
  renderModels(status);
  renderCache(status);
  renderRequests(status);
  $("updated").textContent = `updated ${new Date(state.polledAt).toLocaleTimeString()}`;
}

function renderTop(status) {
  $("version").textContent = status.version || "";
  const models = status.models || [];
  const down = models.some((m) => m.state === "down");
  const serviceState = status.starting ? "starting" : down ? "degraded" : "ok";
  $("service-state").textContent = serviceState;
  $("service-state").className = `badge ${serviceState}`;
  $("uptime").textContent = duration(status.uptime_s);
  const totals = status.totals || {};
  $("request-count").textContent = String(totals.requests ?? 0);
  const live = (status.requests || []).filter((r) => r.route);
  $("in-flight").textContent = String(live.length);
  const points = (status.history && status.history.points) || [];
  const last = points.length ? points[points.length - 1] : null;
  $("tok-s").textContent = last ? Number(last.generated_tok_s || 0).toFixed(1) : "-";
  $("hit-rate").textContent = last && last.hot_hit_rate !== null
    ? `${percent(last.hot_hit_rate)} hot, ${percent(last.cold_hit_rate)} cold` : "-";
  const top = drawSparkline($("throughput"), points.map((p) => [p.t, p.generated_tok_s]));
  $("throughput-max").textContent = top ? `(peak ${top.toFixed(1)})` : "";
  const memory = status.memory || {};
  const budget = memory.budget_bytes || 1;
  const bar = $("memory-bar");
  bar.replaceChildren(el("span", { style: `left:0;width:${Math.min(100, (100 * (memory.used_bytes || 0)) / budget)}%` }));
  $("memory-text").textContent = `${size(memory.used_bytes)} used by models of a ${size(memory.budget_bytes)} budget; `
    + `machine ${size(memory.available_bytes)} free of ${size(memory.total_bytes)}`;
}

function ttlText(model) {
  if (model.pinned) return "pinned";
  if (model.ttl_left_s === null || model.ttl_left_s === undefined) return model.ttl_s ? `TTL ${duration(model.ttl_s)}` : "-";
  const left = model.ttl_left_s - (Date.now() - state.polledAt) / 1000;
  return `unloads in ${duration(Math.max(0, left))}`;
}

function renderModels(status) {
  const budget = (status.memory && status.memory.budget_bytes) || 1;
  const body = $("models").tBodies[0];
  const rows = (status.models || []).map((model) => {
    const loaded = model.pid !== null && model.pid !== undefined;
    // what the budget is charged for it: the larger of its estimate and its RSS (as the pool counts)
    const memoryBytes = loaded ? Math.max(model.rss_bytes || 0, model.estimated_bytes || 0) : model.estimated_bytes;
    const hot = model.hot_tier || {};
    const button = (action, label, enabled) => el("button", {
      "data-action": action, disabled: !enabled || state.busy.has(`${action}:${model.id}`),
      title: `${label} ${model.id}`, onclick: () => act(action, model.id),
    }, label);
    const transient = ["loading", "unloading", "restarting", "provisioning", "converting"].includes(model.state);
    return el("tr", { "data-model": model.id },
      el("td", { class: "id" }, model.id, el("span", { class: "muted" }, model.kind && model.kind !== "chat" ? ` (${model.kind})` : "")),
      el("td", {}, el("span", { class: `badge state ${model.state}`, "data-state": model.state }, model.state)),
      el("td", {},
        el("div", { class: "bar small", title: `${size(memoryBytes)} of ${size(budget)}` },
          el("span", { style: `left:0;width:${Math.min(100, (100 * (memoryBytes || 0)) / budget)}%;${loaded ? "" : "opacity:.35"}` })),
        ` ${size(memoryBytes)}`,
        el("span", { class: "muted" }, loaded ? ` (RSS ${size(model.rss_bytes)})` : " (estimate)")),
      el("td", { class: "ttl", "data-ttl-left": model.ttl_left_s ?? "" }, ttlText(model)),
      el("td", {}, String(model.requests_in_flight ?? 0)),
      el("td", {}, rate(model.recent_decode_tok_s)),
      el("td", { class: "wrap" }, loaded && model.hot_tier
        ? `${size(hot.bytes)} of ${size(hot.budget_bytes)}, ${hot.blocks ?? 0} blocks, hit ${percent(hot.hit_rate)}` : "-"),
      el("td", { class: "actions" },
        button("load", "load", !loaded && !transient),
        button("unload", "unload", loaded && !transient),
        model.pinned ? button("unpin", "unpin", true) : button("pin", "pin", true),
        button("restart", "restart", loaded && model.state !== "restarting" && !transient)));
  });
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 8 }, "no models"))]));
}

function renderCache(status) {
  const hotModels = (status.models || []).filter((m) => m.pid !== null && m.pid !== undefined && m.hot_tier);
  const hot = hotModels.reduce((acc, m) => ({
    bytes: acc.bytes + (m.hot_tier.bytes || 0), budget: acc.budget + (m.hot_tier.budget_bytes || 0),
    blocks: acc.blocks + (m.hot_tier.blocks || 0),
  }), { bytes: 0, budget: 0, blocks: 0 });
  $("hot-tier").replaceChildren(
    el("div", {}, `${size(hot.bytes)} of ${size(hot.budget)}`),
    el("div", {}, `${hot.blocks} blocks in ${hotModels.length} worker${hotModels.length === 1 ? "" : "s"}`),
    ...hotModels.map((m) => el("div", { class: "muted" }, `${m.id}: hit ${percent(m.hot_tier.hit_rate)}`)));
  const cold = status.kvstore;
  $("cold-tier").replaceChildren(...(cold ? [
    el("div", {}, `${size(cold.bytes)} of ${size(cold.max_bytes)} `, el("span", { class: `badge ${cold.state === "ready" ? "ok" : "error"}` }, cold.state)),
    el("div", {}, `${cold.blocks ?? "-"} blocks, hit ${percent(cold.hit_rate)}`),
    el("div", { class: "muted" }, `write queue ${cold.write_queue_depth ?? 0}, dropped writes ${cold.dropped_writes ?? 0}, evictions ${cold.evictions ?? 0}`),
  ] : [el("div", {}, "off")]));
  const points = (status.history && status.history.points) || [];
  drawHitChart($("hit-chart"), points);
}

function renderRequests(status) {
  const now = (status.requests || []).filter((r) => r.route);
  const rows = now.map((r) => el("tr", { "data-request": r.id },
    el("td", { title: r.id }, r.id.length > 18 ? `${r.id.slice(0, 18)}…` : r.id),
    el("td", {}, r.model || "-"),
    el("td", { class: "client", title: r.user_agent || "" }, r.user_agent || "-"),
    el("td", {}, el("span", { class: `badge ${r.state}` }, r.state)),
    el("td", {}, r.prompt_tokens === null || r.prompt_tokens === undefined ? "-" : `${r.prompt_tokens} (${r.cached_tokens || 0})`),
    el("td", {}, String(r.generated_tokens ?? r.tokens ?? 0)),
    el("td", {}, r.tok_s === null || r.tok_s === undefined ? "-" : Number(r.tok_s).toFixed(1)),
    el("td", {}, duration(r.age_s))));
  $("requests").tBodies[0].replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { class: "empty", colspan: 8 }, "none in flight"))]));
}

// ------------------------------------------------------------------ charts (hand-written SVG)

const WINDOW_S = 300;

function xOf(t, newest, width) { return width - ((newest - t) / WINDOW_S) * width; }

function drawSparkline(node, series) {
  const width = 300, height = 40;
  node.replaceChildren();
  if (series.length < 2) return null;
  const newest = series[series.length - 1][0];
  const top = Math.max(1, ...series.map(([, v]) => v || 0));
  const coords = series.map(([t, v]) => [xOf(t, newest, width), height - 2 - ((v || 0) / top) * (height - 4)]);
  const line = coords.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  node.append(svg("path", { d: `${line} L${coords[coords.length - 1][0].toFixed(1)},${height} L${coords[0][0].toFixed(1)},${height} Z`,
    fill: "#2f6fde22", stroke: "none" }));
  node.append(svg("path", { d: line, fill: "none", stroke: "#2f6fde", "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" }));
  return top;
}

function drawHitChart(node, points) {
  const width = 300, height = 80;
  node.replaceChildren();
  for (const level of [0.25, 0.5, 0.75]) {
    node.append(svg("line", { x1: 0, x2: width, y1: height * (1 - level), y2: height * (1 - level),
      stroke: "#e3e6ec", "stroke-width": 1, "vector-effect": "non-scaling-stroke" }));
  }
  if (!points.length) return;
  const newest = points[points.length - 1].t;
  for (const [field, color] of [["hot_hit_rate", "#e8793a"], ["cold_hit_rate", "#2f6fde"]]) {
    let d = "", open = false;
    for (const p of points) {
      const value = p[field];
      if (value === null || value === undefined) { open = false; continue; }
      const x = xOf(p.t, newest, width).toFixed(1), y = (height - 1 - value * (height - 2)).toFixed(1);
      d += `${open ? "L" : "M"}${x},${y} `;
      open = true;
    }
    if (d) node.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2, "vector-effect": "non-scaling-stroke" }));
  }
}

// the TTL countdowns move between two polls
setInterval(() => {
  if (!state.status) return;
  for (const model of state.status.models || []) {
    const row = document.querySelector(`tr[data-model="${CSS.escape(model.id)}"] td.ttl`);
    if (row) row.textContent = ttlText(model);
  }
}, 1000);

poll();
