"""Edge scores and circuits on disk: our JSON, and the MIB / EAP-IG edge-score layout.

    save_scores(scores, "scores.json"); scores = load_scores("scores.json")
    save_mib(scores, "mib.json", circuit)      # {"cfg": ..., "nodes": {...}, "edges": {"input->a0.h0<q>": ...}}

Our JSON is EdgeScores.to_dict(): the graph's shape, every edge as [source, reader, score] in graph order.
The MIB layout is the one EAP-IG's Graph.to_json writes and the MIB circuit-localization track reads:
"cfg" {n_layers, n_heads, parallel_attn_mlp, d_model}; "nodes" {name: in_graph}; "edges" {name:
{"score", "in_graph"}}, with nodes "input", "a{layer}.h{head}", "m{layer}", "logits" and edges
"{parent}->{child}" plus "<q>", "<k>" or "<v>" when the child is a head. Its graph has one q, k and v
input per head, so grouped-query models (one k and v per kv head) cannot be written in it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from circuitlab.analysis.edges.circuit import Circuit
from circuitlab.analysis.edges.edge_graph import EdgeGraph
from circuitlab.analysis.edges.scoring import EdgeScores
from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.names import parse_head


def _graph_of(d: dict[str, Any]) -> EdgeGraph:
    cfg = ModelConfig(n_layers=d["n_layers"], n_heads=d["n_heads"], n_kv_heads=d["n_kv_heads"], d_model=d["n_heads"],
                      attn_only=not d["has_mlp"], parallel_attn_mlp=d["parallel_attn_mlp"])
    return EdgeGraph.of(cfg)


def _read_json(path: str | Path, what: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CircuitlabError(f"{what} file not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CircuitlabError(f"{path} is not valid JSON ({e})") from None


def save_scores(scores: EdgeScores, path: str | Path) -> None:
    atomic_write_text(Path(path), json_text(scores.to_dict()))


def load_scores(path: str | Path) -> EdgeScores:
    d = _read_json(path, "edge scores")
    try:
        graph = _graph_of(d["graph"])
        if [e[:2] for e in d["edges"]] != [list(e) for e in graph.edges]:
            raise CircuitlabError(f"{path}: the edges do not match the graph they claim to come from")
        scores = torch.tensor([float(e[2]) for e in d["edges"]], dtype=torch.float64)
        nodes = torch.tensor([float(d["node_scores"][s]) for s in graph.sources], dtype=torch.float64)
        return EdgeScores(graph, scores, nodes, d["method"], d["intervention"], d["metric"], d["clean_value"],
                          d["ablated_value"], d.get("options", {}), d.get("seconds", 0.0))
    except (KeyError, TypeError, IndexError) as e:
        raise CircuitlabError(f"{path} is not an edge-score file written by save_scores (missing {e})") from None


def save_circuit(circuit: Circuit, path: str | Path) -> None:
    atomic_write_text(Path(path), json_text({"graph": circuit.graph.to_dict(), **circuit.to_dict()}))


def load_circuit(path: str | Path) -> Circuit:
    d = _read_json(path, "circuit")
    try:
        graph = _graph_of(d["graph"])
        edges = torch.zeros(graph.n_edges, dtype=torch.bool)
        for s, r, *_ in d["edges"]:
            edges[graph.edge_index(s, r)] = True
        return Circuit(graph, edges, d.get("how", ""))
    except (KeyError, TypeError, ValueError) as e:
        raise CircuitlabError(f"{path} is not a circuit file written by save_circuit ({e})") from None


# ---------------------------------------------------------------------------- MIB / EAP-IG layout


def _mib_node(name: str) -> str:
    if name in ("input", "logits"):
        return name
    if name.startswith("MLP"):
        return f"m{name[3:]}"
    layer, head = parse_head(name)
    return f"a{layer}.h{head}"


def mib_edge_name(source: str, reader: str) -> str:
    """("L0H1", "L2H3.k") -> "a0.h1->a2.h3<k>"; ("MLP0", "logits") -> "m0->logits"."""
    node, _, kind = reader.partition(".")
    child = _mib_node(node)
    return f"{_mib_node(source)}->{child}" + (f"<{kind}>" if kind in ("q", "k", "v") else "")


def to_mib(scores: EdgeScores, circuit: Circuit | None = None, d_model: int = 0) -> dict[str, Any]:
    graph = scores.graph
    if graph.n_kv_heads != graph.n_heads:
        raise CircuitlabError("the MIB layout has one key and value input per head; this grouped-query graph has "
                              "one per kv head, so it cannot be written in it (use save_scores)")
    in_graph = circuit.edges if circuit is not None else torch.ones(graph.n_edges, dtype=torch.bool)
    nodes = set(circuit.nodes()) if circuit is not None else set(graph.nodes)
    return {"cfg": {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "parallel_attn_mlp": graph.parallel,
                    "d_model": d_model},
            "nodes": {_mib_node(n): n in nodes for n in graph.nodes},
            "edges": {mib_edge_name(s, r): {"score": float(v), "in_graph": bool(k)}
                      for (s, r), v, k in zip(graph.edges, scores.scores.tolist(), in_graph.tolist())}}


def save_mib(scores: EdgeScores, path: str | Path, circuit: Circuit | None = None, d_model: int = 0) -> None:
    atomic_write_text(Path(path), json_text(to_mib(scores, circuit, d_model)))


def load_mib(path: str | Path, graph: EdgeGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [n_edges] and in-graph flags [n_edges] (bool) from a MIB-layout file, in `graph`'s edge order."""
    d = _read_json(path, "MIB edge-score")
    edges = d.get("edges")
    if not isinstance(edges, dict):
        raise CircuitlabError(f"{path} has no 'edges' mapping; is it in the MIB layout?")
    names = [mib_edge_name(s, r) for s, r in graph.edges]
    missing = [n for n in names if n not in edges]
    if missing:
        raise CircuitlabError(f"{path} lacks {len(missing)} of this graph's edges (first: {missing[0]}); "
                              "was it written for another model?")
    scores = torch.tensor([float(edges[n]["score"]) for n in names], dtype=torch.float64)
    flags = torch.tensor([bool(edges[n].get("in_graph", True)) for n in names])
    return scores, flags


__all__ = ["load_circuit", "load_mib", "load_scores", "mib_edge_name", "save_circuit", "save_mib", "save_scores",
           "to_mib"]
