// nano-vLLM dashboard: draws the engine snapshots that /dashboard/events streams.
// Hand-written, no libraries: a grid of divs for the KV pool, a table for the requests,
// and small canvas charts for the steps and the /metrics counters.
"use strict";

const query = window.location.search;  // forwarded, so a key in the page URL reaches the API
const pool = document.getElementById("pool");
const tooltip = document.getElementById("tooltip");
const HISTORY = 120;  // chart points kept (one a frame, at most ~10 a second)
let cells = [];
let lastFrame = null;
let samples = [];  // {time, counters}, for rates over a sliding window
let groupWindows = [null];  // per KV cache group: its window, null for full attention
const series = {throughput: [], ttft: [], itl: [], hits: [], preemptions: []};

const colours = new Map();  // request id -> its colour, in order of first appearance
function colour(id) {
  if (!colours.has(id)) {  // golden-angle steps: neighbours in time get distant hues
    colours.set(id, `hsl(${(colours.size * 137.508 + 200) % 360} 65% 50%)`);
  }
  return colours.get(id);
}
function shortId(id) { return id.length > 14 ? "…" + id.slice(-12) : id; }

function buildGrid(numBlocks) {
  pool.textContent = "";
  cells = [null];  // block 0 is the dummy, never drawn
  for (let id = 1; id < numBlocks; id++) {
    const cell = document.createElement("div");
    cell.className = "block free";
    cell.dataset.block = id;
    pool.appendChild(cell);
    cells.push(cell);
  }
}

function drawPool(frame) {
  if (cells.length !== frame.num_blocks) buildGrid(frame.num_blocks);
  let used = 0, cached = 0, shared = 0;
  for (let id = 1; id < frame.num_blocks; id++) {
    const ref = frame.refs[id], cell = cells[id];
    let cls = "block free", bg = "";
    if (ref < 0) { cls = "block cached"; cached++; }
    else if (ref > 0) {
      used++;
      cls = ref > 1 ? "block used shared" : "block used";
      if (ref > 1) shared++;
      bg = colour(frame.requests[frame.owners[id]].id);
    }
    if (cell.className !== cls) cell.className = cls;
    if (cell.style.background !== bg) cell.style.background = bg;
    cell.dataset.ref = ref;
  }
  const free = frame.num_blocks - 1 - used - cached;
  groupWindows = frame.group_windows || [null];
  const groups = groupWindows.length > 1
    ? ` (${groupWindows.length} KV cache groups of ${frame.group_size} layers)` : "";
  document.getElementById("pool-counts").textContent =
    `${frame.num_blocks - 1} blocks of ${frame.block_size} tokens${groups}: ${used} in use ` +
    `(${shared} shared), ${cached} cached-free, ${free} free`;
}

function bar(parts, total) {
  const el = document.createElement("div");
  el.className = "bar";
  for (const [cls, n] of parts) {
    if (n <= 0) continue;
    const s = document.createElement("span");
    s.className = cls;
    s.style.width = `${(100 * n / Math.max(total, 1)).toFixed(2)}%`;
    el.appendChild(s);
  }
  return el;
}

function drawRequests(frame) {
  const body = document.querySelector("#requests tbody");
  body.textContent = "";
  let running = 0;
  for (const r of frame.requests) {
    if (r.status === "running") running++;
    const row = document.createElement("tr");
    row.className = `request ${r.status}`;
    row.dataset.request = r.id;
    const computedPrompt = Math.min(r.computed, r.prompt);
    const cachedNow = r.status === "running" ? Math.min(r.cached, computedPrompt) : 0;
    const prompt = bar([["cached", cachedNow], ["computed", computedPrompt - cachedNow],
                        ["todo", r.prompt - computedPrompt]], r.prompt);
    const promptText = `${r.cached} / ${computedPrompt - cachedNow} / ${r.prompt - computedPrompt}`;
    const output = bar([["out", r.output]], r.max_tokens);
    const cellsHtml = [
      `<td class="swatch-cell"><i style="background:${colour(r.id)}"></i></td>`,
      `<td title="${r.id}">${shortId(r.id)}</td>`, `<td>${r.status}</td>`,
      `<td><div class="cellbar prompt"></div></td>`, `<td><div class="cellbar output"></div></td>`,
      `<td class="blocks">${r.blocks} (<span class="shared-count">${r.shared_blocks}</span>)` +
        (r.left_behind ? `, <span class="left-behind">${r.left_behind} given back</span>` : "") +
        `</td>`,
      `<td class="preemptions">${r.preemptions}</td>`];
    row.innerHTML = cellsHtml.join("");
    const p = row.querySelector(".prompt"), o = row.querySelector(".output");
    p.appendChild(prompt);
    p.insertAdjacentHTML("beforeend", `<span class="bartext">${promptText}</span>`);
    o.appendChild(output);
    o.insertAdjacentHTML("beforeend", `<span class="bartext">${r.output} / ${r.max_tokens}</span>`);
    body.appendChild(row);
  }
  document.getElementById("request-counts").textContent =
    `${running} running of ${frame.max_num_seqs} seats, ${frame.requests.length - running} waiting`;
}

