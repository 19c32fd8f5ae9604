// Runs serve/static/features.js against a minimal fake DOM and canned API answers (argv[2]: a JSON file
// mapping "GET /api/..." / "POST /api/..." to answers), clicks through it, and prints what it drew.
"use strict";
const fs = require("fs");
const vm = require("vm");
const path = require("path");

const answers = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const staticDir = process.argv[3];

class Node_ {
  constructor(tag) {
    this.tagName = tag; this.children = []; this.attrs = {}; this.listeners = {}; this.dataset = {};
    this.textContent = ""; this.value = ""; this.disabled = false; this.style = {}; this.width = 320; this.height = 110;
    const cls = new Set();
    this.classList = { add: (c) => cls.add(c), remove: (c) => cls.delete(c), contains: (c) => cls.has(c),
      toggle: (c, on) => { if (on === undefined ? !cls.has(c) : on) cls.add(c); else cls.delete(c); } };
  }
  setAttribute(k, v) { this.attrs[k] = v; if (k.startsWith("data-")) this.dataset[k.slice(5)] = v; }
  addEventListener(kind, fn) { (this.listeners[kind] = this.listeners[kind] || []).push(fn); }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = nodes; }
  text() { return this.textContent + this.children.map((c) => (c instanceof Node_ ? c.text() : String(c.data))).join(""); }
  getContext() {
    return { clearRect() {}, fillRect() {}, fillText() {}, measureText: (s) => ({ width: 6 * s.length }),
             set fillStyle(v) {}, set font(v) {} };
  }
  async fire(kind) { for (const fn of this.listeners[kind] || []) await fn({ preventDefault() {}, target: this }); }
}
class Text_ { constructor(s) { this.data = s; } }

const byId = {};
const document = {
  getElementById: (id) => (byId[id] = byId[id] || new Node_("div")),
  createElement: (tag) => new Node_(tag),
  createTextNode: (s) => new Text_(s),
};
byId.order = new Node_("select"); byId.order.value = "index";
byId.prompt = new Node_("textarea"); byId.prompt.value = "Lily and Lucy";
byId.goto = new Node_("input");
const pending = [];
async function fetch(url, options) {
  const key = (options && options.method === "POST" ? "POST " : "GET ") + url;
  const hit = Object.keys(answers).find((k) => key.startsWith(k));
  if (!hit) throw new Error("no canned answer for " + key);
  return { ok: true, status: 200, json: async () => answers[hit] };
}
const context = { document, fetch, Node: Node_, console, Object, Math, Number, String, JSON, encodeURIComponent };
vm.createContext(context);
for (const f of ["common.js", "features.js"]) {
  // top-level const/let stay in the script scope; expose cl to the second script through the context
  const src = fs.readFileSync(path.join(staticDir, f), "utf8") + (f === "common.js" ? "\nthis.cl = cl;" : "");
  vm.runInContext(src, context, { filename: f });
}

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
