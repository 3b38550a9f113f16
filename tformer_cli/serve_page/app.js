// The page of `tformer serve`: translate with n-best lists, then explore the attention maps
// that /attention returns (attention[kind].weights[layer][head][row][col], 0-based).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, maps: null, row: 0 };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function setStatus(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.detail || `${response.status} ${response.statusText}`);
  return data;
}

// White to dark blue; text turns white on dark cells.
function shade(node, w) {
  const t = Math.max(0, Math.min(1, w));
  const rgb = [247 - 239 * t, 251 - 203 * t, 255 - 148 * t].map(Math.round);
  node.style.setProperty("background-color", `rgb(${rgb.join(",")})`);
  node.style.setProperty("color", t > 0.5 ? "#fff" : "#111");
}

const entropy = (row) => -row.reduce((s, p) => (p > 0 ? s + p * Math.log2(p) : s), 0);
const mean = (xs) => xs.reduce((s, x) => s + x, 0) / xs.length;
const meanOfHeads = (heads) =>
  heads[0].map((row, r) => row.map((_, c) => mean(heads.map((h) => h[r][c]))));

// ---------------------------------------------------------------- translate
async function loadModel() {
  try {
    const m = await api("model");
    state.model = m;
    const c = m.config.model;
    $("model-info").textContent =
      `run ${m.run} · ${m.layers.encoder}+${m.layers.decoder} layers · ${m.heads} heads · ` +
      `d_model ${c.d_model} · ${(m.parameters / 1e6).toFixed(2)}M parameters · ` +
      `${m.device} ${m.precision}`;
    for (const id of ["beam", "nbest"]) $(id).max = m.limits.max_beam;
    if (m.example && !$("texts").value) $("texts").value = m.example;  // from the run's own data
  } catch (e) {
    $("model-info").textContent = `Could not read the model: ${e.message}`;
  }
}

async function translate(event) {
  event.preventDefault();
  const texts = $("texts").value.split("\n").map((t) => t.trim()).filter(Boolean);
  if (!texts.length) {
    setStatus("Type a sentence first.", true);
    $("texts").focus();
    return;
  }
  const beam = Number($("beam").value);
  const nbest = Number($("nbest").value);
  setStatus("Translating…");
  $("translate-button").disabled = true;
  try {
    const start = performance.now();
    const { translations } = await api("translate", { texts, beam, nbest });
    const ms = Math.round(performance.now() - start);
    showTranslations(translations, beam);
    setStatus(`${texts.length} ${texts.length > 1 ? "sentences" : "sentence"} in ${ms} ms`);
    await inspect(translations[0].source, beam);
    await showTrace(translations[0].source, beam);
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    $("translate-button").disabled = false;
  }
}

function showTranslations(translations, beam) {
  const list = $("result-list");
  list.replaceChildren();
  for (const r of translations) {
    const hyps = el("ol", { class: "nbest" });
    r.hypotheses.forEach((h, i) => {
      hyps.append(el("li", { class: i === 0 ? "best" : "" },
        el("span", { class: "hyp", text: h.translation || "∅" }),
        el("span", { class: "score", title: "score (length-normalised)", text: h.score.toFixed(3) }),
        el("span", { class: "logprob", title: "log-probability", text: `log p ${h.logprob.toFixed(2)}` }),
      ));
    });
    const button = el("button", { type: "button", class: "inspect", text: "Attention" });
    button.addEventListener("click", () => inspect(r.source, beam));
    list.append(el("li", { class: "result" },
      el("p", { class: "source", text: r.source }), hyps, button));
  }
  $("results").hidden = false;
}

// ---------------------------------------------------------------- step-through search
async function showTrace(text, beam) {
  let t;
  try {
    t = await api("trace", { text, beam, top: 3 });
  } catch (e) {
    setStatus(e.message, true);
    return;
  }
  const nodes = new Map(t.steps.flat().map((h) => [h.id, h]));
  const children = new Map();
  for (const h of nodes.values()) {
    if (!children.has(h.parent)) children.set(h.parent, []);
    children.get(h.parent).push(h.id);
  }
  const node = (id) => {
    const h = nodes.get(id);
    const next = h.next.map((c) => el("span", {
      class: `candidate ${c.status}`, title: `${c.status}, log p ${c.logprob.toFixed(3)}`,
      text: `${c.token} ${c.p.toFixed(2)}`,
    }));
    return el("li", {},
      el("span", { class: "node", text: h.tokens.length ? h.tokens[h.tokens.length - 1] : "<s>" }),
      el("span", { class: "next" }, ...next),
      el("ul", {}, ...(children.get(id) || []).map(node)));
  };
  $("trace-sentence").textContent = `${t.source} · beam ${t.beam}, alpha ${t.alpha}`;
  $("trace-tree").replaceChildren(...(children.get(null) || []).map(node));
  $("trace-final").replaceChildren(...t.final.map((f) => el("li", {
    text: `${f.score.toFixed(3)}  ${f.text}${f.finished ? "" : " (cut off)"}`,
  })));
  $("trace").hidden = false;
}

// ---------------------------------------------------------------- attention
async function inspect(text, beam) {
  try {
    state.maps = await api("attention", { text, beam });
  } catch (e) {
    setStatus(e.message, true);
    return;
  }
  state.row = 0;
  $("attention-sentence").textContent = `${state.maps.source} → ${state.maps.translation}`;
  $("attention").hidden = false;
  fillLayers();
  render();
}

