// The inputs page: POST /api/attribute (tokens shaded per method), POST /api/lens (logit lens and tuned lens
// layer by layer), POST /api/steer (a contrast direction by coefficient). The attribution form is drawn from
// GET /api/attribute/form: the registered techniques, each option's input (default, bounds, help), the baselines.
"use strict";

const $ = (id) => document.getElementById(id);
const optionInputs = {};   // option name -> [its input, its JSON schema]

// One input per technique option: a number (bounds from the schema), a checkbox, a choice or text.
function optionInput(name, o, takes) {
  const one = (o.anyOf || [o]).find((x) => x.type !== "null") || {};
  let input;
  if (one.type === "boolean") {
    input = cl.el("input", { type: "checkbox", title: o.description });
    input.checked = o.default === true;
  } else if (one.enum) {
    input = cl.el("select", { title: o.description }, ...one.enum.map((v) => cl.el("option", { value: v, text: v })));
  } else if (one.type === "integer" || one.type === "number") {
    const low = one.minimum !== undefined ? one.minimum : one.exclusiveMinimum;
    input = cl.el("input", { type: "number", title: o.description, min: low, max: one.maximum,
      step: one.type === "integer" ? 1 : "any" });
  } else {
    input = cl.el("input", { type: "text", autocomplete: "off", title: o.description });
  }
  if (one.type !== "boolean" && o.default !== null && o.default !== undefined) input.value = String(o.default);
  optionInputs[name] = [input, one];
  return cl.el("label", {}, `${takes.join("/")} ${name.replace(/_/g, " ")}`, input);
}

async function loadForm() {
  const { ok, data } = await cl.api("/api/attribute/form");
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  $("method").replaceChildren(cl.el("option", { value: "all", text: "all methods" }),
    ...data.methods.map((m) => cl.el("option", { value: m.name, text: m.label })));
  $("method").value = "all";
  $("technique-options").replaceChildren(...Object.entries(data.options).map(([name, o]) =>
    optionInput(name, o, data.takes[name] || [])));
  $("baseline").replaceChildren(...data.baselines.map((b) => cl.el("option", { value: b.name, text: b.label })));
  $("baseline").value = data.baselines[0].name;
}

function optionValues() {
  const body = {};
  for (const [name, [input, one]] of Object.entries(optionInputs)) {
    if (one.type === "boolean") body[name] = Boolean(input.checked);
    else if (input.value === "") continue;   // empty: the server's default
    else body[name] = one.type === "integer" || one.type === "number" ? Number(input.value) : input.value;
  }
  return body;
}

// Score -> blue (positive) or red (negative), opacity |score| / scale.
function shade(score, scale) {
  const a = scale > 0 ? Math.min(1, Math.abs(score) / scale) : 0;
  return (score >= 0 ? "rgba(33,102,172," : "rgba(178,24,43,") + a.toFixed(3) + ")";
}

function tokenLine(label, tokens, scores, at) {
  const scale = Math.max(0, ...scores.map(Math.abs));
  return cl.el("div", { class: "attr-line" }, cl.el("span", { class: "method", text: label }),
    ...tokens.map((t, i) => cl.el("span", { class: i === at ? "token at" : "token", title: `pos ${i}: ${cl.fmt(scores[i], 4)}`,
      style: `background:${shade(scores[i], scale)}` }, cl.visible(t))));
}

async function loadModel() {
  const { ok, data } = await cl.api("/api/model");
  if (!ok || !data.loaded) {
    $("model-info").textContent = "no model loaded";
    cl.status($("status"), ok ? data.message : data.detail, "error");
    for (const id of ["run", "steer"]) $(id).disabled = true;
    return;
  }
  const c = data.config || {};
  $("model-info").textContent = `${data.checkpoint} · ${c.n_layers} layers`;
  $("layer").max = Math.max(0, (c.n_layers || 1) - 1);
}

