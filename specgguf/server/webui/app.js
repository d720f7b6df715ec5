// specgguf's chat page: talks to this server's own /v1/chat/completions, nothing else.
// Model output is only ever put in the page as text (textContent, text nodes): no markup from
// the model is parsed, so an answer holding <script> or an onerror attribute shows as text.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { messages: [], controller: null, key: sessionStorage.getItem("specgguf-key") || "" };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

async function api(path, options = {}) {
  let resp = await fetch(path, { ...options, headers: headers() });
  if (resp.status === 401) {  // the server was started with --api-key: ask once, keep it for this tab
    const key = window.prompt("This server needs its API key (specgguf serve --api-key):");
    if (key) {
      state.key = key;
      sessionStorage.setItem("specgguf-key", key);
      resp = await fetch(path, { ...options, headers: headers() });
    }
  }
  return resp;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (e) {
    return `HTTP ${resp.status}`;
  }
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (text) div.textContent = text;
  $("chat").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function meta(div, text) {
  const span = document.createElement("span");
  span.className = "meta";
  span.textContent = text;
  div.appendChild(span);
}

// -- live statistics ------------------------------------------------------------------------
class Live {
  constructor() { this.rounds = []; this.generated = 0; this.decode = 0; }
  add(trace) {
    this.rounds.push(...trace.rounds);
    this.generated = trace.generated;
    this.decode = trace.decode_s;
    this.show();
  }
  show() {
    const n = this.rounds.length;
    $("tps").textContent = this.decode > 0 ? (this.generated / this.decode).toFixed(1) : "-";
    $("tau").textContent = n ? (this.generated / n).toFixed(2) : "-";
    const drafted = this.rounds.reduce((s, r) => s + r[0], 0), accepted = this.rounds.reduce((s, r) => s + r[1], 0);
    $("acc").textContent = drafted ? `${accepted}/${drafted} (${Math.round(100 * accepted / drafted)}%)` : "no drafts";
    const per = [], seen = [];
    for (const [d, a] of this.rounds) {
      for (let i = 0; i < d; i++) { seen[i] = (seen[i] || 0) + 1; per[i] = (per[i] || 0) + (i < a ? 1 : 0); }
    }
    bars(seen.map((s, i) => per[i] / s));
    sparkline($("lengths"), this.rounds.map((r) => r[0]));
  }
}

function bars(values) {
  const box = $("positions");
  box.replaceChildren();
  values.slice(0, 32).forEach((v, i) => {
    const bar = document.createElement("div");
    bar.style.height = Math.max(2, Math.round(100 * v)) + "%";
    bar.title = `position ${i + 1}: ${Math.round(100 * v)}% accepted`;
    box.appendChild(bar);
  });
}

const SVG = "http://www.w3.org/2000/svg";

function sparkline(svg, values, width = 200, height = 40) {
  svg.replaceChildren();
  if (!values.length) return;
  const top = Math.max(...values, 1), step = values.length > 1 ? width / (values.length - 1) : 0;
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (height - 4) * v / top).toFixed(1)}`).join(" "));
  svg.appendChild(line);
}

function finalStats(stats) {
  if (!stats) return;
  $("tps").textContent = stats.tokens_per_second ? stats.tokens_per_second.toFixed(1) : "-";
  $("tau").textContent = stats.tau ? stats.tau.toFixed(2) : "-";
  $("prompt").textContent = `${stats.prompt_tokens} tokens, ${stats.cached_tokens || 0} from the cache`;
  if (stats.accepted_by_position) bars(stats.accepted_by_position);
  if (stats.draft_lengths) sparkline($("lengths"), stats.draft_lengths);
}

// -- one answer, streamed -------------------------------------------------------------------
async function send(text) {
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant");
  const body = {
    model: $("model").dataset.id || "specgguf", messages: state.messages, stream: true,
    max_tokens: Number($("max-tokens").value) || 256, temperature: Number($("temperature").value) || 0,
    specgguf: { trace: true },
  };
  state.controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const live = new Live();
  let content = "", traced = "", stats = null, failed = null, stopped = false;
  try {
    const resp = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body),
                                                      signal: state.controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        for (const line of event.split(/\r?\n/)) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta && choice.delta.content) content += choice.delta.content;
          const trace = chunk.specgguf_trace;
          if (trace) {
            for (const [piece, drafted] of trace.tokens) {
              const span = document.createElement("span");
              span.className = drafted ? "d" : "t";
              span.textContent = piece;
              out.appendChild(span);
              traced += piece;
            }
            live.add(trace);
          } else if (choice && choice.delta && choice.delta.content) {
            out.appendChild(document.createTextNode(choice.delta.content));
            traced += choice.delta.content;
          }
          if (chunk.specgguf) stats = chunk.specgguf;
          out.scrollIntoView({ block: "end" });
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else failed = e.message || String(e);
  } finally {
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
  if (traced !== content) out.textContent = content;  // a stop string cut the tokens' text: show the answer
  if (failed !== null) {
    out.classList.add("error");
    out.textContent = content;
    out.appendChild(document.createTextNode((content ? "\n" : "") + "error: " + failed));
    state.messages.pop();  // the request failed: it is not part of the conversation
    return;
  }
  state.messages.push({ role: "assistant", content });
  finalStats(stats);
  meta(out, stopped ? "stopped" : (stats ? `${stats.generated_tokens} tokens, ${stats.tokens_per_second.toFixed(1)} tok/s, tau ${stats.tau.toFixed(2)}` : ""));
}

// -- the cost curve -------------------------------------------------------------------------
async function showCosts() {
  const box = $("costs");
  box.hidden = !box.hidden;
  if (box.hidden) return;
  const resp = await api("/specgguf/profile");
  if (!resp.ok) { $("costs-note").textContent = await errorText(resp); return; }
  const profile = await resp.json();
  const curve = profile.curve || [];
  $("costs-note").textContent = curve.length
    ? "verify + draft cost of a round by draft length (ms), from this server's measurements"
    : "nothing measured yet: generate with --draft-max auto first";
  const svg = $("curve");
  svg.replaceChildren();
  if (curve.length) {
    const ms = curve.map((r) => 1000 * (r.verify_s + r.draft_s)), top = Math.max(...ms), last = curve[curve.length - 1].n || 1;
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", curve.map((r, i) => `${(20 + 270 * r.n / last).toFixed(1)},${(110 - 100 * ms[i] / top).toFixed(1)}`).join(" "));
    svg.appendChild(line);
    for (const [x, y, label] of [[2, 12, `${top.toFixed(1)} ms`], [2, 110, "0"], [280, 118, `n=${last}`]]) {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = label;
      svg.appendChild(t);
    }
  }
  const rows = $("predicted").tBodies[0];
  rows.replaceChildren();
  for (const p of profile.predicted || []) {
    const tr = document.createElement("tr");
    for (const v of [p.acceptance.toFixed(2), p.n ? String(p.n) : "0 (plain)", p.speedup.toFixed(2) + "x"]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    rows.appendChild(tr);
  }
}

async function init() {
  try {
    const resp = await api("/v1/models");
    if (!resp.ok) throw new Error(await errorText(resp));
    const card = (await resp.json()).data[0];
    $("model").textContent = card.id;
    $("model").dataset.id = card.id;
    const ext = card.specgguf || {};
    $("drafter").textContent = "draft: " + (ext.draft || "none (plain decoding)");
  } catch (e) {
    $("model").textContent = "cannot reach the server: " + e.message;
  }
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value;
    if (!text.trim() || state.controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => { state.messages = []; $("chat").replaceChildren(); });
  $("show-costs").addEventListener("click", showCosts);
}

init();
