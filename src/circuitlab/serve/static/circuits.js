// The circuit browser: GET /api/circuits, /api/circuit, /api/circuit.svg; POST /api/circuits/run.
"use strict";

const $ = (id) => document.getElementById(id);

function table(node, head, rows) {
  node.replaceChildren(
    cl.el("tr", {}, ...head.map((h) => cl.el("th", { text: h }))),
    ...rows.map((r) => cl.el("tr", {}, ...r.map((x) => cl.el("td", { text: typeof x === "number" ? cl.fmt(x, 4) : x })))));
}

async function listCircuits(select) {
  const { ok, data } = await cl.api("/api/circuits");
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  $("run").disabled = !data.can_run;
  $("circuit-info").textContent = data.can_run ? "discovery runs on the loaded model"
    : "no model loaded: showing saved circuits (start with --checkpoint RUN to run discovery)";
  $("circuit").replaceChildren(...data.circuits.map((c) =>
    cl.el("option", { value: c.name, text: `${c.name} (${c.n_edges} of ${c.of} edges)` })));
  if (!data.circuits.length) {
    cl.status($("status"), "no circuit yet: run discovery above, or start the server with --circuit DIR");
    return;
  }
  $("circuit").value = select || data.circuits[0].name;
  showCircuit($("circuit").value);
}

async function showCircuit(name) {
  const { ok, data } = await cl.api("/api/circuit?name=" + encodeURIComponent(name));
  if (!ok) { cl.status($("status"), data.detail, "error"); return; }
  $("circuit-title").textContent = `Circuit: ${data.name}`;
  $("circuit-summary").replaceChildren(...[data.data, ...data.summary].filter(Boolean).map((s) => cl.el("li", { text: s })));
  $("circuit-svg").src = "/api/circuit.svg?name=" + encodeURIComponent(name) + "&t=" + Date.now();
  const f = data.faithfulness;
  table($("curve"), ["edges kept", "n", "f"], f.fractions.map((x, i) => [`${cl.fmt(100 * x, 2)}%`, f.n_edges[i], f.faithfulness[i]]));
  table($("edges-table"), ["from", "to", "score"], data.circuit.edges.map((e) => [e[0], e[1], e[2] === null ? "" : e[2]]));
  table($("top-table"), ["from", "to", "score"], data.top_edges.map((e) => [e[0], e[1], e[2]]));
}

$("circuit").addEventListener("change", () => showCircuit($("circuit").value));
$("run-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = { task: $("task").value, corruption: $("corruption").value, method: $("method").value,
    metric: $("metric").value };
  if ($("edges").value) body.edges = Number($("edges").value);
  const data = await cl.submit($("run"), $("status"), "finding the circuit…", "/api/circuits/run", body);
  if (data) listCircuits(data.name);
});
listCircuits();
