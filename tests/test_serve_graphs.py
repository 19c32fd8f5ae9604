"""The explorer's /graphs endpoints on a saved graph (FastAPI's TestClient): listing, the graph file itself,
qParams saved back, interventions equal to the replacement model's own, bounded graph computation, and bad
bodies answered 4xx in one line."""
import json

import pytest
import torch
from fastapi.testclient import TestClient

import helpers
from circuitlab.experiments.graph import graph_experiment
from circuitlab.graphs import Intervention, ReplacementModel

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    model, tokenizer, tc, run = helpers.saved_graph_run(root)
    from circuitlab.serve import create_app

    app = create_app(root / "model", graphs=root / "graphs", transcoders=root / "transcoders",
                     graph_runner=graph_experiment)
    return TestClient(app), root, model, tokenizer, tc, run


def _one_line(r, status=422):
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and detail
    return detail


def test_lists_and_serves_the_graph_file_itself(served):
    client, root, *_ = served
    listed = client.get("/api/graphs").json()
    assert [g["id"] for g in listed["graphs"]] == ["lily"] and listed["can_compute"]
    results = json.loads((root / "graphs/lily/results.json").read_text())
    assert listed["graphs"][0]["nodes"] == results["graph"]["pruned"]["nodes"]
    data = client.get("/api/graphs/graph", params={"id": "lily"}).json()
    assert data == json.loads((root / "graphs/lily/graph.json").read_text())
    assert len(data["nodes"]) == results["graph"]["pruned"]["nodes"]
    assert len(data["links"]) == results["graph"]["pruned"]["edges"]
    assert data["metadata"]["scores"]["replacement"] == pytest.approx(results["graph"]["replacement_score"])
    assert client.get("/graphs").status_code == 200
    assert "CLGraphView" in client.get("/static/graph_view.js").text


@pytest.mark.parametrize("bad", ["../model", "../../etc/passwd", "/etc/passwd", "lily/..", "lily/../lily", "",
                                 "graphs/lily", "%2e%2e/model"])
def test_traversal_in_the_graph_parameter_is_404(served, bad):
    client = served[0]
    _one_line(client.get("/api/graphs/graph", params={"id": bad}), 404)
    _one_line(client.post("/api/graphs/qparams", json={"id": bad, "pinnedIds": []}), 404)


def test_supernodes_round_trip_through_the_file(served):
    client, root, *_ = served
    data = client.get("/api/graphs/graph", params={"id": "lily"}).json()
    feats = [n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"][:2]
    r = client.post("/api/graphs/qparams", json={"id": "lily", "pinnedIds": feats,
                                                 "supernodes": [["say Lily", *feats]]})
    assert r.status_code == 200, r.text
    again = json.loads((root / "graphs/lily/graph.json").read_text())
    assert again["qParams"]["supernodes"] == [["say Lily", *feats]] and again["qParams"]["pinnedIds"] == feats
    assert again["nodes"] == data["nodes"] and again["links"] == data["links"]
    detail = _one_line(client.post("/api/graphs/qparams", json={"id": "lily", "pinnedIds": ["9_9_99"]}))
    assert "9_9_99" in detail
    _one_line(client.post("/api/graphs/qparams", json={"id": "lily", "supernodes": [["x", "nope"]]}))
    _one_line(client.post("/api/graphs/qparams", json={"id": "lily", "supernodes": [["  ", feats[0]]]}))
    _one_line(client.post("/api/graphs/qparams", json={"id": "lily", "supernodes": [["alone"]]}))
    _one_line(client.post("/api/graphs/qparams", json={"id": "lily", "pinnedIds": "x", "extra": 1}))


def test_intervention_equals_the_replacement_models_own(served):
    client, root, model, tokenizer, tc, run = served
    data = client.get("/api/graphs/graph", params={"id": "lily"}).json()
    node = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    r = client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [node["node_id"]], "scale": 0})
    assert r.status_code == 200, r.text
    cols = r.json()["columns"]
    assert set(cols) == {"graph (no intervention)", "replacement model", "model, attention frozen",
                         "model, attention free"}
    layer, feature, pos = map(int, node["node_id"].split("_"))
    rm = ReplacementModel(model, tc, run.graph.tokens)
    iv = [Intervention(layer, feature, scale=0.0, pos=pos)]
    for name, kw in (("replacement model", {}), ("model, attention frozen", {"mode": "model"}),
                     ("model, attention free", {"mode": "model", "freeze_attention": False})):
        probs = rm.run(iv, **kw).logits[0, -1].double().softmax(-1)
        p, i = probs.topk(5)
        assert [x["id"] for x in cols[name]] == i.tolist()
        assert [x["prob"] for x in cols[name]] == pytest.approx(p.tolist())
    # scale 1 changes nothing: the replacement model predicts what the graph's logit nodes say
    same = client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [node["node_id"]], "scale": 1}).json()
    graph_col = same["columns"]["graph (no intervention)"]
    assert [x["id"] for x in same["columns"]["replacement model"][:len(graph_col)]] == [x["id"] for x in graph_col]