async function runAttribution(event) {
  event.preventDefault();
  const body = { prompt: $("prompt").value, method: $("method").value, baseline: $("baseline").value,
    ...optionValues() };
  if ($("target").value !== "") body.target = $("target").value;
  if ($("foil").value !== "") body.foil = $("foil").value;
  const data = await cl.submit($("run"), $("status"), "attributing…", "/api/attribute", body);
  if (data === null) return;
  const last = data.tokens.length - 1;
  $("explained").textContent = `explained: the logit of ${JSON.stringify(data.target.token)} (p = ${cl.fmt(data.target.prob)})` +
    (data.foil ? ` minus that of ${JSON.stringify(data.foil.token)} (p = ${cl.fmt(data.foil.prob)})` : "") +
    " after the outlined token";
  const lines = [];
  for (const [method, r] of Object.entries(data.methods)) {
    const note = r.samples !== undefined ? ` (${r.samples} coalitions, ${r.baseline} baseline, surrogate R² ${cl.fmt(r.surrogate_r2, 2)})`
      : r.completeness_error === null ? "" : ` (completeness error ${(100 * r.completeness_error).toPrecision(2)}%)`;
    lines.push(tokenLine(method + note, data.tokens, r.scores, last));
    if (r.per_layer && $("method").value === "context-mixing") {
      r.per_layer.forEach((row, l) => lines.push(tokenLine(`  layer ${l}`, data.tokens, row, last)));
    }
  }
  $("attribution").replaceChildren(...lines);
  await runLens(body.prompt);
}

async function runLens(prompt) {
  const { ok, data } = await cl.api("/api/lens", { prompt: prompt });
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  $("lens-note").textContent = data.tuned_available
    ? "KL to the model's final distribution (mean over the prompt's positions) and the top next token at the last position."
    : "No tuned lens loaded (train one with `circuitlab lens train --checkpoint RUN`, or start the server with --lens DIR): the logit lens alone.";
  const views = data.tuned_available ? ["logit", "tuned"] : ["logit"];
  const last = data.tokens.length - 1;
  const head = cl.el("tr", {}, cl.el("th", { text: "residual after" }),
    ...views.map((v) => cl.el("th", { text: `${v} lens KL` })), ...views.map((v) => cl.el("th", { text: `${v} lens top token` })));
  const rows = data.labels.map((label, i) => cl.el("tr", {}, cl.el("th", { text: label }),
    ...views.map((v) => cl.el("td", { text: cl.fmt(data[v].mean_kl[i], 4) })),
    ...views.map((v) => cl.el("td", { text: `${cl.visible(data[v].top[i][last])} ${cl.fmt(data[v].top_prob[i][last], 2)}` }))));
  $("lens").replaceChildren(cl.el("table", { class: "grid" }, cl.el("thead", {}, head), cl.el("tbody", {}, ...rows)));
}

async function runSteer(event) {
  event.preventDefault();
  const lines = (id) => $(id).value.split("\n").filter((s) => s.trim() !== "");
  const coefs = $("coefs").value.split(/[\s,]+/).filter((s) => s !== "").map(Number);
  const data = await cl.submit($("steer"), $("steer-status"), "steering…", "/api/steer", {
    positive: lines("positive"), negative: lines("negative"), layer: Number($("layer").value), coefs: coefs,
    prompt: $("steer-prompt").value });
  if (data === null) return;
  const head = cl.el("tr", {}, ...["coefficient", "preference (nats/token)", "loss cost", "greedy continuation"]
    .map((t) => cl.el("th", { text: t })));
  const rows = data.coefs.map((c, i) => cl.el("tr", {}, cl.el("td", { text: cl.fmt(c) }),
    cl.el("td", { text: cl.fmt(data.preference[i], 4) }), cl.el("td", { text: cl.fmt(data.loss_cost[i], 4) }),
    cl.el("td", { style: "text-align:left;white-space:pre-wrap", text: data.generations[i] })));
  $("steering").replaceChildren(cl.el("p", { class: "hint", text: `direction at ${data.hook_name}, norm ${cl.fmt(data.norm)}` }),
    cl.el("table", { class: "grid" }, cl.el("thead", {}, head), cl.el("tbody", {}, ...rows)));
}

$("attribute-form").addEventListener("submit", runAttribution);
$("steer-form").addEventListener("submit", runSteer);
loadForm();
loadModel();
