// Runs serve/static/inputs.js against a fake DOM and canned API answers (argv[2]: a JSON file mapping
// "GET /api/..." / "POST /api/..." to answers; argv[3]: the static folder), submits its two forms, and
// prints what it drew.
"use strict";
const { runPage, sent } = require("./fake_dom.js");

const byId = runPage("inputs.js", process.argv[2], process.argv[3], {
  prompt: "Lily saw a cat. Lily", target: "", foil: "", method: "all", baseline: "mean", positive: "a dragon\n\n", negative: "a cat",
  layer: "1", coefs: "0, 2", "steer-prompt": "Once",
});

(async () => {
  const wait = () => new Promise((r) => setTimeout(r, 20));
  await wait();
  await byId["attribute-form"].fire("submit");
  await wait();
  await byId["steer-form"].fire("submit");
  await wait();
  const lensRows = byId.lens.children[0].children[1].children;
  console.log(JSON.stringify({
    info: byId["model-info"].textContent, lines: byId.attribution.children.map((n) => n.text()),
    explained: byId.explained.textContent, lensRows: lensRows.map((r) => r.text()), note: byId["lens-note"].textContent,
    steerRows: byId.steering.children[1].children[1].children.map((r) => r.text()),
    status: byId.status.textContent + byId["steer-status"].textContent,
    methods: byId.method.children.map((n) => n.attrs.value), options: byId["technique-options"].children.map((n) => n.text()),
    baselines: byId.baseline.children.map((n) => n.attrs.value), sent: sent.filter((s) => s.key === "POST /api/attribute").map((s) => s.body),
  }));
})().catch((e) => { console.error("ERROR " + e.stack); process.exit(1); });
