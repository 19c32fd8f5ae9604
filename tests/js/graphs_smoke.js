// Runs the graph browser of viz/graph_view.js (CLGraphView.browse, what /graphs starts) against a fake DOM and
// canned API answers (argv[2]: a JSON file mapping "GET /api/..." / "POST /api/..." to answers; argv[3]: the
// static folder; argv[4]: graph_view.js; argv[5]: the served page's option inputs as JSON, {field: its step}), submits
// the compute form as the server's defaults left it, and prints the inputs' values, bounds and help, and the request
// it sent.
"use strict";
const { runPage, sent } = require("./fake_dom.js");

const steps = JSON.parse(process.argv[5]);
const names = Object.keys(steps);
const values = { "compute-prompt": "Lily saw" };
for (const n of names) values["option-" + n] = "";
const window = {};
const byId = runPage(process.argv[4], process.argv[2], process.argv[3], values, {
  window, location: { search: "" }, history: { replaceState() {} }, URLSearchParams,
});
for (const n of names) byId["option-" + n].step = steps[n];
window.CLGraphView.mount = () => {};   // no SVG in the fake DOM: the viewer itself is tested in a browser

(async () => {
  const wait = () => new Promise((r) => setTimeout(r, 20));
  window.CLGraphView.browse(byId.viewer, "/api/graphs");
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
