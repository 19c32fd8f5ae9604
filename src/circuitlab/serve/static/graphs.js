// /graphs: the attribution graphs under the runs folder, opened in the viewer (graph_view.js).
"use strict";

(function () {
  const $ = id => document.getElementById(id);
  const status = text => { $("status").textContent = text; };
  let canCompute = false;
  const LOADED = "the loaded model and transcoders";
  let madeWith = {};   // id -> what the graph was made with, against the loaded model (null: none loaded)
  let options = null;  // the compute form's options: field -> JSON schema (default, bounds, description)

  // The compute form's inputs are option-<field>, one per GraphOptions field the explorer takes; each one's
  // default, bounds and help come from the server (graphs/options.py, the one place they are written), and
  // what they hold goes back under the field's name.
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
    const r = await cl.api("/api/graphs");
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
      const other = g.made_with && g.made_with !== LOADED
        ? (g.made_with === "unrecorded" ? " · view only: records no model" : " · view only: " + g.made_with.split(":")[0])
        : "";
      sel.append(cl.el("option", { value: g.id,
                                   text: `${g.id} — ${JSON.stringify(g.prompt)} (${g.nodes} nodes)${other}` }));
    }
    if (select) sel.value = select;
    if (!r.data.graphs.length) status("no graphs yet: write one with `circuitlab graph ... --out RUNS/NAME`");
  }

  async function open(id) {
    status("loading " + id + "…");
    const r = await cl.api("/api/graphs/graph?id=" + encodeURIComponent(id));
    if (!r.ok) { status(r.data.detail); return; }
    history.replaceState(null, "", "/graphs?id=" + encodeURIComponent(id));
    const q = "id=" + encodeURIComponent(id);
    const api = {
      save: async body => check(await cl.api("/api/graphs/qparams", Object.assign({ id: id }, body))),
    };
    // feature cards and interventions only on a graph made with the loaded model and transcoders (the
    // server refuses the others too, with a 409 saying what differs)
    const mine = !madeWith[id] || madeWith[id] === LOADED;
    if (canCompute && mine) {
      api.feature = async (layer, feature) =>
        check(await cl.api(`/api/graphs/feature?${q}&layer=${layer}&feature=${feature}`));
      api.intervene = async body => check(await cl.api("/api/graphs/intervene", Object.assign({ id: id }, body)));
    }
    CLGraphView.mount($("viewer"), r.data, { api: api });
    status(canCompute && !mine ? (madeWith[id] === "unrecorded"
      ? "view only: this graph records no identity of the model it was made with; make it again with `circuitlab graph` to intervene"
      : "view only: this graph was made with " + madeWith[id]) : "");
  }

  $("open-form").addEventListener("submit", ev => { ev.preventDefault(); open($("graph-list").value); });
  $("compute-form").addEventListener("submit", async ev => {
    ev.preventDefault();
    status("computing the graph…");
    const body = Object.assign({ prompt: $("compute-prompt").value }, optionValues());
    const r = await cl.api("/api/graphs/compute", body);
    if (!r.ok) { status(r.data.detail); return; }
    await list(r.data.id);
    open(r.data.id);
  });

  const wanted = new URLSearchParams(location.search).get("id");
  list(wanted).then(() => { if (wanted) open(wanted); });
})();
