// The eft web page: fills the server-rendered shells from the REST API and refreshes them.
// Every request carries `Authorization: Bearer <key>` once a key has been entered (kept in
// localStorage; a `#key=...` fragment, which never reaches a server, is stored the same way, after
// a confirmation when it would replace another stored key).
"use strict";

const KEY_STORE = "eft_api_key";
const REFRESH_MS = 2000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

function setupKeyField() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("key")) {
    // A link must not silently swap the key this browser keeps for someone else's: ask first.
    const offered = fragment.get("key");
    const stored = apiKey();
    if (!stored || stored === offered ||
        window.confirm("This link carries an API key. Replace the key this browser keeps with it?")) {
      localStorage.setItem(KEY_STORE, offered);
    }
    history.replaceState(null, "", location.pathname + location.search);
  }
  const field = document.getElementById("api-key");
  field.value = apiKey();
  field.addEventListener("change", () => {
    if (field.value) localStorage.setItem(KEY_STORE, field.value);
    else localStorage.removeItem(KEY_STORE);
    location.reload();
  });
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (apiKey()) headers.Authorization = "Bearer " + apiKey();
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const err = body.error || {};
    const problems = (err.errors || []).map((p) => `${p.param}: ${p.message}`);
    throw new Error([`${response.status} ${err.message || response.statusText}`, ...problems].join("\n"));
  }
  return body;
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

function cell(row, value, className) {
  const td = row.insertCell();
  if (value instanceof Node) td.appendChild(value);
  else td.textContent = value === null || value === undefined ? "-" : String(value);
  if (className) td.className = className;
  return td;
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function when(value) {
  return value ? new Date(value).toLocaleString() : "-";
}

function eta(job) {
  if (!job.estimated_finish || TERMINAL.has(job.status)) return "-";
  const seconds = Math.max(0, Math.round((new Date(job.estimated_finish) - Date.now()) / 1000));
  return seconds >= 3600 ? `${Math.floor(seconds / 3600)}h${String(Math.floor(seconds / 60) % 60).padStart(2, "0")}m`
    : `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, "0")}s`;
}

function progressBar(job) {
  const bar = document.createElement("progress");
  bar.max = 1;
  bar.value = job.progress || 0;
  const span = document.createElement("span");
  span.append(bar, ` ${job.step}/${job.total_steps ?? "?"}`);
  return span;
}

// --- job list ---------------------------------------------------------------------------

async function refreshList() {
  const page = await api("/jobs?limit=100");
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const job of page.data) {
    const row = body.insertRow();
    row.dataset.jobId = job.id;
    cell(row, link(`/ui/jobs/${encodeURIComponent(job.id)}`, job.id));
    cell(row, job.name);
    cell(row, job.status, `status ${job.status}`);
    cell(row, progressBar(job));
    cell(row, eta(job));
    cell(row, job.model);
    cell(row, job.num_workers);
    cell(row, when(job.created_at));
  }
  document.body.dataset.loaded = String(page.data.length);
}

// --- job page ---------------------------------------------------------------------------

const charts = {};

function chart(id, series, scales) {
  const element = document.getElementById(id);
  const width = Math.max(320, element.clientWidth || 560);
  return new uPlot({
    width, height: 260, series, scales,
    axes: [{ label: "step" }, ...Object.keys(scales).filter((k) => k !== "x").map((k, i) => ({
      scale: k, label: k, side: i === 0 ? 3 : 1, grid: { show: i === 0 }, size: 70,
      values: k === "lr" ? (u, ticks) => ticks.map((v) => v.toExponential(1)) : undefined,
    }))],
  }, [[]], element);
}

function ensureCharts() {
  if (charts.loss) return;
  charts.loss = chart("loss-chart", [{}, { label: "loss", stroke: "#1f77b4", scale: "loss" },
    { label: "eval loss", stroke: "#d62728", scale: "loss", spanGaps: true, points: { show: true, size: 7 } }],
  { x: { time: false }, loss: {} });
  charts.rate = chart("rate-chart", [{}, { label: "learning rate", stroke: "#2ca02c", scale: "lr" },
    { label: "tokens/s", stroke: "#9467bd", scale: "tokens/s" }],
  { x: { time: false }, lr: {}, "tokens/s": {} });
}

function column(points, key) {
  return points.map((p) => (key in p.values ? p.values[key] : null));
}

