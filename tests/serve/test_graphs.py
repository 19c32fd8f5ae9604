"""The explorer's /graphs endpoints on a saved graph (FastAPI's TestClient): listing, the graph file itself,
qParams saved back, interventions equal to the replacement model's own, bounded graph computation, and bad
bodies answered 4xx in one line."""
import dataclasses
import json
from html.parser import HTMLParser

import pytest
import torch
from fastapi.testclient import TestClient

import helpers
from circuitlab.methods.graph import graph_experiment
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

    monkeypatch.setattr(graphs, "DEFAULTS", dataclasses.replace(graphs.DEFAULTS, dashboard_tokens=512))
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


# ---------------------------------------------------------------------------- what a graph was made with

def _other_root(served, tmp_path):
    """A runs folder holding a copy of lily, for tests that change graph files or serve other weights."""
    import shutil

    _, root, *_ = served
    shutil.copytree(root / "graphs" / "lily", tmp_path / "graphs" / "lily")
    return tmp_path / "graphs"


def _feature_of(data):
    node = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    layer, feature, _ = map(int, node["node_id"].split("_"))
    return node["node_id"], layer, feature


def test_a_graph_made_with_another_model_is_409_not_an_answer(served, tmp_path):
    """The planted model's graph (tokens inside the story model's vocabulary) under the story model: no
    intervention, no feature card, and the listing says so; viewing it still works."""
    from circuitlab.graphs.planted import PlantedTokenizer, planted_path_model
    from circuitlab.serve import create_app

    _, root, *_ = served
    graphs = _other_root(served, tmp_path)
    p = planted_path_model()
    graph_experiment(p.model, p.transcoders, "xAxBxyx", PlantedTokenizer(), out=graphs / "planted", progress=False,
                     dashboard_tokens=0)
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=root / "transcoders"))
    data = client.get("/api/graphs/graph", params={"id": "planted"}).json()
    assert max(int(n["node_id"].split("_")[1]) for n in data["nodes"] if n["feature_type"] == "embedding") < 40
    node, layer, feature = _feature_of(data)
    detail = _one_line(client.post("/api/graphs/intervene", json={"id": "planted", "nodes": [node], "scale": 0}), 409)
    assert "another model" in detail and "--checkpoint" in detail
    _one_line(client.get("/api/graphs/feature", params={"id": "planted", "layer": layer, "feature": feature}), 409)
    made = {g["id"]: g["made_with"] for g in client.get("/api/graphs").json()["graphs"]}
    assert made["lily"] == "the loaded model and transcoders" and made["planted"].startswith("another model")
    lily_node = _feature_of(client.get("/api/graphs/graph", params={"id": "lily"}).json())[0]
    assert client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [lily_node], "scale": 0}).status_code == 200


def test_same_shape_other_weights_and_other_transcoders_are_named(served, tmp_path):
    """A model of the same configuration trained otherwise, and transcoders of the same shape with other
    weights: each refused, saying which of the two differs."""
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.serve import create_app
    from circuitlab.training import save_checkpoint

    _, root, model, tokenizer, tc, _ = served
    graphs = _other_root(served, tmp_path)
    node, *_ = _feature_of(json.loads((graphs / "lily/graph.json").read_text()))
    other = helpers.random_model(model.cfg, scale=1.0, seed=7).eval()
    save_checkpoint(tmp_path / "other-model" / "checkpoint", other, tokenizer)
    client = TestClient(create_app(tmp_path / "other-model", graphs=graphs, transcoders=root / "transcoders"))
    detail = _one_line(client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [node], "scale": 0}), 409)
    assert "same configuration" in detail and "other weights" in detail

    for layer in range(model.cfg.n_layers):
        d = SparseDictionary.load(root / "transcoders" / f"layer{layer}")
        with torch.no_grad():
            d.W_dec.mul_(1.5)
        d.save(tmp_path / "other-transcoders" / f"layer{layer}")
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=tmp_path / "other-transcoders"))
    detail = _one_line(client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [node], "scale": 0}), 409)
    assert "other transcoders" in detail


def test_a_graph_recording_no_identity_says_so(served, tmp_path):
    from circuitlab.serve import create_app

    _, root, *_ = served
    graphs = _other_root(served, tmp_path)
    data = json.loads((graphs / "lily/graph.json").read_text())
    del data["metadata"]["identity"]
    (graphs / "lily/graph.json").write_text(json.dumps(data))
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=root / "transcoders"))
    node, layer, feature = _feature_of(data)
    detail = _one_line(client.post("/api/graphs/intervene", json={"id": "lily", "nodes": [node], "scale": 0}), 409)
    assert "records no identity" in detail
    _one_line(client.get("/api/graphs/feature", params={"id": "lily", "layer": layer, "feature": feature}), 409)
    assert client.get("/api/graphs/graph", params={"id": "lily"}).status_code == 200


