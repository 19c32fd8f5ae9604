// Runs serve/static/features.js against a minimal fake DOM and canned API answers (argv[2]: a JSON file
// mapping "GET /api/..." / "POST /api/..." to answers), clicks through it, and prints what it drew.
"use strict";
const { runPage } = require("./fake_dom.js");

const byId = runPage("features.js", process.argv[2], process.argv[3],
                     { order: "index", prompt: "Lily and Lucy", goto: "" });

(async () => {
  const wait = () => new Promise((r) => setTimeout(r, 20));
  await wait(); await wait();
  const rows = byId["feature-list"].children.length;
  const title = byId["feature-title"].textContent;
  const contexts = byId["feature-contexts"].children.length;
  await byId["prompt-form"].fire("submit");
  await wait();
  const chips = byId["prompt-features"].children.length;
  const tokens = byId["prompt-tokens"].children.map((n) => n.text()).join("|");
  await byId.next.fire("click");
  await wait();
  console.log(JSON.stringify({ rows, title, contexts, chips, tokens, info: byId["dict-info"].textContent,
                               page: byId["page-label"].textContent, status: byId.status.textContent }));
})().catch((e) => { console.error("ERROR " + e.stack); process.exit(1); });