function drawMetrics(points) {
  ensureCharts();
  const steps = points.map((p) => p.step);
  charts.loss.setData([steps, column(points, "loss"), column(points, "eval_loss")]);
  charts.rate.setData([steps, column(points, "learning_rate"), column(points, "tokens_per_s")]);
  // DPO jobs: the reward margin (train and held-out) and the share of pairs ranked right.
  if (points.some((p) => "reward_margin" in p.values)) {
    document.getElementById("rewards-figure").hidden = false;
    if (!charts.rewards) {
      charts.rewards = chart("rewards-chart", [{},
        { label: "margin", stroke: "#1f77b4", scale: "margin" },
        { label: "eval margin", stroke: "#d62728", scale: "margin", spanGaps: true, points: { show: true, size: 7 } },
        { label: "accuracy", stroke: "#2ca02c", scale: "accuracy" },
        { label: "eval accuracy", stroke: "#ff7f0e", scale: "accuracy", spanGaps: true, points: { show: true, size: 7 } }],
      { x: { time: false }, margin: {}, accuracy: { range: [0, 1] } });
    }
    charts.rewards.setData([steps, column(points, "reward_margin"), column(points, "eval_reward_margin"),
      column(points, "reward_accuracy"), column(points, "eval_reward_accuracy")]);
    document.getElementById("rewards-chart").dataset.points =
      String(column(points, "reward_margin").filter((v) => v !== null).length);
  }
  const drawn = column(points, "loss").filter((v) => v !== null).length;
  document.getElementById("loss-chart").dataset.points = String(drawn);
}

// Ray's dashboard, for admins only (GET /me names it to them; null for everyone else).
let dashboard = null;

async function setupAdminLinks() {
  try {
    dashboard = (await api("/me")).ray_dashboard_url;
  } catch (error) {
    dashboard = null;
  }
  if (dashboard) document.getElementById("admin-links").replaceChildren(link(dashboard, "Ray dashboard"));
}

// Pause (checkpoint now, release the workers), resume and cancel, offered as the status allows.
const ACTIONS = {
  pause: new Set(["queued", "running"]), resume: new Set(["paused"]),
  cancel: new Set(["validating", "queued", "running", "pausing", "paused"]),
};

function drawActions(job) {
  for (const [action, statuses] of Object.entries(ACTIONS)) {
    const button = document.getElementById(action);
    button.hidden = !statuses.has(job.status);
    button.onclick = async () => {
      button.disabled = true;
      try {
        drawActions(await api(`/jobs/${encodeURIComponent(job.id)}/${action}`, { method: "POST" }));
      } catch (error) {
        showError(error);
      } finally {
        button.disabled = false;
      }
    };
  }
}

function drawSummary(job, latest) {
  drawActions(job);
  const items = [
    ["Name", job.name], ["Status", job.status], ["Progress", progressBar(job)], ["ETA", eta(job)],
    ["Model", job.model], ["Method", job.method && job.method.type], ["Strategy", (job.resolved || {}).strategy || job.strategy],
    ["Workers", job.num_workers], ["Attempt", job.attempt], ["Restarts", job.restarts],
    ["Preemptions", job.preemptions], ["Resizes", job.resizes], ["Lost steps", job.lost_steps],
    ["Trained tokens", job.trained_tokens], ["Loss", latest.loss && latest.loss.toFixed(4)],
    ["Learning rate", latest.learning_rate && latest.learning_rate.toExponential(3)],
    ["Tokens/s", latest.tokens_per_s && Math.round(latest.tokens_per_s)],
    ["Error", job.error && `${job.error.code}: ${job.error.message}`], ["Artifact", job.artifact_path],
    ["Ray dashboard", job.ray_submission_id && dashboard
      ? link(`${dashboard}/#/jobs/${encodeURIComponent(job.ray_submission_id)}`, job.ray_submission_id) : null],
  ];
  const list = document.getElementById("summary");
  list.replaceChildren();
  for (const [name, value] of items) {
    if (value === null || value === undefined || value === "") continue;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    if (value instanceof Node) dd.appendChild(value);
    else dd.textContent = String(value);
    list.append(dt, dd);
  }
  document.getElementById("title").textContent = job.name ? `${job.name} (${job.id})` : job.id;
}

function fillTable(id, rows, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  for (const item of rows) {
    const row = body.insertRow();
    for (const value of columns(item)) cell(row, value);
  }
}

async function refreshJob(jobId) {
  const path = `/jobs/${encodeURIComponent(jobId)}`;
  const [job, metrics, events, checkpoints] = await Promise.all([
    api(path), api(`${path}/metrics`), api(`${path}/events?limit=1000`), api(`${path}/checkpoints`),
  ]);
  const points = metrics.data;
  drawSummary(job, points.length ? points[points.length - 1].values : {});
  drawMetrics(points);
  fillTable("events", events.data, (e) => [when(e.created_at), e.attempt, e.type, e.message]);
  fillTable("checkpoints", checkpoints.data, (c) => [c.step, c.reason, c.eval_loss && c.eval_loss.toFixed(4),
    c.best ? "best" : "", c.world_size, c.size_bytes ? `${(c.size_bytes / 1e6).toFixed(2)} MB` : null,
    c.save_seconds && c.save_seconds.toFixed(3), c.available ? c.model : "(pruned)"]);
  const samples = events.data.filter((e) => e.type === "eval_samples").flatMap((e) =>
    (e.data.samples || []).map((s) => [e.data.step, e.data.eval_loss && e.data.eval_loss.toFixed(4), s.prompt, s.reference, s.reply]));
  fillTable("eval-samples", samples, (row) => row);
  setupChat(job, checkpoints.data);
  if (job.status === "succeeded") {
    document.getElementById("manifest").textContent = JSON.stringify(await api(`${path}/manifest`), null, 2);
  }
  document.body.dataset.status = job.status;
  document.body.dataset.loaded = String(points.length);
  return TERMINAL.has(job.status);
}

