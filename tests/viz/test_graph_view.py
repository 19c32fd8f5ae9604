"""The graph viewer's data: the page re-prunes by export.reprune, which equals Graph.prune at the file's
node threshold for every edge threshold up to the file's; the viewer HTML is self-contained and safe."""
import html as html_module
import json

import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.graphs import Transcoders, attribute
from circuitlab.graphs.export import neuronpedia_json, reprune
from circuitlab.viz.graph_view import graph_view_html
from helpers import random_model
from graphs.test_attribution import random_transcoder

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph():
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=32, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=50)
    model = random_model(cfg, scale=1.0).double().eval()
    tc = Transcoders.per_layer(model, [random_transcoder(layer, 32) for layer in range(3)])
    tokens = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(3))
    return attribute(model, tc, tokens, batch_size=16, progress=False)


def _ids(graph, pruned):
    data = neuronpedia_json(graph, pruned)
    by_index = {i: n["node_id"] for i, n in zip(pruned.node_mask.nonzero().flatten().tolist(), data["nodes"])}
    return data, by_index


@pytest.mark.parametrize("node_threshold,edge_threshold", [(0.8, 0.98), (0.9, 0.95), (0.6, 0.9)])
def test_reprune_is_graph_prune_at_the_files_node_threshold(graph, node_threshold, edge_threshold):
    data = json.loads(json.dumps(neuronpedia_json(graph, graph.prune(node_threshold, edge_threshold))))
    assert data["metadata"]["edge_threshold"] == edge_threshold
    for e in (edge_threshold, 0.9, 0.7, 0.5, 0.2):
        if e > edge_threshold:
            continue
        want = graph.prune(node_threshold, e)
        nodes, links = reprune(data, node_threshold, e)
        assert len(nodes) == int(want.node_mask.sum())
        assert len(links) == int(want.edge_mask.sum())
        written = json.loads(json.dumps(neuronpedia_json(graph, want)))
        assert set(nodes) == {n["node_id"] for n in written["nodes"]}
        assert {(x["source"], x["target"]) for x in links} == {(x["source"], x["target"]) for x in written["links"]}


def test_reprune_mutation_fails(graph):
    """Ranking by the node's own cumulative share (what Neuronpedia's 'influence' is) instead of the share
    before it drops the boundary node: the counts then differ from Graph.prune's."""
    pruned = graph.prune(0.8, 0.98)
    data = neuronpedia_json(graph, pruned)
    for n in data["nodes"]:
        if n["feature_type"] not in ("embedding", "logit"):
            n["influence_before"] = n["influence"]
    nodes, _ = reprune(data, 0.8, 0.98)
    assert len(nodes) != int(pruned.node_mask.sum())


def test_stricter_node_threshold_keeps_a_subset(graph):
    data = neuronpedia_json(graph, graph.prune(0.9, 0.98))
    wide, _ = reprune(data, 0.9, 0.98)
    narrow, links = reprune(data, 0.5, 0.98)
    assert set(narrow) < set(wide)
    assert all(x["source"] in narrow and x["target"] in narrow for x in links)


def test_view_html_is_self_contained_and_escapes_the_data(graph):
    pruned = graph.prune()
    data = neuronpedia_json(graph, pruned)
    data["metadata"]["prompt"] = "</script><script>alert(1)</script>"
    html = graph_view_html(data, page=True)
    assert html.count("</script>") == html.count("<script")        # the prompt cannot close a script element
    assert "alert(1)</script>" not in html
    assert "src=" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    two = graph_view_html((graph, pruned)) + graph_view_html((graph, pruned))
    ids = [part.split("'")[0] for part in two.split("<div id='")[1:]]
    assert len(set(ids)) == 2