@pytest.mark.parametrize("body", [
    {"nodes": ["9_9_99"], "scale": 0},                       # unknown node id
    {"nodes": [], "scale": 0},                               # nothing chosen
    {"nodes": "E_1_0", "scale": 0},                          # not a list
    {"scale": 0},                                            # missing nodes
    {"nodes": ["@token"], "scale": "2"},                     # a string scale
    {"nodes": ["@token"], "scale": True},                    # a boolean scale
    {"nodes": ["@token"], "scale": 0},                       # a token node cannot be scaled
    {"nodes": ["@feature"], "scale": 1e9},                   # past the scale rule
    {"nodes": ["@feature"], "scale": 0, "top": 0},
])
def test_bad_intervention_bodies_are_422_in_one_line(served, body):
    client = served[0]
    data = client.get("/api/graphs/graph", params={"id": "lily"}).json()
    pick = {"@token": next(n["node_id"] for n in data["nodes"] if n["feature_type"] == "embedding"),
            "@feature": next(n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")}
    if isinstance(body.get("nodes"), list):
        body = {**body, "nodes": [pick.get(x, x) for x in body["nodes"]]}
    _one_line(client.post("/api/graphs/intervene", json={"id": "lily", **body}))


def test_nan_and_infinite_scales_are_refused(served):
    client = served[0]
    for text in ("NaN", "Infinity", "-Infinity"):
        body = '{"id": "lily", "nodes": ["0_0_0"], "scale": %s}' % text
        r = client.post("/api/graphs/intervene", content=body, headers={"content-type": "application/json"})
        assert "scale" in _one_line(r) or "JSON" in _one_line(r)


def test_feature_cards_on_demand(served, monkeypatch):
    client = served[0]
    import circuitlab.serve.graphs as graphs

    monkeypatch.setattr(graphs, "CARD_TOKENS", 512)
    data = client.get("/api/graphs/graph", params={"id": "lily"}).json()
    layer, feature, _ = map(int, next(n["node_id"] for n in data["nodes"]
                                      if n["feature_type"] == "cross layer transcoder").split("_"))
    card = client.get("/api/graphs/feature", params={"id": "lily", "layer": layer, "feature": feature}).json()
    assert card["feature"] == feature and "contexts" in card and card["logits"]["promoted"]
    _one_line(client.get("/api/graphs/feature", params={"id": "lily", "layer": layer, "feature": 10**6}))
    _one_line(client.get("/api/graphs/feature", params={"id": "lily", "layer": "x", "feature": 1}))
    _one_line(client.get("/api/graphs/feature", params={"id": "../x", "layer": 0, "feature": 1}), 404)


def test_compute_is_bounded_and_lists_the_new_graph(served, monkeypatch):
    client, root, *_ = served
    import circuitlab.serve.graphs as graphs

    assert "threshold" in _one_line(client.post("/api/graphs/compute", json={"prompt": "Lily", "node_threshold": 5}))
    assert "threshold" in _one_line(client.post("/api/graphs/compute", json={"prompt": "Lily", "edge_threshold": 0}))
    assert "max_feature_nodes" in _one_line(client.post("/api/graphs/compute",
                                                        json={"prompt": "Lily", "max_feature_nodes": 10**9}))
    assert "64" in _one_line(client.post("/api/graphs/compute", json={"prompt": "Lily saw a cat. " * 5}))
    monkeypatch.setattr(graphs, "MAX_GRAPH_MB", 0.2)   # the whole graph does not fit; some feature nodes do
    detail = _one_line(client.post("/api/graphs/compute", json={"prompt": "Lily saw"}))
    assert "MB" in detail and "max_feature_nodes" in detail
    monkeypatch.undo()
    bad = client.post("/api/graphs/compute", json={"prompt": "Lily", "token_nodes": "W_pos"})
    assert "token_nodes" in _one_line(bad)
    r = client.post("/api/graphs/compute", json={"prompt": "Lily saw", "edge_threshold": 0.9, "token_nodes": "W_E"})
    assert r.status_code == 200, r.text
    new = r.json()["id"]
    assert new.startswith(graphs.COMPUTED + "/") and new in [g["id"] for g in client.get("/api/graphs").json()["graphs"]]
    assert client.get("/api/graphs/graph", params={"id": new}).json()["metadata"]["edge_threshold"] == 0.9
    from circuitlab.graphs import Graph

    assert Graph.load(root / "graphs" / new / "graph").token_nodes == "W_E"   # circuit-tracer's token nodes, as asked


def test_without_transcoders_viewing_works_and_model_work_is_409(served, tmp_path):
    _, root, *_ = served
    from circuitlab.serve import create_app

    client = TestClient(create_app(None, graphs=root / "graphs"))
    assert client.get("/api/graphs").json()["can_compute"] is False
    assert client.get("/api/graphs/graph", params={"id": "lily"}).status_code == 200
    _one_line(client.post("/api/graphs/intervene", json={"id": "lily", "nodes": ["0_0_0"], "scale": 0}), 409)
    _one_line(client.post("/api/graphs/compute", json={"prompt": "Lily"}), 409)


def test_feature_cards_come_from_saved_dashboards_when_the_transcoders_have_them(served):
    """`circuitlab sae dashboards` writes <dictionary>/dashboards: the explorer shows those (here built on
    other text than the on-demand cards, so they differ) and computes only what they lack."""
    _, root, model, tokenizer, tc, _ = served
    from circuitlab.dictionaries.features import feature_dashboards
    from circuitlab.serve import create_app

    data = json.loads((root / "graphs/lily/graph.json").read_text())
    layer0 = sorted({int(n["node_id"].split("_")[1]) for n in data["nodes"]
                     if n["feature_type"] == "cross layer transcoder" and n["layer"] == "0"})
    assert layer0
    batches = torch.tensor([tokenizer.encode("Lily and Tom saw a big dog. The dog ran to Lily.")[:40]])
    dash = feature_dashboards(model, tc.dictionary(0), batches, features=layer0[:1], k=3, tokenizer=tokenizer)
    dash.save(root / "transcoders" / "layer0" / "dashboards")
    try:
        client = TestClient(create_app(root / "model", graphs=root / "graphs", transcoders=root / "transcoders"))
        card = client.get("/api/graphs/feature", params={"id": "lily", "layer": 0, "feature": layer0[0]}).json()
        assert card["from"].startswith("saved dashboards") and card["contexts"] == dash.feature(layer0[0])["contexts"]
    finally:
        import shutil

        shutil.rmtree(root / "transcoders" / "layer0" / "dashboards")


def test_bad_server_options_are_one_line_errors(served, tmp_path):
    _, root, *_ = served
    from circuitlab.errors import CircuitlabError
    from circuitlab.serve import create_app

    with pytest.raises(CircuitlabError, match="--transcoders needs --checkpoint"):
        create_app(None, transcoders=root / "transcoders")
    with pytest.raises(CircuitlabError, match="is not a folder"):
        create_app(None, graphs=tmp_path / "missing")
    with pytest.raises(CircuitlabError, match="transcoder folder not found"):
        create_app(root / "model", transcoders=tmp_path / "missing")