def _spoil(data, how):
    """One malformation of a viewer file (a dict), by name."""
    feat = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    token = next(n for n in data["nodes"] if n["feature_type"] == "embedding")
    logit = next(n for n in data["nodes"] if n["feature_type"] == "logit")
    if how == "no nodes":
        del data["nodes"]
    elif how == "nodes an object":
        data["nodes"] = {"a": 1}
    elif how == "links a string":
        data["links"] = "x"
    elif how == "metadata a list":
        data["metadata"] = []
    elif how == "a node a number":
        data["nodes"].append(3)
    elif how == "a node without id":
        del feat["node_id"]
    elif how == "a repeated id":
        data["nodes"].append(dict(feat))
    elif how == "feature id not numbers":
        feat["node_id"] = "a_b_c"
    elif how == "feature id at another position":
        layer, f, pos = feat["node_id"].split("_")
        feat["node_id"] = f"{layer}_{f}_{int(pos) + 7}"
    elif how == "token id malformed":
        token["node_id"] = "E_x"
    elif how == "token positions with a gap":
        data["nodes"] = [n for n in data["nodes"] if not (n["feature_type"] == "embedding" and n["ctx_idx"] == 0)]
        data["links"] = [x for x in data["links"] if x["source"] in {n["node_id"] for n in data["nodes"]}
                         and x["target"] in {n["node_id"] for n in data["nodes"]}]
    elif how == "ctx_idx a string":
        token["ctx_idx"] = "0"
    elif how == "logit feature a string":
        logit["feature"] = "12"
    elif how == "logit prob infinite":
        logit["token_prob"] = float("inf")
    elif how == "link to an unknown node":
        data["links"][0]["target"] = "9_9_99"
    elif how == "link weight a string":
        data["links"][0]["weight"] = "0.5"
    elif how == "qParams a list":
        data["qParams"] = []
    elif how == "supernodes of numbers":
        data["qParams"]["supernodes"] = [[1, 2]]
    elif how == "identity a string":
        data["metadata"]["identity"] = "x"
    return data


MALFORMED = ["no nodes", "nodes an object", "links a string", "metadata a list", "a node a number", "a node without id",
             "a repeated id", "feature id not numbers", "feature id at another position", "token id malformed",
             "token positions with a gap", "ctx_idx a string", "logit feature a string", "logit prob infinite",
             "link to an unknown node", "link weight a string", "qParams a list", "supernodes of numbers",
             "identity a string"]
BROKEN_TEXT = {"not JSON": b"{nodes: ", "truncated": None, "a list": b"[1, 2]", "not UTF-8": b'{"a": "\xff"}',
               "nested too deep": b"[" * 100_000 + b"]" * 100_000, "null": b"null"}


@pytest.fixture(scope="module")
def spoiled(served, tmp_path_factory):
    """One app over a runs folder holding lily and one spoiled copy of it per malformation."""
    import shutil

    from circuitlab.serve import create_app

    _, root, *_ = served
    graphs = tmp_path_factory.mktemp("spoiled") / "graphs"
    good = (root / "graphs/lily/graph.json").read_bytes()
    for i, how in enumerate(MALFORMED + list(BROKEN_TEXT)):
        shutil.copytree(root / "graphs" / "lily", graphs / f"bad{i}")
        if how in BROKEN_TEXT:
            text = BROKEN_TEXT[how] if BROKEN_TEXT[how] is not None else good[:len(good) // 2]
        else:
            text = json.dumps(_spoil(json.loads(good), how)).encode()
        (graphs / f"bad{i}" / "graph.json").write_bytes(text)
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=root / "transcoders"),
                        raise_server_exceptions=False)
    return client, _feature_of(json.loads(good))


@pytest.mark.parametrize("i, how", list(enumerate(MALFORMED + list(BROKEN_TEXT))))
def test_every_endpoint_answers_a_malformed_graph_file_with_422_in_one_line(spoiled, i, how):
    """Each endpoint reading the file: one line naming the file, never a 500 or a bare key."""
    client, (node, layer, feature) = spoiled
    gid = f"bad{i}"
    for r in (client.get("/api/graphs/graph", params={"id": gid}),
              client.post("/api/graphs/intervene", json={"id": gid, "nodes": [node], "scale": 0}),
              client.get("/api/graphs/feature", params={"id": gid, "layer": layer, "feature": feature}),
              client.post("/api/graphs/qparams", json={"id": gid, "pinnedIds": []})):
        detail = _one_line(r)
        assert f"{gid}/graph.json" in detail and "circuitlab graph" in detail
    listed = client.get("/api/graphs")
    assert listed.status_code == 200 and gid in [g["id"] for g in listed.json()["graphs"]]


@pytest.mark.parametrize("results", [b"[]", b'{"graph": []}', b'{"graph": {"pruned": 3}}', b"{",
                                     b'{"prompt": {"a": 1}, "graph": {"replacement_score": NaN, "pruned": {"nodes": "9"}}}'])
