// The adder page: GET /api/adder and step through the residual stream, layer by layer.
"use strict";

const adder = { data: null, stage: 0 };
const $ = (id) => document.getElementById(id);

async function compute(event) {
  if (event) event.preventDefault();
  const params = new URLSearchParams({ a: $("a").value.trim(), b: $("b").value.trim(), design: $("design").value });
  if ($("design").value === "carry") params.set("digits", $("digits").value);
  const data = await cl.submit($("add"), $("status"), "computing…", "/api/adder?" + params.toString());
  if (data === null) return;
  adder.data = data;
  adder.stage = data.stages.length - 1;
  render();
}

function render() {
  const d = adder.data;
  $("results").classList.remove("hidden");
  const result = $("result");
  result.textContent = `${d.a} + ${d.b} = ${d.result}  ` + (d.correct ? "✓ correct" : `✗ wrong (expected ${d.expected})`);
  result.className = "result " + (d.correct ? "correct" : "wrong");
  result.dataset.result = d.result;
  $("readout").textContent = d.readout;
  $("stage").max = d.stages.length - 1;
  showStage(adder.stage);
}

function showStage(i) {
  const d = adder.data;
  adder.stage = Math.max(0, Math.min(d.stages.length - 1, i));
  const stage = d.stages[adder.stage];
  const before = adder.stage > 0 ? d.stages[adder.stage - 1].residual : null;
  $("stage").value = adder.stage;
  $("stage-label").textContent = `stage ${adder.stage + 1}/${d.stages.length}: ${stage.label}`;
  $("stage-label").dataset.stage = adder.stage;
  $("prev").disabled = adder.stage === 0;
  $("next").disabled = adder.stage === d.stages.length - 1;

  const head = cl.el("tr", {}, cl.el("th", { text: "pos" }), cl.el("th", { text: "token" }),
    ...d.coordinates.map((c) => cl.el("th", { text: c })));
  const rows = stage.residual.map((vec, t) => {
    const cells = vec.map((x, j) => {
      const changed = before && Math.abs(before[t][j] - x) > 1e-6;
      const cls = (changed ? "changed" : "") + (Math.abs(x) < 1e-9 ? " zero" : "");
      return cl.el("td", { class: cls.trim() || null, text: cl.fmt(x) });
    });
    return cl.el("tr", { class: t === d.eos_position ? "eos" : null, "data-token": t },
      cl.el("th", { text: t }), cl.el("th", { text: d.tokens[t] }), ...cells);
  });
  $("residual").replaceChildren(cl.el("thead", {}, head), cl.el("tbody", {}, ...rows));
  renderEos(stage.layer);
}

function renderEos(currentLayer) {
  const d = adder.data;
  const head = cl.el("tr", {}, cl.el("th", { text: "head" }),
    ...d.tokens.map((t, i) => cl.el("th", { text: `${i}:${t}` })));
  const rows = d.attention.map((a) => cl.el("tr", {
    class: a.layer === currentLayer ? "current-layer" : null, "data-head": a.name,
  }, cl.el("th", { text: a.name + (a.layer === currentLayer ? " ◀" : "") }),
  ...a.eos.map((w) => {
    const td = cl.el("td", { text: cl.fmt(w, 2), title: `weight ${w}` });
    td.style.background = cl.heat(w);
    td.style.color = w > 0.55 ? "#fff" : "";
    return td;
  })));
  $("eos-attention").replaceChildren(cl.el("thead", {}, head), cl.el("tbody", {}, ...rows));
}

document.addEventListener("DOMContentLoaded", () => {
  $("adder-form").addEventListener("submit", compute);
  $("design").addEventListener("change", () => {
    $("digits-label").classList.toggle("hidden", $("design").value !== "carry");
  });
  $("prev").addEventListener("click", () => showStage(adder.stage - 1));
  $("next").addEventListener("click", () => showStage(adder.stage + 1));
  $("stage").addEventListener("input", () => showStage(Number($("stage").value)));
  compute();
});
