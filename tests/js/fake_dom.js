// A minimal fake DOM, and fetch answering from canned API answers, for running a page script of
// serve/static in node: runPage("features.js", answersFile, staticDir, {id: value}) loads common.js and the
// script (a name in staticDir, or a path: viz/graph_view.js) and returns the elements by id (created on first use),
// for the caller to click through. The document answers no selectors (querySelectorAll finds nothing).
// answersFile: a JSON file mapping "GET /api/..." / "POST /api/..." (prefixes) to answers. globals: more names
// the script sees (location, history, ...); sent: every request made, {key, body}, in order.
"use strict";
const fs = require("fs");
const vm = require("vm");
const path = require("path");

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

const sent = [];

function runPage(script, answersFile, staticDir, values, globals) {
  const answers = JSON.parse(fs.readFileSync(answersFile, "utf8"));
  const byId = {};
  const document = {
    getElementById: (id) => (byId[id] = byId[id] || new Node_("div")),
    createElement: (tag) => new Node_(tag),
    createTextNode: (s) => new Text_(s),
    querySelectorAll: () => [],
  };
  for (const [id, value] of Object.entries(values || {})) {
    byId[id] = new Node_("input");
    byId[id].value = value;
  }
  async function fetch(url, options) {
    const key = (options && options.method === "POST" ? "POST " : "GET ") + url;
    sent.push({ key, body: options && options.body !== undefined ? JSON.parse(options.body) : null });
    const hit = Object.keys(answers).find((k) => key.startsWith(k));
    if (!hit) throw new Error("no canned answer for " + key);
    return { ok: true, status: 200, json: async () => answers[hit] };
  }
  const context = { document, fetch, Node: Node_, console, Object, Math, Number, String, JSON, encodeURIComponent,
                    ...(globals || {}) };
  vm.createContext(context);
  for (const f of ["common.js", script]) {
    // top-level const/let stay in the script scope; expose cl to the second script through the context
    const src = fs.readFileSync(path.resolve(staticDir, f), "utf8") + (f === "common.js" ? "\nthis.cl = cl;" : "");
    vm.runInContext(src, context, { filename: f });
  }
  return byId;
}

module.exports = { runPage, sent };
