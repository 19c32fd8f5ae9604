// The explorer page: POST /api/analyse and draw tokens, attention, logit lens and DLA.
"use strict";

const state = {
  model: null,        // GET /api/model
  result: null,       // the last POST /api/analyse answer
  targetId: null,     // a prediction chip's token id (the text box is used otherwise)
  selectedHead: null, // "L1H0"
};

const $ = (id) => document.getElementById(id);

async function loadModel() {
  const { ok, data } = await cl.api("/api/model");
  if (!ok || !data.loaded) {
    $("model-info").textContent = ok ? "no model loaded" : "model info unavailable";
    cl.status($("status"), data.message || data.detail, "error");
    $("analyse").disabled = true;
    return;
  }
  state.model = data;
  const c = data.config;
  $("model-info").textContent = `${data.checkpoint} · ${data.name || "model"}: ${c.n_layers} layers × ` +
    `${c.n_heads} heads, d_model ${c.d_model}, vocab ${c.d_vocab}, context ${c.n_ctx} · ` +
    `prompts up to ${data.limits.max_tokens} tokens`;
  $("prompt").maxLength = data.limits.max_prompt_chars;
}

async function analyse(event) {
  if (event) event.preventDefault();
  const body = { prompt: $("prompt").value };
  const targetText = $("target").value;
  if (state.targetId !== null) body.target = state.targetId;
  else if (targetText !== "") body.target = targetText;
  const data = await cl.submit($("analyse"), $("status"), "analysing…", "/api/analyse", body);
  if (data === null) return;
  state.result = data;
  render(data);
}

function headLabels(name) {
  const labels = (state.result && state.result.head_labels) || {};
  return labels[name] || [];
}

function render(data) {
  $("results").classList.remove("hidden");
  renderTokens(data.tokens);
  renderAttention(data);
  renderLens(data);
  renderDLA(data);
}

function renderTokens(tokens) {
  $("token-count").textContent = `(${tokens.length})`;
  const strip = $("tokens");
  strip.replaceChildren(...tokens.map((t, i) =>
    cl.el("span", { class: "token", "data-index": i, title: `position ${i}, token id ${t.id}` },
      cl.el("span", { class: "idx", text: i }), cl.visible(t.text))));
}

function highlightTokens(indices) {
  for (const node of $("tokens").children) {
    node.classList.toggle("hl", indices.includes(Number(node.dataset.index)));
  }
}

// ------------------------------------------------------------------ attention

function renderAttention(data) {
  const grid = $("heads");
  const T = data.tokens.length;
  const cell = Math.max(1, Math.min(14, Math.floor(150 / T)));
  const rows = [];
  data.attention.patterns.forEach((layer, l) => {
    const row = cl.el("div", { class: "layer-row", "data-layer": l }, cl.el("div", { class: "layer-name", text: `Layer ${l}` }));
    layer.forEach((pattern, h) => {
      const name = `L${l}H${h}`;
      const labels = headLabels(name);
      const canvas = cl.el("canvas", { width: T * cell, height: T * cell, "aria-label": `attention pattern of ${name}` });
      drawPattern(canvas, pattern, cell);
      canvas.addEventListener("mousemove", (e) => hoverPattern(e, name, pattern, cell, data.tokens));
      canvas.addEventListener("mouseleave", () => { $("attn-hover").textContent = ""; highlightTokens([]); });
      const box = cl.el("div", { class: "head", "data-head": name, "data-labels": labels.join(" "), title: `${name}: click to enlarge` },
        cl.el("div", { class: "head-title", text: name }),
        cl.el("div", { class: "head-labels", text: labels.join(", ") }),
        canvas);
      box.addEventListener("click", () => selectHead(name));
      row.append(box);
    });
    rows.push(row);
  });
  grid.replaceChildren(...rows);
  const keep = state.selectedHead && document.querySelector(`[data-head="${state.selectedHead}"]`);
  if (keep) selectHead(state.selectedHead);
  else { state.selectedHead = null; $("head-detail").classList.add("hidden"); }
}

function drawPattern(canvas, pattern, cell) {
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  pattern.forEach((row, q) => row.forEach((w, k) => {
    if (k > q) return; // causal: nothing above the diagonal
    ctx.fillStyle = cl.heat(w);
    ctx.fillRect(k * cell, q * cell, cell, cell);
  }));
}

function hoverPattern(event, name, pattern, cell, tokens) {
  const rect = event.target.getBoundingClientRect();
  const k = Math.floor((event.clientX - rect.left) / cell);
  const q = Math.floor((event.clientY - rect.top) / cell);
  if (q < 0 || k < 0 || q >= tokens.length || k >= tokens.length) return;
  $("attn-hover").textContent = `${name}: query ${q} "${cl.visible(tokens[q].text)}" → key ${k} ` +
    `"${cl.visible(tokens[k].text)}": ${cl.fmt(pattern[q][k], 4)}`;
  highlightTokens([q, k]);
}