// --- chat: the base model and a fine-tuned one (or a kept checkpoint) side by side -------

// Streams a chat completion into `target` (server-sent events from /v1/chat/completions).
async function streamChat(model, content, maxTokens, target) {
  target.textContent = "";
  target.dataset.done = "";
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (apiKey()) headers.Authorization = "Bearer " + apiKey();
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers,
    body: JSON.stringify({ model, messages: [{ role: "user", content }], max_tokens: maxTokens, temperature: 0, stream: true }),
  });
  if (!response.ok) {
    const err = (await response.json().catch(() => ({}))).error || {};
    throw new Error(`${response.status} ${err.message || response.statusText}`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const event of events) {
      const data = event.replace(/^data: /, "");
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices || []) {
        if (choice.delta && choice.delta.content) target.textContent += choice.delta.content;
        if (choice.finish_reason) target.dataset.finish = choice.finish_reason;
      }
    }
  }
  target.dataset.done = "1";
}

let chatReady = false;

function setupChat(job, checkpoints) {
  const models = [job.fine_tuned_model, ...checkpoints.filter((c) => c.available).map((c) => c.model).reverse()]
    .filter((m) => m);
  const select = document.getElementById("chat-model");
  if (!models.length || models.join() === [...select.options].map((o) => o.value).join()) return;
  const chosen = select.value;
  select.replaceChildren(...models.map((m) => new Option(m, m, false, m === chosen)));
  document.getElementById("chat").hidden = false;
  document.getElementById("chat-base-title").textContent = `Base: ${job.model}`;
  if (chatReady) return;
  chatReady = true;
  const form = document.getElementById("chat-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = new FormData(form);
    const maxTokens = Number(f.get("max_tokens")) || 64;
    document.getElementById("chat-tuned-title").textContent = `Fine-tuned: ${f.get("model")}`;
    // Each column on its own: a base model the servers do not hold shows its error there,
    // and the fine-tuned answer still comes.
    const columns = [[job.model, "chat-base"], [f.get("model"), "chat-tuned"]];
    await Promise.allSettled(columns.map(([model, id]) => {
      const target = document.getElementById(id);
      return streamChat(model, f.get("message"), maxTokens, target).catch((error) => {
        target.textContent = String(error.message || error);
        target.dataset.error = "1";
      });
    }));
  });
  // `?chat=<message>[&max_tokens=N]` in the page's address sends it at once (a link that shows
  // a comparison).
  const query = new URLSearchParams(location.search);
  if (query.get("chat")) {
    form.elements.message.value = query.get("chat");
    if (query.get("max_tokens")) form.elements.max_tokens.value = query.get("max_tokens");
    form.requestSubmit();
  }
}

// --- submit form ------------------------------------------------------------------------

function requestFromForm(form) {
  const f = new FormData(form);
  const number = (name) => (f.get(name) ? Number(f.get(name)) : undefined);
  const clean = (obj) => Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined && v !== ""));
  return clean({
    model: f.get("model"), training_file: f.get("training_file"),
    validation_file: f.get("validation_file") || undefined, name: f.get("name") || undefined,
    method: { type: f.get("method") }, strategy: f.get("strategy"),
    hyperparameters: clean({ max_steps: number("max_steps"), epochs: number("epochs"), learning_rate: number("learning_rate") }),
    scaling: clean({ min_workers: number("min_workers"), max_workers: number("max_workers") }),
  });
}

function setupForm() {
  const form = document.getElementById("submit-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const job = await api("/jobs", {
        method: "POST", body: JSON.stringify(requestFromForm(form)),
        headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() },
      });
      location.href = `/ui/jobs/${encodeURIComponent(job.id)}`;
    } catch (error) {
      showError(error);
    }
  });
}

// --- start ------------------------------------------------------------------------------

async function poll(refresh) {
  let done = false;
  try {
    done = await refresh();
    showError(null);
  } catch (error) {
    showError(error);
  }
  if (!done) setTimeout(() => poll(refresh), REFRESH_MS);
}

setupKeyField();
const adminLinks = setupAdminLinks();
const page = document.body.dataset.page;
if (page === "list") poll(async () => { await refreshList(); return false; });
if (page === "job") adminLinks.then(() => poll(() => refreshJob(document.body.dataset.jobId)));
if (page === "new") setupForm();