function axes(ctx, w, h) {
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#dde1e8";
  ctx.beginPath(); ctx.moveTo(30, h - 14); ctx.lineTo(w, h - 14); ctx.stroke();
}

function drawSteps(frame) {
  // Tokens on a square-root scale: a 3-token decode step stays visible beside a full budget.
  const canvas = document.getElementById("steps"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, top = 10, bottom = h - 14, left = 34, right = w - 40;
  axes(ctx, w, h);
  const steps = frame.steps, budget = frame.token_budget;
  const maxTokens = Math.max(budget, ...steps.map(s => s[1] + s[2]));
  const maxMs = Math.max(1, ...steps.map(s => s[3]));
  const y = t => bottom - (bottom - top) * Math.sqrt(t / maxTokens);
  const barW = (right - left) / HISTORY;
  steps.forEach((s, i) => {
    const x = left + i * barW;
    ctx.fillStyle = "#1c7ed6"; ctx.fillRect(x, y(s[2]), barW - 1, bottom - y(s[2]));
    ctx.fillStyle = "#f08c00"; ctx.fillRect(x, y(s[1] + s[2]), barW - 1, y(s[2]) - y(s[1] + s[2]));
  });
  ctx.fillStyle = "#8a93a6"; ctx.font = "10px sans-serif";
  for (const tick of [16, 64, 256, 1024, 4096].filter(t => t < maxTokens * 0.8)) {
    ctx.fillText(String(tick), 2, y(tick) + 3);
    ctx.strokeStyle = "#eef0f4"; ctx.beginPath(); ctx.moveTo(left, y(tick)); ctx.lineTo(right, y(tick)); ctx.stroke();
  }
  ctx.strokeStyle = "#c92a2a"; ctx.beginPath(); ctx.moveTo(left, y(budget)); ctx.lineTo(right, y(budget)); ctx.stroke();
  ctx.strokeStyle = "#2b8a3e"; ctx.beginPath();
  steps.forEach((s, i) => {
    const x = left + i * barW + barW / 2, yy = bottom - (bottom - top) * s[3] / maxMs;
    if (i === 0) ctx.moveTo(x, yy); else ctx.lineTo(x, yy);
  });
  ctx.stroke();
  ctx.fillStyle = "#5b6478";
  ctx.fillText(String(maxTokens), 2, top + 8); ctx.fillText("0", 2, bottom);
  ctx.fillText(`${maxMs.toFixed(0)} ms`, right + 4, top + 8);
  ctx.fillText("0 ms", right + 4, bottom);
  const last = steps[steps.length - 1];
  document.getElementById("step-counts").textContent = last ?
    `step ${last[0]}: ${last[1]} prefill + ${last[2]} decode tokens of a ${budget}-token budget, ` +
    `${last[3].toFixed(1)} ms, ${last[4]} running, ${last[5]} waiting` : "no steps yet";
}

function addSample(time, counters) {
  samples.push({time, counters});
  while (samples.length > 2 && time - samples[0].time > 2.0) samples.shift();  // ~2 s window
  const a = samples[0].counters, b = counters, dt = Math.max(time - samples[0].time, 1e-3);
  const mean = (sum, count) => (b[count] - a[count]) > 0 ?
    1000 * (b[sum] - a[sum]) / (b[count] - a[count]) : null;
  const queries = b.prefix_queries - a.prefix_queries;
  const point = {
    throughput: samples.length > 1 ? (b.generation_tokens - a.generation_tokens) / dt : 0,
    ttft: mean("ttft_sum", "ttft_count"), itl: mean("itl_sum", "itl_count"),
    hits: queries > 0 ? 100 * (b.prefix_hits - a.prefix_hits) / queries : null,
    preemptions: b.preemptions,
  };
  for (const key of Object.keys(series)) {
    const prev = series[key].length ? series[key][series[key].length - 1] : null;
    // None observed in the window: hold the last value (at first, the mean since start).
    series[key].push(point[key] ?? prev ?? sinceStart(key, b));
    if (series[key].length > HISTORY) series[key].shift();
  }
}

function sinceStart(key, c) {
  if (key === "ttft" && c.ttft_count > 0) return 1000 * c.ttft_sum / c.ttft_count;
  if (key === "itl" && c.itl_count > 0) return 1000 * c.itl_sum / c.itl_count;
  if (key === "hits" && c.prefix_queries > 0) return 100 * c.prefix_hits / c.prefix_queries;
  return null;
}

function drawChart(id, values, colourName) {
  const canvas = document.getElementById(id), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, top = 12, bottom = h - 14, left = 30;
  axes(ctx, w, h);
  const known = values.filter(v => v !== null);
  const max = Math.max(1e-9, ...known) * 1.1;
  ctx.strokeStyle = colourName; ctx.lineWidth = 1.5; ctx.beginPath();
  let pen = false;
  values.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    const x = left + (w - left) * i / HISTORY, y = bottom - (bottom - top) * v / max;
    if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    pen = true;
  });
  ctx.stroke(); ctx.lineWidth = 1;
  const latest = known.length ? known[known.length - 1] : null;
  ctx.fillStyle = "#1d2330"; ctx.font = "11px sans-serif";
  ctx.fillText(latest === null ? "–" : latest.toFixed(latest < 10 ? 1 : 0), left + 4, top);
  ctx.fillStyle = "#8a93a6"; ctx.font = "10px sans-serif";
  ctx.fillText((max / 1.1).toFixed(max < 11 ? 1 : 0), 2, top + 8);
}

