// The feature browser: GET /api/dictionaries, /api/features, /api/feature; POST /api/features/prompt.
"use strict";

const fb = { dictionary: null, page: 0, pages: 1, selected: null, prompt: null, promptFeature: null };
const $ = (id) => document.getElementById(id);

// Activation -> orange shading with opacity value / top.
function shade(value, top) {
  const a = top > 0 && value > 0 ? Math.min(1, value / top) : 0;
  return "rgba(255,140,0," + a.toFixed(2) + ")";
}

async function loadDictionaries() {
  const { ok, data } = await cl.api("/api/dictionaries");
  const list = ok ? data.dictionaries : [];
  if (!list.length) {
    $("dict-info").textContent = "no dictionary loaded";
    cl.status($("status"), ok ? "start the server with `circuitlab serve --checkpoint RUN --dictionary DIR`"
      : data.detail, "error");
    for (const id of ["prev", "next", "goto-button", "run-prompt"]) $(id).disabled = true;
    return;
  }
  $("dictionary").replaceChildren(...list.map((d) => cl.el("option", { value: d.name, text: `${d.name} (${d.hook_name})` })));
  fb.info = Object.fromEntries(list.map((d) => [d.name, d]));
  selectDictionary(list[0].name);
}

function selectDictionary(name) {
  fb.dictionary = name;
  const d = fb.info[name];
  $("dict-info").textContent = `${d.hook_name} · ${d.d_sae} features · dashboards from ${d.n_tokens} tokens · ` +
    `${cl.fmt(100 * d.dead_fraction, 1)}% never fired`;
  fb.page = 0;
  loadPage();
}

async function loadPage() {
  const q = `?dictionary=${encodeURIComponent(fb.dictionary)}&page=${fb.page}&per_page=20&order=${$("order").value}`;
  const { ok, data } = await cl.api("/api/features" + q);
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  fb.pages = data.pages;
  $("page-label").textContent = `page ${data.page + 1} of ${data.pages}`;
  $("prev").disabled = data.page === 0;
  $("next").disabled = data.page + 1 >= data.pages;
  $("feature-list").replaceChildren(...data.features.map((f) => {
    const c = f.top_context;
    const snippet = c ? c.tokens.map(cl.visible).join("") : "(never active)";
    const row = cl.el("div", { class: "feature-row", "data-feature": f.feature },
      cl.el("b", { text: `#${f.feature}` }), ` density ${cl.fmt(100 * f.density, 3)}% · max ${cl.fmt(f.max_act)}`,
      cl.el("span", { class: "snippet", text: snippet }));
    row.addEventListener("click", () => showFeature(f.feature));
    return row;
  }));
  if (data.features.length && fb.selected === null) showFeature(data.features[0].feature);
}

async function showFeature(feature) {
  const q = `?dictionary=${encodeURIComponent(fb.dictionary)}&feature=${feature}`;
  const { ok, data } = await cl.api("/api/feature" + q);
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  cl.status($("status"), "");
  fb.selected = feature;
  for (const row of $("feature-list").children) row.classList.toggle("selected", Number(row.dataset.feature) === feature);
  $("feature-title").textContent = `Feature ${feature}`;
  $("feature-facts").textContent = `active on ${cl.fmt(100 * data.density, 3)}% of tokens · max ${cl.fmt(data.max_act)} · ` +
    `mean when active ${cl.fmt(data.mean_act)}`;
  const top = data.contexts.length ? data.contexts[0].value : 0;
  $("feature-contexts").replaceChildren(...(data.contexts.length ? data.contexts.map((c) =>
    cl.el("div", { class: "ctx-line" }, cl.el("span", { class: "val", text: cl.fmt(c.value) }),
      ...c.tokens.map((t, i) => cl.el("span", { class: i === c.at ? "tok at" : "tok", title: cl.fmt(c.acts[i]),
        style: `background:${shade(c.acts[i], top)}` }, cl.visible(t))))) : [cl.el("p", { class: "hint", text: "never active on these tokens" })]));
  drawHistogram($("feature-hist"), data.histogram);
  const chips = (list, cls) => (list || []).map((t) => cl.el("span", { class: "chip " + cls, title: cl.fmt(t.value) }, cl.visible(t.token)));
  $("feature-up").replaceChildren(...chips(data.logits && data.logits.promoted, "up"));
  $("feature-down").replaceChildren(...chips(data.logits && data.logits.suppressed, "down"));
  if (fb.prompt) shadePrompt(feature);
}

function drawHistogram(canvas, hist) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const used = hist.counts.map((c, i) => (c ? i : -1)).filter((i) => i >= 0);
  if (!used.length) return;
  const lo = used[0], hi = used[used.length - 1] + 1;
  const counts = hist.counts.slice(lo, hi), peak = Math.max(...counts), h = canvas.height - 16;
  const w = canvas.width / counts.length;
  ctx.fillStyle = "#1f5fbf";
  counts.forEach((c, i) => ctx.fillRect(i * w, h - (h * c) / peak, Math.max(1, w - 1), (h * c) / peak));
  ctx.fillStyle = "#5f6b7a";
  ctx.font = "10px sans-serif";
  ctx.fillText(cl.fmt(hist.edges[lo], 3), 0, canvas.height - 3);
  const right = cl.fmt(hist.edges[hi], 3);
  ctx.fillText(right, canvas.width - ctx.measureText(right).width, canvas.height - 3);
}

async function runPrompt(event) {
  event.preventDefault();
  const data = await cl.submit($("run-prompt"), $("status"), "running…", "/api/features/prompt",
    { dictionary: fb.dictionary, prompt: $("prompt").value, top: 5 });
  if (data === null) return;
  fb.prompt = data;
  $("prompt-features").replaceChildren(...data.features.map((f) => {
    const chip = cl.el("button", { type: "button", class: "chip", "data-feature": f.feature, text: `#${f.feature} (${cl.fmt(f.max)})` });
    chip.addEventListener("click", () => showFeature(f.feature));
    return chip;
  }));
  shadePrompt(data.features.length ? data.features[0].feature : null);
}

function shadePrompt(feature) {
  const data = fb.prompt;
  const f = data.features.find((x) => x.feature === feature);
  const top = f ? f.max : 0;
  for (const chip of $("prompt-features").children) chip.classList.toggle("active", Number(chip.dataset.feature) === feature);
  $("prompt-tokens").replaceChildren(...data.tokens.map((t, i) => {
    const strongest = data.per_token[i].map((x) => `#${x.feature} ${cl.fmt(x.value)}`).join(", ") || "no feature active";
    return cl.el("span", { class: "token", title: `position ${i}: ${strongest}`,
      style: f ? `background:${shade(f.acts[i], top)}` : null }, cl.visible(t));
  }));
}

$("dictionary").addEventListener("change", (e) => { fb.selected = null; selectDictionary(e.target.value); });
$("order").addEventListener("change", () => { fb.page = 0; loadPage(); });
$("prev").addEventListener("click", () => { if (fb.page > 0) { fb.page -= 1; loadPage(); } });
$("next").addEventListener("click", () => { if (fb.page + 1 < fb.pages) { fb.page += 1; loadPage(); } });
$("browse-form").addEventListener("submit", (e) => { e.preventDefault(); if ($("goto").value !== "") showFeature(Number($("goto").value)); });
$("prompt-form").addEventListener("submit", runPrompt);
loadDictionaries();
