// circuitlab's attribution-graph viewer: plain DOM + SVG, no library, no network (but browse's own server).
// It reads the graph file itself (the Neuronpedia / circuit-tracer JSON that circuitlab.graphs.export writes):
// metadata, qParams (pinnedIds, supernodes), nodes, links. Re-pruning in the page follows
// circuitlab.graphs.export.reprune (the same rule, tested against it).
//   CLGraphView.mount(element, data, {features: {"L_F": card}, api: {feature, save, intervene} | null})
//   CLGraphView.browse(element, "/api/graphs")   the graphs a server lists, opened into element (below)
"use strict";

window.CLGraphView = window.CLGraphView || (function () {
  const SVGNS = "http://www.w3.org/2000/svg";
  const FIXED = { embedding: true, logit: true };
  const ROW_H = 64, LEFT = 64, TOP = 28, BOTTOM = 70;
  const MAX_DRAWN_LINKS = 20000;   // a huge file from elsewhere: only its strongest links are drawn
  // the largest of f over a list (no spread: a list of 100,000s would overflow the call stack)
  const most = (list, f, start) => list.reduce((m, x) => Math.max(m, f(x)), start);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }
  function visible(text) {
    if (text === "") return "∅";
    return String(text).replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥");
  }
  function fmt(x) { return x === null || x === undefined ? "–" : Number(x).toPrecision(3); }

  // ------------------------------------------------------------------ pruning (= export.reprune)
  // a file from elsewhere (circuit-tracer, Neuronpedia) has no influence_before: its nodes' cumulative
  // `influence` stands in, and its links all stay
  const before = x => x.influence_before !== undefined ? x.influence_before : (x.influence || 0);
  function reprune(data, tn, te) {
    const kind = {};
    for (const n of data.nodes) kind[n.node_id] = n.feature_type;
    let nodes = new Set(data.nodes.filter(n => FIXED[n.feature_type] || before(n) < tn).map(n => n.node_id));
    let links = data.links.filter(x => before(x) < te);
    for (;;) {
      links = links.filter(x => nodes.has(x.source) && nodes.has(x.target));
      const hasOut = new Set(links.map(x => x.source)), hasIn = new Set(links.map(x => x.target));
      const keep = new Set([...nodes].filter(i => FIXED[kind[i]] ||
        (hasOut.has(i) && (kind[i] !== "cross layer transcoder" || hasIn.has(i)))));
      if (keep.size === nodes.size) return { nodes: nodes, links: links };
      nodes = keep;
    }
  }

  // ------------------------------------------------------------------ the viewer
  function mount(root, data, options) {
    options = options || {};
    const api = options.api || null;
    const cards = Object.assign({}, options.features || {});
    const meta = data.metadata || {};
    const q = data.qParams = data.qParams || {};
    const byId = {};
    for (const n of data.nodes) byId[n.node_id] = n;
    const logitLayer = most(data.nodes.filter(n => n.feature_type === "logit"), n => +n.layer, 1);
    const nLayers = meta.n_layers !== undefined ? meta.n_layers : logitLayer - 1;
    const tokens = meta.prompt_tokens || [];
    const fileTn = meta.node_threshold || 1, fileTe = meta.edge_threshold || 1;
    const state = {
      tn: fileTn, te: fileTe, selected: null,
      pinned: new Set((q.pinnedIds || []).filter(i => byId[i])),
      supernodes: (q.supernodes || []).filter(s => Array.isArray(s) && s.length > 1)
        .map(s => [String(s[0]), ...s.slice(1).filter(i => byId[i])]),
    };
    root.classList.add("clgv");
    root.textContent = "";

    // ---- controls and panels
    const count = el("span", { class: "clgv-count" });
    const tnLabel = el("span"), teLabel = el("span");
    const tnSlider = el("input", { type: "range", class: "clgv-node-threshold", min: 0.05, max: fileTn, step: 0.01,
                                   value: fileTn, "aria-label": "node threshold" });
    const teSlider = el("input", { type: "range", class: "clgv-edge-threshold", min: 0.05, max: fileTe, step: 0.01,
                                   value: fileTe, "aria-label": "edge threshold" });
    const scores = meta.scores ? `replacement score ${fmt(meta.scores.replacement)}, completeness score ` +
      `${fmt(meta.scores.completeness)}` : "";
    const head = el("div", { class: "clgv-head" },
      el("div", { class: "clgv-prompt" }, "prompt: ", el("code", { text: meta.prompt || tokens.join("") })),
      el("div", { class: "clgv-facts" }, count, scores ? " · " + scores : ""),
      el("label", {}, "node threshold ", tnSlider, tnLabel),
      el("label", {}, "edge threshold ", teSlider, teLabel));
    const canvas = el("div", { class: "clgv-canvas" });
    const detail = el("div", { class: "clgv-detail" }, el("p", { class: "clgv-hint",
      text: "Click a node: its strongest paths down to the tokens and up to the logits light up. Hover a feature " +
            "for its top-activating contexts and the tokens it promotes." }));
    const pinList = el("div", { class: "clgv-pins" });
    const superName = el("input", { class: "clgv-supernode-name", type: "text", placeholder: "supernode name" });
    const saveStatus = el("span", { class: "clgv-save-status", role: "status" });
    const groups = el("div", { class: "clgv-groups" },
      el("b", { text: "Pinned nodes and supernodes" }), pinList,
      el("div", {}, superName,
        el("button", { type: "button", class: "clgv-group", onclick: group, text: "group pinned" }),
        el("button", { type: "button", class: "clgv-save", onclick: save,
                       text: api && api.save ? "save to the graph file" : "download graph.json" }), saveStatus));
    const side = el("div", { class: "clgv-side" }, detail, groups);
    let ivPanel = null;
    if (api && api.intervene) side.append(ivPanel = interventionPanel());
    const tip = el("div", { class: "clgv-tip", hidden: true });
    root.append(head, el("div", { class: "clgv-body" }, canvas, side), tip);
    // at the slider's end: the file's own threshold exactly (a range input's value is rounded to its step)
    tnSlider.addEventListener("input", () => { state.tn = Math.min(+tnSlider.value, fileTn); draw(); });
    teSlider.addEventListener("input", () => { state.te = Math.min(+teSlider.value, fileTe); draw(); });

    let view = null;   // {nodes: Set, links: [...], xy: {}, lineOf: Map}

    function rowOf(n) {
      if (n.feature_type === "embedding") return 0;
      if (n.feature_type === "logit") return nLayers + 1;
      return +n.layer + 1;
    }
    function label(n) {
      const t = tokens[n.ctx_idx];
      if (n.feature_type === "embedding") return `token ${JSON.stringify(t)} @${n.ctx_idx}`;
      if (n.feature_type === "logit") return n.clerp || `logit ${n.feature}`;
      if (n.feature_type === "mlp reconstruction error") return `error L${n.layer} @${n.ctx_idx}`;
      const f = n.node_id.split("_");
      return `L${f[0]} F${f[1]} @${n.ctx_idx} ${JSON.stringify(t)}`;
    }
    function superOf(id) { return state.supernodes.findIndex(s => s.indexOf(id, 1) > 0); }

    function draw() {
      tnLabel.textContent = " " + state.tn.toFixed(2);
      teLabel.textContent = " " + state.te.toFixed(2);
      const v = reprune(data, state.tn, state.te);
      count.textContent = `${v.nodes.size} nodes, ${v.links.length} links`;
      count.dataset.nodes = v.nodes.size;
      count.dataset.links = v.links.length;
      // columns: as wide as their busiest cell; a column with a token only stays narrow
      const T = Math.max(tokens.length, 1 + most(data.nodes, n => n.ctx_idx, 0));
      const cells = {};
      for (const id of v.nodes) {
        const n = byId[id];
        const key = rowOf(n) + ":" + n.ctx_idx;
        (cells[key] = cells[key] || []).push(id);
      }
      const widths = new Array(T).fill(22);
      for (const [key, ids] of Object.entries(cells)) {
        const [row, pos] = key.split(":").map(Number);
        if (row !== nLayers + 1) widths[pos] = Math.max(widths[pos], (row === 0 ? 22 : 16) * ids.length + 8);
      }
      const xs = [LEFT];
      for (let p = 0; p < T; p++) xs.push(xs[p] + widths[p]);
      // logits along the top, most probable first, ending above the last position
      const logits = [...v.nodes].filter(id => byId[id].feature_type === "logit")
        .sort((a, b) => (byId[b].token_prob || 0) - (byId[a].token_prob || 0));
      const lastX = xs[T - 1] + widths[T - 1] / 2;
      const firstLogit = Math.max(LEFT + 40, lastX - 80 * (logits.length - 1));
      const W = Math.max(xs[T], firstLogit + 80 * logits.length) + 20, H = TOP + ROW_H * (nLayers + 2) + BOTTOM;
      const yOf = row => TOP + ROW_H * (nLayers + 1 - row) + ROW_H / 2;
      const xy = {};
      for (const [key, ids] of Object.entries(cells)) {
        const [row, pos] = key.split(":").map(Number);
        if (row === nLayers + 1) continue;
        ids.sort((a, b) => before(byId[a]) - before(byId[b]));
        ids.forEach((id, k) => { xy[id] = [xs[pos] + widths[pos] * (k + 1) / (ids.length + 1), yOf(row)]; });
      }
      logits.forEach((id, k) => { xy[id] = [firstLogit + 80 * k, yOf(nLayers + 1)]; });
      const g = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "clgv-svg" });
      for (let row = 0; row <= nLayers + 1; row++) {
        const y = yOf(row);
        g.append(svg("line", { x1: LEFT, x2: W - 10, y1: y, y2: y, class: "clgv-rule" }));
        const t = svg("text", { x: 4, y: y + 4, class: "clgv-row" });
        t.textContent = row === 0 ? "tokens" : row === nLayers + 1 ? "logits" : `layer ${row - 1}`;
        g.append(t);
      }
      const wmax = most(v.links, x => Math.abs(x.weight), 1e-30);
      const edges = svg("g", { class: "clgv-edges" });
      const lineOf = new Map();
      const drawn = [...v.links].sort((a, b) => Math.abs(a.weight) - Math.abs(b.weight)).slice(-MAX_DRAWN_LINKS);
      if (drawn.length < v.links.length) {
        count.textContent += ` (the strongest ${drawn.length.toLocaleString()} drawn)`;
      }
      drawn.forEach(x => {
        const [x1, y1] = xy[x.source], [x2, y2] = xy[x.target];
        const a = Math.abs(x.weight) / wmax;
        const line = svg("line", { x1: x1, y1: y1, x2: x2, y2: y2, class: "clgv-edge " + (x.weight > 0 ? "pos" : "neg"),
                                   "stroke-width": (0.4 + 3.6 * a).toFixed(2),
                                   "stroke-opacity": (0.12 + 0.7 * a).toFixed(2) });
        line.dataset.source = x.source;
        line.dataset.target = x.target;
        const title = svg("title");
        title.textContent = `${label(byId[x.source])} → ${label(byId[x.target])}: ${x.weight.toPrecision(4)}`;
        line.append(title);
        line.addEventListener("click", ev => { ev.stopPropagation(); showEdge(x); });
        lineOf.set(x, line);
        edges.append(line);
      });
      g.append(edges);
      const nodes = svg("g", { class: "clgv-nodes" });
      for (const id of v.nodes) {
        const n = byId[id], [x, y] = xy[id];
        const grp = svg("g", { class: "clgv-node " + n.feature_type.replace(/ /g, "-"), transform: `translate(${x},${y})` });
        grp.dataset.id = id;
        if (state.pinned.has(id)) grp.classList.add("pinned");
        const s = superOf(id);
        if (s >= 0) { grp.classList.add("in-supernode"); grp.dataset.supernode = state.supernodes[s][0]; }
        if (n.feature_type === "embedding") {
          grp.append(svg("rect", { x: -6, y: -6, width: 12, height: 12, rx: 2 }));
          const t = svg("text", { x: 0, y: 20, transform: "rotate(40 0 20)", class: "clgv-token" });
          t.textContent = visible(tokens[n.ctx_idx] !== undefined ? tokens[n.ctx_idx] : n.feature).slice(0, 12);
          grp.append(t);
        } else if (n.feature_type === "logit") {
          grp.append(svg("rect", { x: -36, y: -10, width: 72, height: 20, rx: 4 }));
          const t = svg("text", { x: 0, y: 4, "text-anchor": "middle" });
          const m = /^Output "(.*)" \(p=/s.exec(n.clerp || "");
          t.textContent = visible(m ? m[1] : String(n.feature)).slice(0, 10) + " " + (n.token_prob || 0).toFixed(2);
          grp.append(t);
        } else if (n.feature_type === "mlp reconstruction error") {
          grp.append(svg("rect", { x: -5, y: -5, width: 10, height: 10 }));
        } else {
          grp.append(svg("circle", { r: 6 }));
        }
        const title = svg("title");
        title.textContent = label(n);
        grp.append(title);
        grp.addEventListener("click", ev => { ev.stopPropagation(); select(id); });
        if (n.feature_type === "cross layer transcoder") {
          grp.addEventListener("mouseenter", ev => hover(n, ev));
          grp.addEventListener("mouseleave", () => { tip.hidden = true; });
        }
        nodes.append(grp);
      }
      // each supernode: a dashed box around its shown members, named on top
      const boxes = svg("g", { class: "clgv-boxes" });
      for (const sn of state.supernodes) {
        const pts = sn.slice(1).filter(id => xy[id]).map(id => xy[id]);
        if (!pts.length) continue;
        const x0 = Math.min(...pts.map(p => p[0])) - 12, x1 = Math.max(...pts.map(p => p[0])) + 12;
        const y0 = Math.min(...pts.map(p => p[1])) - 12, y1 = Math.max(...pts.map(p => p[1])) + 12;
        const box = svg("g", { class: "clgv-supernode-box" });
        box.dataset.name = sn[0];
        box.append(svg("rect", { x: x0, y: y0, width: x1 - x0, height: y1 - y0, rx: 6 }));
        const t = svg("text", { x: x0, y: y0 - 3 });
        t.textContent = sn[0];
        box.append(t);
        boxes.append(box);
      }
      g.append(boxes, nodes);
      g.addEventListener("click", () => select(null));
      canvas.textContent = "";
      canvas.append(g);
      view = { nodes: v.nodes, links: v.links, lineOf: lineOf, svg: g };
      if (state.selected && !v.nodes.has(state.selected)) state.selected = null;
      highlight();
      renderGroups();
    }

    // ---- strongest paths: each step's share of its target's input (|weight| over the target's shown inputs)
    function paths(id) {
      const inputs = {}, outputs = {}, total = {};
      for (const x of view.links) {
        (inputs[x.target] = inputs[x.target] || []).push(x);
        (outputs[x.source] = outputs[x.source] || []).push(x);
        total[x.target] = (total[x.target] || 0) + Math.abs(x.weight);
      }
      const share = x => Math.abs(x.weight) / total[x.target];
      const down = {}, up = {};   // best product of shares to a token / to a logit (times its probability)
      function toToken(i) {
        if (i in down) return down[i];
        if (byId[i].feature_type === "embedding") return (down[i] = { s: 1, via: null });
        let best = { s: 0, via: null };
        for (const x of inputs[i] || []) {
          const s = share(x) * toToken(x.source).s;
          if (s > best.s) best = { s: s, via: x };
        }
        return (down[i] = best);
      }
      function toLogit(i) {
        if (i in up) return up[i];
        if (byId[i].feature_type === "logit") return (up[i] = { s: byId[i].token_prob || 1, via: null });
        let best = { s: 0, via: null };
        for (const x of outputs[i] || []) {
          const s = share(x) * toLogit(x.target).s;
          if (s > best.s) best = { s: s, via: x };
        }
        return (up[i] = best);
      }
      const lit = new Set();
      // the strongest path through the node, and the strongest path through each of its 3 strongest inputs and
      // outputs (each continued by its own strongest path)
      const follow = (start, step, next) => {
        for (let i = start, b = step(i); b.via; i = next(b.via), b = step(i)) lit.add(b.via);
      };
      const top3 = (list, key) => [...(list || [])].sort((a, b) => key(b) - key(a)).slice(0, 3);
      follow(id, toToken, x => x.source);
      follow(id, toLogit, x => x.target);
      for (const x of top3(inputs[id], x => share(x) * toToken(x.source).s)) {
        lit.add(x); follow(x.source, toToken, y => y.source);
      }
      for (const x of top3(outputs[id], x => share(x) * toLogit(x.target).s)) {
        lit.add(x); follow(x.target, toLogit, y => y.target);
      }
      return { lit: lit, inputs: inputs[id] || [], outputs: outputs[id] || [], share: share };
    }

    function select(id) {
      state.selected = id;
      highlight();
    }

    function highlight() {
      const id = state.selected;
      view.svg.classList.toggle("has-selection", !!id);
      view.svg.querySelectorAll(".hl").forEach(e => e.classList.remove("hl"));
      view.svg.querySelectorAll(".selected").forEach(e => e.classList.remove("selected"));
      if (!id) { showDetail(null); return; }
      const p = paths(id);
      const litNodes = new Set([id]);
      for (const x of p.lit) {
        const line = view.lineOf.get(x);   // undrawn when past MAX_DRAWN_LINKS
        if (line) line.classList.add("hl");
        litNodes.add(x.source); litNodes.add(x.target);
      }
      view.svg.querySelectorAll(".clgv-node").forEach(g => {
        if (litNodes.has(g.dataset.id)) g.classList.add("hl");
        if (g.dataset.id === id) g.classList.add("selected");
      });
      showDetail(id, p);
    }

    function showDetail(id, p) {
      detail.textContent = "";
      if (!id) {
        detail.append(el("p", { class: "clgv-hint", text: "Click a node to follow its strongest paths." }));
        return;
      }
      const n = byId[id];
      const facts = [`influence share before it ${fmt(before(n))}`];
      if (n.activation !== null && n.activation !== undefined) facts.push(`activation ${fmt(n.activation)}`);
      const pinBtn = el("button", { type: "button", class: "clgv-pin", text: state.pinned.has(id) ? "unpin" : "pin",
                                    onclick: () => { togglePin(id); } });
      const table = (title, list, end) => el("table", {},
        el("tr", {}, el("th", { text: title }), el("th", { text: "weight" }), el("th", { text: "share" })),
        ...[...list].sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 8).map(x =>
          el("tr", { class: p.lit.has(x) ? "hl" : null }, el("td", { text: label(byId[x[end]]) }),
             el("td", { text: x.weight.toPrecision(3) }), el("td", { text: p.share(x).toFixed(3) }))));
      detail.append(el("h4", { class: "clgv-selected", text: label(n) }), el("p", { text: facts.join(", ") }), pinBtn,
                    table("strongest inputs", p.inputs, "source"), table("strongest outputs", p.outputs, "target"));
    }

    // ---- an edge: the heads that carried it (head loadings, signed bars) and, when the file has them, the
    // QK attribution of the head at (the target's position, the source's): why it attended there
    function showEdge(x) {
      detail.textContent = "";
      const src = byId[x.source], tgt = byId[x.target];
      detail.append(el("h4", { class: "clgv-edge-title", text: `${label(src)} → ${label(tgt)}` }),
                    el("p", { text: `weight ${x.weight.toPrecision(4)}` }));
      if (!x.heads) {
        detail.append(el("p", { class: "clgv-hint", text: src.ctx_idx === tgt.ctx_idx
          ? "a same-position edge: no head moved it" : "no head loadings for this edge in the file" }));
        return;
      }
      const rows = x.heads.map(h => ({ name: `L${h[0]}H${h[1]}`, v: h[2], head: h }));
      if (Math.abs(x.heads_rest) > 1e-9 * Math.abs(x.weight)) rows.push({ name: "other heads / same position", v: x.heads_rest });
      const vmax = most(rows, r => Math.abs(r.v), 1e-30);
      const bars = el("table", { class: "clgv-heads" }, el("tr", {}, el("th", { text: "carried by" }),
        el("th", { text: "loading" }), el("th", { text: "" })));
      for (const r of rows) {
        const w = (100 * Math.abs(r.v) / vmax).toFixed(1);
        bars.append(el("tr", { class: "clgv-head-row" }, el("td", { text: r.name }), el("td", { text: r.v.toPrecision(3) }),
          el("td", {}, el("div", { class: "clgv-bar " + (r.v > 0 ? "pos" : "neg"), style: `width: ${w}%` }))));
      }
      detail.append(bars);
      const qks = (data.qk || []).filter(q => q.query_pos === tgt.ctx_idx && q.key_pos === src.ctx_idx &&
                                             x.heads.some(h => h[0] === q.layer && h[1] === q.head));
      for (const q of qks) {
        const k = q.key;
        detail.append(el("h4", { class: "clgv-qk", text: `why L${q.layer}H${q.head} attended @${q.key_pos}` }),
          el("p", { text: `score ${q.score.toPrecision(3)}, attention ${k.prob.toFixed(2)} (rank ${k.rank}` +
                          (k.margin !== null ? `, margin ${k.margin.toPrecision(3)} over the next key)` : ")") }),
          el("table", {}, el("tr", {}, el("th", { text: "query part" }), el("th", { text: "key part" }),
                             el("th", { text: "term" })),
             ...q.top_pairs.slice(0, 6).map(p => el("tr", {}, el("td", { text: p.query }), el("td", { text: p.key }),
                                                      el("td", { text: p.term.toPrecision(3) })))));
      }
    }

    // ---- feature cards on hover: embedded dashboards, or the server's (computed on demand)
    async function hover(n, ev) {
      const key = n.node_id.split("_").slice(0, 2).join("_");
      tip.hidden = false;
      tip.style.left = (ev.pageX + 14) + "px";
      tip.style.top = (ev.pageY + 10) + "px";
      tip.textContent = label(n);
      if (!(key in cards) && api && api.feature) {
        tip.append(el("div", { class: "clgv-hint", text: "loading its dashboard…" }));
        const [layer, feature] = key.split("_").map(Number);
        cards[key] = api.feature(layer, feature).catch(err => ({ error: String(err.message || err) }));
      }
      const card = await cards[key];
      if (tip.hidden || !tip.textContent.startsWith(label(n))) return;
      tip.textContent = "";
      tip.append(el("b", { text: label(n) }));
      if (!card) { tip.append(el("div", { class: "clgv-hint", text: "no dashboard for this feature here" })); return; }
      if (card.error) { tip.append(el("div", { class: "clgv-error", text: card.error })); return; }
      tip.append(el("div", { class: "clgv-hint", text: `density ${fmt(card.density)}, max activation ` +
                                                       `${fmt(card.max_act)}${card.from ? "; " + card.from : ""}` }));
      for (const c of (card.contexts || []).slice(0, 4)) {
        const line = el("div", { class: "clgv-context" });
        c.tokens.forEach((t, k) => {
          const a = c.value > 0 ? Math.max(0, c.acts[k]) / c.value : 0;
          line.append(el("span", { class: k === c.at ? "at" : null, style: `background: rgba(245,158,11,${a.toFixed(2)})`,
                                   text: visible(t) }));
        });
        tip.append(line);
      }
      if (card.logits) {
        tip.append(el("div", {}, el("b", { text: "promotes " }),
          card.logits.promoted.slice(0, 6).map(x => visible(x.token)).join("  ")));
      }
    }

    // ---- pins and supernodes (Neuronpedia's qParams: pinnedIds, supernodes [[name, id, ...]])
    function togglePin(id) {
      if (state.pinned.has(id)) state.pinned.delete(id); else state.pinned.add(id);
      syncQ();
      draw();
    }
    function group() {
      const name = superName.value.trim();
      const members = [...state.pinned].filter(i => superOf(i) < 0);
      if (!name) { saveStatus.textContent = "name the supernode first"; return; }
      if (!members.length) { saveStatus.textContent = "pin the nodes to group first"; return; }
      state.supernodes.push([name, ...members]);
      superName.value = "";
      saveStatus.textContent = "";
      syncQ();
      draw();
    }
    function syncQ() {
      q.pinnedIds = [...state.pinned];
      q.supernodes = state.supernodes.map(s => [...s]);
      q.clickedId = state.selected || "";
    }
    function renderGroups() {
      pinList.textContent = "";
      for (const id of state.pinned) {
        pinList.append(el("span", { class: "clgv-chip", "data-id": id }, label(byId[id]),
          el("button", { type: "button", title: "unpin", text: "×", onclick: () => togglePin(id) })));
      }
      state.supernodes.forEach((s, k) => {
        pinList.append(el("div", { class: "clgv-supernode", "data-name": s[0] },
          el("a", { href: "#", text: s[0], onclick: ev => { ev.preventDefault(); select(s[1]); } }),
          ` (${s.length - 1} nodes) `,
          el("button", { type: "button", title: "ungroup", text: "×", onclick: () => {
            state.supernodes.splice(k, 1); syncQ(); draw(); } })));
      });
      if (ivPanel) ivPanel.refresh();
    }
    async function save() {
      syncQ();
      if (api && api.save) {
        saveStatus.textContent = "saving…";
        try {
          await api.save({ pinnedIds: q.pinnedIds, supernodes: q.supernodes });
          saveStatus.textContent = `saved ${q.supernodes.length} supernode(s), ${q.pinnedIds.length} pinned`;
        } catch (err) {
          saveStatus.textContent = String(err.message || err);
        }
        return;
      }
      const blob = new Blob([JSON.stringify(data)], { type: "application/json" });
      const a = el("a", { href: URL.createObjectURL(blob), download: (meta.slug || "graph") + ".json" });
      document.body.append(a);
      a.click();
      a.remove();
      saveStatus.textContent = "downloaded (qParams hold the pins and supernodes)";
    }

    // ---- interventions (server only): scale features, compare top logits
    function interventionPanel() {
      const which = el("select", { class: "clgv-iv-which" });
      const scale = el("input", { class: "clgv-iv-scale", type: "number", step: "any", value: "0" });
      const out = el("div", { class: "clgv-iv-out" });
      const panel = el("div", { class: "clgv-iv" }, el("b", { text: "Intervene" }),
        el("div", {}, el("label", {}, "features ", which), el("label", {}, " × scale ", scale)),
        el("div", { class: "clgv-hint", text: "top next tokens: the graph's, the replacement model's, the real " +
                    "model's with attention and norms frozen, and with them free" }),
        el("button", { type: "button", class: "clgv-iv-run", text: "run", onclick: run }), out);
      panel.refresh = () => {
        const keep = which.value;
        which.textContent = "";
        which.append(el("option", { value: "selected", text: "the selected node" }),
                     el("option", { value: "pinned", text: "the pinned nodes" }));
        state.supernodes.forEach(s => which.append(el("option", { value: "super:" + s[0], text: "supernode " + s[0] })));
        if ([...which.options].some(o => o.value === keep)) which.value = keep;
      };
      async function run() {
        let ids = [];
        if (which.value === "selected") ids = state.selected ? [state.selected] : [];
        else if (which.value === "pinned") ids = [...state.pinned];
        else ids = (state.supernodes.find(s => "super:" + s[0] === which.value) || [null]).slice(1);
        ids = ids.filter(i => byId[i].feature_type === "cross layer transcoder");
        if (!ids.length) { out.textContent = "choose feature nodes first (select, pin or group some)"; return; }
        out.textContent = "running…";
        try {
          const r = await api.intervene({ nodes: ids, scale: +scale.value });
          out.textContent = "";
          const cols = Object.keys(r.columns);
          out.append(el("table", { class: "clgv-iv-table" },
            el("tr", {}, ...cols.map(c => el("th", { text: c }))),
            ...[0, 1, 2, 3, 4].map(k => el("tr", {}, ...cols.map(c => {
              const x = r.columns[c][k];
              return el("td", { text: x ? `${visible(x.token)} ${x.prob.toFixed(3)}` : "" });
            })))));
        } catch (err) {
          out.textContent = String(err.message || err);
        }
      }
      return panel;
    }

    draw();
    root.dataset.drawnMs = performance.now().toFixed(0);   // time from navigation to the first drawing
    return { state: state, reprune: reprune, select: select, redraw: draw, data: data };
  }

  // ------------------------------------------------------------------ the browser (`circuitlab serve`'s /graphs)
  // The graphs a JSON API lists (serve/graphs.py's routes: GET API, API/graph?id=, API/feature; POST API/qparams,
  // API/intervene, API/compute), each opened into root by mount. Its controls are the page's elements by id, as
  // graph_view.py's graph_browser_html writes them: graph-info, open-form, graph-list, compute-form,
  // compute-prompt, option-<field> (one per option the API's "options" lists), status. ?id= in the page's URL
  // opens that graph, and the URL follows the graph opened.
  const LOADED = "the loaded model and transcoders";   // the listing's made_with of a graph this server can run

  // fetch JSON; resolves to {ok, status, data}; the server's errors are {"detail": "..."}
  async function request(path, body) {
    const init = body === undefined ? {} : { method: "POST", headers: { "Content-Type": "application/json" },
                                             body: JSON.stringify(body) };
    let response, data;
    try {
      response = await fetch(path, init);
    } catch (err) {
      return { ok: false, status: 0, data: { detail: "cannot reach the server: " + err.message } };
    }
    try {
      data = await response.json();
    } catch (err) {
      data = { detail: "the server answered " + response.status + " without JSON" };
    }
    return { ok: response.ok, status: response.status, data: data };
  }

  function browse(root, api) {
    const $ = id => document.getElementById(id);
    const status = text => { $("status").textContent = text; };
    let canCompute = false;
    let madeWith = {};   // id -> what the graph was made with, against the loaded model (null: none loaded)
    let options = null;  // the compute form's options: field -> JSON schema (default, bounds, description)

    // The compute form's inputs are option-<field>, one per option the server takes; each one's default, bounds
    // and help come from the server (the options class, the one place they are written), and what they hold
    // goes back under the field's name.
    function showOptions(given) {
      if (options) return;   // once: a later listing keeps what was typed
      options = given || {};
      for (const [name, o] of Object.entries(options)) {
        const input = $("option-" + name), one = (o.anyOf || [o])[0];
        if (!input) continue;
        input.title = o.description || "";
        if (one.maximum !== undefined) input.max = one.maximum;
        if (one.minimum !== undefined) input.min = one.minimum;
        if (one.exclusiveMinimum !== undefined) input.min = one.exclusiveMinimum + (+input.step || 0);
        if (o.default !== null && o.default !== undefined) input.value = String(o.default);
      }
    }

    function optionValues() {
      const body = {};
      for (const [name, o] of Object.entries(options || {})) {
        const input = $("option-" + name), one = (o.anyOf || [o])[0];
        if (!input || input.value === "") continue;   // empty: the server's default
        body[name] = one.type === "number" || one.type === "integer" ? +input.value : input.value;
      }
      return body;
    }

    function check(r) {
      if (!r.ok) throw new Error(r.data.detail || ("the server answered " + r.status));
      return r.data;
    }

    async function list(select) {
      const r = await request(api);
      if (!r.ok) { status(r.data.detail); return; }
      canCompute = r.data.can_compute;
      showOptions(r.data.options);
      $("compute-form").hidden = !canCompute;
      $("graph-info").textContent = `${r.data.graphs.length} graph(s) under ${r.data.root || "no runs folder"}` +
        (canCompute ? "" : " · interventions and new graphs need --checkpoint and --transcoders");
      const sel = $("graph-list");
      sel.textContent = "";
      madeWith = {};
      for (const g of r.data.graphs) {
        madeWith[g.id] = g.made_with;
        const other = !g.made_with || g.made_with === LOADED ? ""
          : g.made_with === "unrecorded" ? " · view only: records no model"
          : " · view only: " + g.made_with.split(":")[0];
        sel.append(el("option", { value: g.id,
                                  text: `${g.id} — ${JSON.stringify(g.prompt)} (${g.nodes} nodes)${other}` }));
      }
      if (select) sel.value = select;
      if (!r.data.graphs.length) status("no graphs yet: write one with `circuitlab graph ... --out RUNS/NAME`");
    }

    async function open(id) {
      status("loading " + id + "…");
      const q = "id=" + encodeURIComponent(id);
      const r = await request(`${api}/graph?${q}`);
      if (!r.ok) { status(r.data.detail); return; }
      history.replaceState(null, "", "?" + q);   // this page's URL, naming the graph
      const calls = { save: async body => check(await request(`${api}/qparams`, Object.assign({ id: id }, body))) };
      // feature cards and interventions only on a graph made with the loaded model and transcoders (the
      // server refuses the others too, with a 409 saying what differs)
      const mine = !madeWith[id] || madeWith[id] === LOADED;
      if (canCompute && mine) {
        calls.feature = async (layer, feature) =>
          check(await request(`${api}/feature?${q}&layer=${layer}&feature=${feature}`));
        calls.intervene = async body => check(await request(`${api}/intervene`, Object.assign({ id: id }, body)));
      }
      viewer.mount(root, r.data, { api: calls });   // CLGraphView.mount (a test may stand in for it)
      status(canCompute && !mine ? (madeWith[id] === "unrecorded"
        ? "view only: this graph records no identity of the model it was made with; make it again with " +
          "`circuitlab graph` to intervene"
        : "view only: this graph was made with " + madeWith[id]) : "");
    }

    $("open-form").addEventListener("submit", ev => { ev.preventDefault(); open($("graph-list").value); });
    $("compute-form").addEventListener("submit", async ev => {
      ev.preventDefault();
      status("computing the graph…");
      const body = Object.assign({ prompt: $("compute-prompt").value }, optionValues());
      const r = await request(`${api}/compute`, body);
      if (!r.ok) { status(r.data.detail); return; }
      await list(r.data.id);
      open(r.data.id);
    });

    const wanted = new URLSearchParams(location.search).get("id");
    return list(wanted).then(() => { if (wanted) return open(wanted); });
  }

  const viewer = { mount: mount, reprune: reprune, browse: browse };   // CLGraphView
  // A page that asks for the browser (an element with data-clgv-browse="API": graph_view.py's graph_browser_html)
  // starts it here once the page is parsed: the explorer's pages run no inline scripts. A report has none.
  const boot = () => document.querySelectorAll("[data-clgv-browse]").forEach(e => browse(e, e.dataset.clgvBrowse));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot); else boot();
  return viewer;
})();