function selectHead(name) {
  state.selectedHead = name;
  for (const node of document.querySelectorAll("[data-head]")) {
    node.classList.toggle("selected", node.dataset.head === name);
  }
  const [l, h] = name.slice(1).split("H").map(Number);
  const data = state.result;
  const pattern = data.attention.patterns[l][h];
  const T = data.tokens.length;
  const idx = [...Array(T).keys()];
  const ticks = data.tokens.map((t, i) => `${i} ${cl.esc(cl.visible(t.text))}`);
  const custom = pattern.map((row, q) => row.map((w, k) => [ticks[q], ticks[k]]));
  const detail = $("head-detail");
  detail.classList.remove("hidden");
  const labels = headLabels(name);
  Plotly.react(detail, [{
    type: "heatmap", z: pattern, x: idx, y: idx, customdata: custom, zmin: 0, zmax: 1,
    colorscale: [[0, cl.heat(0)], [0.5, cl.heat(0.5)], [1, cl.heat(1)]],
    hovertemplate: "query %{customdata[0]}<br>key %{customdata[1]}<br>weight %{z:.4f}<extra></extra>",
  }], {
    title: { text: `${name}${labels.length ? " (" + labels.join(", ") + ")" : ""}: rows query, columns key` },
    xaxis: { tickvals: idx, ticktext: ticks, side: "top" },
    yaxis: { title: { text: "query" }, tickvals: idx, ticktext: ticks, autorange: "reversed" },
    height: Math.min(700, 220 + 16 * T), margin: { l: 130, t: 130, r: 20, b: 20 },
  }, { displaylogo: false, responsive: true });
}

// ------------------------------------------------------------------ logit lens

function renderLens(data) {
  const lens = data.logit_lens;
  const T = data.tokens.length;
  const idx = [...Array(T).keys()];
  const ticks = data.tokens.map((t, i) => `${i} ${cl.esc(cl.visible(t.text))}`);
  const z = lens.top_probs.map((point) => point.map((row) => row[0]));
  const text = lens.top_strs.map((point) => point.map((row) => cl.esc(cl.visible(row[0]))));
  const hover = lens.top_strs.map((point, p) => point.map((row, i) =>
    row.map((s, j) => `${cl.esc(JSON.stringify(s))} ${cl.fmt(lens.top_probs[p][i][j], 3)}`).join("<br>")));
  Plotly.react($("lens"), [{
    type: "heatmap", z: z, x: idx, y: lens.labels.map((_, i) => i), text: text, customdata: hover,
    texttemplate: "%{text}", colorscale: "Viridis", zmin: 0, zmax: 1, colorbar: { title: { text: "top-1 p" } },
    hovertemplate: "after %{y}, input %{x}<br>%{customdata}<extra></extra>",
  }], {
    xaxis: { title: { text: "input position (the lens predicts the next token)" }, tickvals: idx, ticktext: ticks },
    yaxis: { tickvals: lens.labels.map((_, i) => i), ticktext: lens.labels },
    height: 160 + 45 * lens.labels.length, margin: { l: 60, t: 20, r: 20, b: 110 },
  }, { displaylogo: false, responsive: true });
}

// ------------------------------------------------------------------ direct logit attribution

function renderDLA(data) {
  const dla = data.dla;
  const pos = dla.position;
  $("dla-summary").textContent = `Each component's direct contribution to the logit of ` +
    `${JSON.stringify(dla.target.token)} (token ${dla.target.id}) after position ${pos} ` +
    `"${cl.visible(data.tokens[pos].text)}": logit ${cl.fmt(dla.logit)}, probability ` +
    `${cl.fmt(dla.target_prob)}; the parts plus the constant ${cl.fmt(dla.constant)} add up to the logit.`;
  $("predictions").replaceChildren(...dla.predictions.map((p) =>
    cl.el("button", {
      type: "button", class: "chip" + (p.id === dla.target.id ? " active" : ""), "data-token-id": p.id,
      title: `token ${p.id}`, onclick: () => { state.targetId = p.id; $("target").value = p.token; analyse(); },
    }, `${cl.visible(p.token)} ${cl.fmt(p.prob, 3)}`)));
  const names = dla.components.map((c) => c.component);
  const values = dla.components.map((c) => c.attribution);
  Plotly.react($("dla"), [{
    type: "bar", x: names, y: values, marker: { color: values.map((v) => (v >= 0 ? "#1f5fbf" : "#c0504d")) },
    hovertemplate: "%{x}: %{y:.4f}<extra></extra>",
  }], {
    yaxis: { title: { text: "direct logit contribution" }, zeroline: true },
    xaxis: { type: "category" }, height: 360, margin: { l: 70, t: 20, r: 20, b: 80 },
  }, { displaylogo: false, responsive: true });
}

document.addEventListener("DOMContentLoaded", () => {
  $("analyse-form").addEventListener("submit", analyse);
  $("target").addEventListener("input", () => { state.targetId = null; });
  loadModel();
});