def test_a_malformed_results_file_leaves_the_listing_whole(served, tmp_path, results):
    from circuitlab.serve import create_app

    _, root, *_ = served
    graphs = _other_root(served, tmp_path)
    (graphs / "lily/results.json").write_bytes(results)
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=root / "transcoders"),
                        raise_server_exceptions=False)
    r = client.get("/api/graphs")
    assert r.status_code == 200, r.text
    entry = r.json()["graphs"][0]
    assert entry["id"] == "lily" and entry["prompt"] is None
    assert entry.get("replacement_score") is None and entry.get("nodes") is None


def test_a_nan_in_an_older_graph_file_is_read_as_null(served, tmp_path):
    """Files written before JSON was strict may hold NaN: read as null, served as valid JSON (200)."""
    from circuitlab.serve import create_app

    _, root, *_ = served
    graphs = _other_root(served, tmp_path)
    text = (graphs / "lily/graph.json").read_text()
    (graphs / "lily/graph.json").write_text(text.replace('"node_threshold": 0.8', '"node_threshold": NaN'))
    client = TestClient(create_app(root / "model", graphs=graphs, transcoders=root / "transcoders"),
                        raise_server_exceptions=False)
    r = client.get("/api/graphs/graph", params={"id": "lily"})
    assert r.status_code == 200 and r.json()["metadata"]["node_threshold"] is None


class _Inputs(HTMLParser):
    """The option-<field> inputs (and menus) of a page: {field: its step ("" for a menu)}; every id seen."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[str, str] = {}
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.ids += [a["id"]] if "id" in a else []
        if tag in ("input", "select") and (a.get("id") or "").startswith("option-"):
            self.steps[a["id"].removeprefix("option-")] = a.get("step") or ""


def test_the_page_is_the_viewers_browser_in_the_explorers_header(served):
    """/graphs: the explorer's nav with graphs marked, the browser's controls (one input per field the compute
    request takes), the viewer started by graph_view.js from /static/ (no inline script); the old files are gone."""
    from circuitlab.graphs.options import EXPLORER
    from circuitlab.serve.page import nav_html

    client = served[0]
    r = client.get("/graphs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    page = _Inputs()
    page.feed(r.text)
    assert {"graph-info", "open-form", "graph-list", "open", "compute-form", "compute-prompt", "compute", "status",
            "viewer"} <= set(page.ids)
    assert list(page.steps) == list(EXPLORER)
    assert nav_html("/graphs") in r.text and '<a href="/graphs" aria-current="page">graphs</a>' in r.text
    assert 'data-clgv-browse="/api/graphs"' in r.text and '<script src="/static/graph_view.js" defer>' in r.text
    assert "<script>" not in r.text
    assert client.get("/static/graph_view.css").status_code == 200
    assert client.get("/static/graphs.js").status_code == 404 and client.get("/static/graphs.html").status_code == 404


def test_the_page_takes_its_options_from_the_server_and_sends_them_back(served, tmp_path):
    """The browser of viz/graph_view.js (CLGraphView.browse) run by node against a minimal fake DOM
    (tests/js/fake_dom.js) with the API's real listing and the served page's inputs: the compute form shows
    GraphOptions' defaults, bounds and help (the page writes none of its own), and submitting it as shown sends
    exactly those defaults, which the explorer accepts as GraphOptions' own."""
    import shutil
    import subprocess
    from importlib import resources
    from pathlib import Path

    from circuitlab.graphs.options import DEFAULTS, EXPLORER, GraphOptions
    from circuitlab.serve.app import STATIC_DIR
    from circuitlab.serve.graphs import ComputeRequest
    from circuitlab.spec import options_of

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    client = served[0]
    listing = client.get("/api/graphs").json()
    answers = {"GET /api/graphs/graph": client.get("/api/graphs/graph", params={"id": "lily"}).json(),
               "GET /api/graphs": listing, "POST /api/graphs/compute": {"id": "lily"}}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    inputs = _Inputs()
    inputs.feed(client.get("/graphs").text)
    script = resources.files("circuitlab.viz").joinpath("graph_view.js")
    done = subprocess.run([node, str(Path(__file__).parents[1] / "js" / "graphs_smoke.js"), str(tmp_path / "answers.json"),
                           str(STATIC_DIR), str(script), json.dumps(inputs.steps)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    helps = {f.name: opt.help for f, opt in options_of(GraphOptions)}
    assert set(page["shown"]) == set(EXPLORER) == set(listing["options"])
    for name, shown in page["shown"].items():
        default = getattr(DEFAULTS, name)
        assert shown["value"] == ("" if default is None else str(default)), name
        assert shown["title"] == helps[name].format(default=default), name
    assert page["shown"]["node_threshold"]["min"] == 0.01 and page["shown"]["node_threshold"]["max"] == 1
    assert page["shown"]["max_feature_nodes"]["min"] == 1
    [sent] = page["sent"]
    assert sent["body"] == {"prompt": "Lily saw", "node_threshold": DEFAULTS.node_threshold,
                            "edge_threshold": DEFAULTS.edge_threshold, "token_nodes": DEFAULTS.token_nodes}
    assert ComputeRequest(**sent["body"]).options().to_dict() == {k: getattr(DEFAULTS, k) for k in EXPLORER}