def test_browser_page_has_one_input_per_option_and_no_inline_script():
    """graph_browser_html's form is the options class's fields (a menu for choices, a number whose step is its
    kind's, text otherwise); its script comes from `assets`, started by data-clgv-browse (never inline)."""
    from dataclasses import dataclass

    from circuitlab.checks import COUNT, SHARE
    from circuitlab.spec import Options, option
    from circuitlab.viz.graph_view import graph_browser_html

    @dataclass(frozen=True)
    class Toy(Options):
        share: float = option(0.5, SHARE, help="a share")
        cap: int | None = option(None, COUNT, help="a cap")
        kind: str = option("a", choices=("a", "W_E"), help="a kind")
        name: str = option("x", help="a name")

    page = graph_browser_html("/api/x?a=<b>", Toy, assets="/assets/", stylesheets=("/s.css",), nav="<nav>N</nav>")
    assert '<input id="option-share" type="number" step="0.01">' in page
    assert '<input id="option-cap" type="number" step="1" placeholder="all">' in page
    assert ('<select id="option-kind"><option value="a">a</option><option value="W_E">W_E (circuit-tracer)</option>'
            '</select>') in page
    assert '<input id="option-name" type="text">' in page and page.count('id="option-') == 4
    assert 'data-clgv-browse="/api/x?a=&lt;b&gt;"' in page and "<nav>N</nav>" in page
    assert '<script src="/assets/graph_view.js" defer></script>' in page and page.count("<script") == 1
    assert '<link rel="stylesheet" href="/s.css">' in page and 'href="/assets/graph_view.css"' in page


def test_node_ids_are_unique_even_where_circuit_tracers_error_ids_collide(graph):
    """Error "0_{layer}_{pos}" is also layer 0's feature {layer} at pos (circuit-tracer's scheme): a viewer
    keyed by id would merge them, so such an error node is renamed."""
    data = neuronpedia_json(graph, graph.prune(1.0, 1.0))
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    feats = {n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"}
    errors = [n for n in data["nodes"] if n["feature_type"] == "mlp reconstruction error"]
    renamed = [n for n in errors if n["node_id"].endswith("_error")]
    assert all(n["node_id"].removesuffix("_error") in feats for n in renamed)
    assert all(n["node_id"] == f"0_{n['layer']}_{n['ctx_idx']}" for n in errors if n not in renamed)


def test_report_carries_a_card_for_every_pruned_feature(tmp_path):
    import helpers

    _, _, _, run = helpers.saved_graph_run(tmp_path, dashboard_tokens=256)
    data = json.loads((tmp_path / "graphs/lily/graph.json").read_text())
    feats = {"_".join(n["node_id"].split("_")[:2]) for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"}
    assert feats and set(run.cards) == feats
    assert all(c["contexts"] and c["logits"]["promoted"] for c in run.cards.values())
    html = (tmp_path / "graphs/lily/report.html").read_text()
    some = next(iter(run.cards.values()))["contexts"][0]
    assert json.dumps(some["value"]) in html and "CLGraphView.mount" in html
    assert "<svg" not in html.split("<h2>The pruned graph</h2>")[0]
    # the static drawing sits inside the viewer's element: shown where scripts do not run, replaced where they do
    assert "<div id='clgv-" in html and html.index("<div id='clgv-") < html.index("<svg") < html.index("CLGraphView.mount")
    shown = run._repr_html_()                                            # Jupyter: the same viewer
    assert "CLGraphView.mount" in shown and "<svg" in shown and html_module.escape(run.summary[1]) in shown
    # the strongest paths: one table, the same in report.html, report.md and the graph's own Jupyter display
    from circuitlab.viz.graph_view import graph_summary_html, paths_table

    paths = run.graph.top_paths(5, run.pruned)
    assert paths and [p["words"] for p in paths] == [p["words"] for p in run.data["top_paths"]]
    assert paths_table(paths) in html and html.count("<th>strongest paths</th>") == 1
    assert paths_table(paths, markdown=True) in (tmp_path / "graphs/lily/report.md").read_text()
    assert paths_table(paths) in graph_summary_html(run.graph, run.pruned)
    assert "<th>strongest paths</th>" in run.graph._repr_html_()     # a Graph in Jupyter (viz registers its display)


def test_graph_command_refuses_negative_dashboard_tokens(tmp_path, monkeypatch, capsys):
    from circuitlab.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:   # the parser's one-line error (exit 2)
        main(["graph", "--planted", "--prompt", "xAxBxyx", "--dashboard-tokens", "-1"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--dashboard-tokens" in err and len(err.splitlines()) == 1
