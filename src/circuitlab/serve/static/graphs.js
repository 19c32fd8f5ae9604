// /graphs: the attribution graphs under the runs folder, opened in the viewer (graph_view.js).
"use strict";

(function () {
  const $ = id => document.getElementById(id);
  const status = text => { $("status").textContent = text; };
  let canCompute = false;
  const LOADED = "the loaded model and transcoders";
  let madeWith = {};   // id -> what the graph was made with, against the loaded model (null: none loaded)

  function check(r) {
    if (!r.ok) throw new Error(r.data.detail || ("the server answered " + r.status));
    return r.data;
  }

  async function list(select) {
    const r = await cl.api("/api/graphs");
    if (!r.ok) { status(r.data.detail); return; }
    canCompute = r.data.can_compute;
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
    const body = { prompt: $("compute-prompt").value, node_threshold: +$("compute-nodes").value,
                   edge_threshold: +$("compute-edges").value };
    if ($("compute-max").value) body.max_feature_nodes = +$("compute-max").value;
    body.token_nodes = $("compute-token-nodes").value;
    const r = await cl.api("/api/graphs/compute", body);
    if (!r.ok) { status(r.data.detail); return; }
    await list(r.data.id);
    open(r.data.id);
  });

  const wanted = new URLSearchParams(location.search).get("id");
  list(wanted).then(() => { if (wanted) open(wanted); });
})();