function drawCharts() {
  drawChart("chart-throughput", series.throughput, "#1c7ed6");
  drawChart("chart-ttft", series.ttft, "#f08c00");
  drawChart("chart-itl", series.itl, "#7048e8");
  drawChart("chart-hits", series.hits, "#2f9e44");
  drawChart("chart-preemptions", series.preemptions, "#c92a2a");
}

function onSnapshot(event) {
  const message = JSON.parse(event.data), frame = message.frame;
  if (!lastFrame || frame.seq !== lastFrame.seq) {
    drawPool(frame); drawRequests(frame); drawSteps(frame);
  }
  lastFrame = frame;
  addSample(message.time, message.counters);
  drawCharts();
  statusLine.textContent =
    `live · step ${frame.step} · snapshot ${frame.seq} · ${new Date(message.time * 1000).toLocaleTimeString()}`;
  document.body.dataset.seq = frame.seq;
}

// Tooltips: a block's details (token text, hash chain) are fetched when hovered.
let hovered = null;
pool.addEventListener("mouseover", async event => {
  const id = event.target.dataset && event.target.dataset.block;
  if (!id) return;
  hovered = id;
  tooltip.hidden = false;
  tooltip.style.left = `${Math.min(event.clientX + 14, window.innerWidth - 430)}px`;
  tooltip.style.top = `${event.clientY + 14}px`;
  tooltip.textContent = `block ${id}…`;
  const response = await fetch(`dashboard/blocks/${id}${query}`);
  const b = await response.json();
  if (hovered !== id) return;
  if (b.error) { tooltip.textContent = b.error.message; return; }
  const lines = [`block ${b.block_id}: ${b.state}, ref count ${b.ref_count}`];
  if (b.owners.length) lines.push(`held by ${b.owners.join(", ")}`);
  if (b.state === "used" && groupWindows.length > 1) {
    const w = groupWindows[b.group];
    lines.push(`KV cache group ${b.group}: ${w === null ? "full attention" : `window of ${w}`}`);
  }
  if (b.position !== null) {
    lines.push(`hash chain: block #${b.position} of its sequence` +
               (b.token_range ? `, tokens ${b.token_range[0]}–${b.token_range[1]}` : ""));
  }
  lines.push(b.hash ? `hash ${b.hash}…, parent ${b.parent_hash ? b.parent_hash + "…" : "none (first block)"}`
                    : "not hashed (not full yet, or not findable)");
  tooltip.textContent = lines.join("\n") + "\n";
  const text = document.createElement("code");
  text.textContent = b.text ? JSON.stringify(b.text) : "(no tokens)";
  tooltip.appendChild(text);
});
pool.addEventListener("mouseleave", () => { hovered = null; tooltip.hidden = true; });

// The models the server serves, in a picker (shown when there are several): choosing one
// reloads the page with ?model=NAME, which the stream and the tooltips then carry.
const statusLine = document.getElementById("status");
const picker = document.getElementById("model");
const RETRY_MS = 3000;
picker.addEventListener("change", () => {
  const params = new URLSearchParams(window.location.search);
  params.set("model", picker.value);
  window.location.search = params.toString();
});

async function currentModel() {
  const response = await fetch(`dashboard/models${query}`);
  if (!response.ok) throw new Error(`dashboard/models: HTTP ${response.status}`);
  const listing = await response.json();
  picker.textContent = "";
  for (const card of listing.data) {
    const label = card.state === "loaded" ? card.id : `${card.id} (${card.state})`;
    picker.add(new Option(label, card.id, false, card.id === listing.current));
  }
  picker.hidden = listing.data.length < 2;
  document.getElementById("model-name").textContent = listing.current;
  document.title = `nano-vLLM · ${listing.current}`;
  return listing.data.find(card => card.id === listing.current);
}

// Stream the model's snapshots while it is loaded; when it is not (or stops: an unloaded
// model ends its stream), say so and look again every few seconds.
async function connect() {
  let card;
  try { card = await currentModel(); } catch (error) {
    statusLine.textContent = `${error.message}: retrying…`;
    setTimeout(connect, RETRY_MS);
    return;
  }
  if (card.kv_cache === false) {
    statusLine.textContent = "no paged KV cache to show (an embedding model)";
    return;
  }
  if (card.state !== "loaded") {
    statusLine.textContent = `${card.state}: shown once loaded (watching does not load it)`;
    setTimeout(connect, RETRY_MS);
    return;
  }
  const source = new EventSource(`dashboard/events${query}`);
  source.addEventListener("snapshot", onSnapshot);
  source.onerror = () => {
    statusLine.textContent = "disconnected: retrying…";
    source.close();
    setTimeout(connect, RETRY_MS);
  };
}
connect();