function fillLayers() {
  const kind = $("kind").value;
  const weights = state.maps.attention[kind].weights;
  const layer = $("layer");
  const keep = layer.value === "" ? weights.length - 1 : Math.min(Number(layer.value), weights.length - 1);
  layer.replaceChildren(...weights.map((_, i) => el("option", { value: i, text: `${i + 1}` })));
  layer.value = keep;
  const head = $("head");
  const wasHead = head.value || "mean";
  const heads = weights[0].length;
  head.replaceChildren(el("option", { value: "mean", text: "mean" }),
    ...weights[0].map((_, i) => el("option", { value: i, text: `${i + 1}` })));
  head.value = wasHead === "mean" || Number(wasHead) < heads ? wasHead : "mean";
}

function selection() {
  const kind = $("kind").value;
  const a = state.maps.attention[kind];
  const layer = Number($("layer").value);
  const head = $("head").value;
  const heads = a.weights[layer];
  const w = head === "mean" ? meanOfHeads(heads) : heads[Number(head)];
  state.row = Math.min(state.row, a.rows.length - 1);
  return { kind, a, layer, head, heads, w };
}

function render() {
  const s = selection();
  const name = s.head === "mean" ? `mean of ${s.heads.length} heads` : `head ${Number(s.head) + 1}`;
  const where = `layer ${s.layer + 1}, ${name}`;
  const rowsAre = s.kind === "encoder" ? "Source tokens" : "Target tokens";
  $("tokens-title").firstChild.textContent = `${rowsAre} `;
  renderTokens(s);
  renderStrip(s, where);
  renderHeatmap(s, where);
  renderEntropy(s);
}

function renderTokens(s) {
  const bar = $("tokens");
  bar.replaceChildren(...s.a.rows.map((token, i) => {
    const b = el("button", {
      type: "button", class: "token", "aria-pressed": String(i === state.row),
      tabindex: i === state.row ? "0" : "-1", "data-row": i, text: token,
    });
    b.addEventListener("click", () => selectRow(i));
    return b;
  }));
}

function selectRow(i, focus = false) {
  state.row = i;
  render();
  if (focus) $("tokens").children[i].focus();
}

function renderStrip(s, where) {
  const token = s.a.rows[state.row];
  const over = s.kind === "decoder" ? "the target prefix" : "the source";
  $("strip-title").textContent = `Where “${token}” looks over ${over} (${where})`;
  $("strip").replaceChildren(...s.a.cols.map((col, j) => {
    const w = s.w[state.row][j];
    const chip = el("span", { class: "chip", "data-w": w.toFixed(6), title: `${col}: ${(100 * w).toFixed(1)}%` },
      el("span", { class: "chip-token", text: col }),
      el("span", { class: "chip-weight", text: `${Math.round(100 * w)}%` }));
    shade(chip, w);
    return chip;
  }));
}

function renderHeatmap(s, where) {
  const table = $("heatmap");
  const head = el("tr", {}, el("th", { scope: "col" }));
  for (const col of s.a.cols) head.append(el("th", { scope: "col", class: "col", text: col }));
  const body = el("tbody");
  s.w.forEach((row, i) => {
    const label = el("button", { type: "button", class: "row-label", tabindex: "-1", text: s.a.rows[i] });
    label.addEventListener("click", () => selectRow(i));
    const tr = el("tr", { class: i === state.row ? "selected" : "" }, el("th", { scope: "row" }, label));
    row.forEach((w, j) => {
      const td = el("td", { "data-w": w.toFixed(6), title: `${s.a.rows[i]} → ${s.a.cols[j]}: ${w.toFixed(3)}` });
      shade(td, w);
      tr.append(td);
    });
    body.append(tr);
  });
  table.replaceChildren(el("thead", {}, head), body);
  const rows = s.kind === "encoder" ? "source" : "target";
  const cols = s.kind === "decoder" ? "target prefix" : "source";
  $("heatmap-caption").textContent = `${s.kind}: rows ${rows}, columns ${cols}; ${where}`;
}

function renderEntropy(s) {
  const rows = [...s.heads.map((w, i) => [String(i), `${i + 1}`, w]), ["mean", "mean", meanOfHeads(s.heads)]];
  $("entropy").tBodies[0].replaceChildren(...rows.map(([value, label, w]) => {
    const pick = el("button", { type: "button", class: "head-pick", text: label, "aria-pressed": String(value === s.head) });
    pick.addEventListener("click", () => {
      $("head").value = value;
      render();
    });
    return el("tr", { class: value === s.head ? "selected" : "" },
      el("th", { scope: "row" }, pick),
      el("td", { text: mean(w.map(entropy)).toFixed(2) }),
      el("td", { text: entropy(w[state.row]).toFixed(2) }));
  }));
}

function onTokenKey(event) {
  const n = $("tokens").children.length;
  const moves = { ArrowLeft: state.row - 1, ArrowRight: state.row + 1, Home: 0, End: n - 1 };
  if (!(event.key in moves)) return;
  event.preventDefault();
  selectRow(Math.max(0, Math.min(n - 1, moves[event.key])), true);
}

document.addEventListener("DOMContentLoaded", () => {
  $("translate-form").addEventListener("submit", translate);
  $("texts").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("translate-form").requestSubmit();
  });
  $("tokens").addEventListener("keydown", onTokenKey);
  $("kind").addEventListener("change", () => { fillLayers(); render(); });
  for (const id of ["layer", "head"]) $(id).addEventListener("change", render);
  loadModel();
});
