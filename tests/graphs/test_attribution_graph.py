"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Split out of the flat test_graphs module, issue 38.)"""
import json

import pytest
import torch

from circuitlab.errors import CircuitlabError
from circuitlab.graphs import Graph, Transcoders
from circuitlab.graphs.export import neuronpedia_json

from helpers import random_model
from graphs.test_attribution import random_transcoder, setup  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_graph_records_the_model_and_transcoders_it_was_made_with(setup, tmp_path):
    """The identity travels with the graph (graph/graph.json, the viewer file's metadata) and tells apart
    another model of the same configuration and transcoders with other weights."""
    from circuitlab.graphs.transcoders import differs, made_with

    model, tc, tokens, graph = setup
    assert graph.identity == made_with(model, tc) and differs(graph.identity, made_with(model, tc)) is None
    graph.save(tmp_path / "g")
    assert Graph.load(tmp_path / "g").identity == graph.identity
    assert neuronpedia_json(graph, graph.prune())["metadata"]["identity"] == graph.identity
    f32 = tc.to(torch.float32)                                    # weights that were float32 all along:
    assert f32.to(torch.float64).identity() == f32.identity()     # their float64 copy is the same transcoders
    assert tc.dictionary(0).W_enc.dtype == torch.float64          # and `to` made copies: tc is as it was
    other = random_model(model.cfg, seed=5, scale=1.0).double().eval()
    assert "same configuration" in differs(graph.identity, made_with(other, tc))
    other_tc = Transcoders.per_layer(model, [random_transcoder(layer, 32, seed=9) for layer in range(3)])
    assert differs(graph.identity, made_with(model, other_tc)).startswith("other transcoders")
    assert differs(None, made_with(model, tc)) == "unrecorded"


def test_graph_files_round_trip_and_the_viewer_json(setup, tmp_path):
    model, tc, tokens, graph = setup
    graph.save(tmp_path / "g")
    back = Graph.load(tmp_path / "g")
    assert torch.equal(back.adjacency, graph.adjacency) and torch.equal(back.active_features, graph.active_features)
    assert back.scores() == graph.scores()
    pruned = graph.prune()
    data = json.loads(json.dumps(neuronpedia_json(graph, pruned, slug="t")))
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    ids = {n["node_id"] for n in data["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in data["links"])
    assert len(data["links"]) == int(pruned.edge_mask[pruned.node_mask][:, pruned.node_mask].sum())
    f = next(n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder")
    layer, feat, pos = map(int, f["node_id"].split("_"))
    assert graph.index("feature", layer, pos, feat) is not None
    assert sum(n["feature_type"] == "embedding" for n in data["nodes"]) == len(tokens)


def test_a_saved_graph_that_is_corrupt_or_not_utf8_is_one_line(setup, tmp_path):
    _, _, _, graph = setup
    folder = graph.save(tmp_path / "g")
    meta = next(p for p in folder.glob("*.json"))
    text = meta.read_bytes()
    meta.write_bytes(text + b"\xe9")
    with pytest.raises(CircuitlabError, match=rf"{meta.name} is not UTF-8 text: byte {len(text)}"):
        Graph.load(folder)
    meta.write_bytes(text[:len(text) // 2])
    with pytest.raises(CircuitlabError, match="corrupt or truncated"):
        Graph.load(folder)
    meta.write_bytes(text)
    assert torch.equal(Graph.load(folder).adjacency, graph.adjacency)
