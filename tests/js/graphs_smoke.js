// Runs serve/static/graphs.js against a fake DOM and canned API answers (argv[2]: a JSON file mapping
// "GET /api/..." / "POST /api/..." to answers; argv[3]: the static folder), submits the compute form as the
// server's defaults left it, and prints the inputs' values, bounds and help, and the request it sent.
"use strict";
const { runPage, sent } = require("./fake_dom.js");

const names = ["node_threshold", "edge_threshold", "max_feature_nodes", "token_nodes"];
const values = { "compute-prompt": "Lily saw" };
for (const n of names) values["option-" + n] = "";
const byId = runPage("graphs.js", process.argv[2], process.argv[3], values, {
  location: { search: "" }, history: { replaceState() {} }, URLSearchParams, CLGraphView: { mount() {} },
});
for (const n of names) byId["option-" + n].step = n === "max_feature_nodes" ? "1" : (n === "token_nodes" ? "" : "0.01");

(async () => {
  const wait = () => new Promise((r) => setTimeout(r, 20));
  await wait();
  const shown = {};
  for (const n of names) {
    const input = byId["option-" + n];
    shown[n] = { value: input.value, min: input.min, max: input.max, title: input.title };
  }
  await byId["compute-form"].fire("submit");
  await wait();
  console.log(JSON.stringify({ shown, sent: sent.filter((s) => s.key.startsWith("POST /api/graphs/compute")) }));
})().catch((e) => { console.error("ERROR " + e.stack); process.exit(1); });
