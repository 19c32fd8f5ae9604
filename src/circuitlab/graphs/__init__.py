"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"): what stands on both a model and its
dictionaries.

    from circuitlab.graphs import Transcoders, attribute, ReplacementModel, Intervention
    tc = Transcoders.load(model, "runs/tc")                       # one transcoder per layer
    graph = attribute(model, tc, tokens, tokenizer=tok)           # tokens [pos]; the unpruned graph
    pruned = graph.prune()                                        # GraphOptions' thresholds (graphs/options.py)
    graph.scores()                                                # replacement, completeness
    graph.save("out/graph"); write_neuronpedia(graph, "out/graph.json", pruned)

transcoders      one interface over per-layer transcoders (and cross-layer ones)
replacement      the local replacement model of a prompt: frozen attention and norms, error terms; runs,
                 hooks, interventions (replacement or real model), steered generation
attribution      the adjacency by batched backward passes; logit targets; the greedy feature cap
attribution_graph  the Graph container (node order, files), influence, scores, pruning, strongest paths
export           the Neuronpedia / circuit-tracer viewer JSON
verify           a graph's story tested by intervention (ablate), and the head that carried a copy (QK)
options          GraphOptions: every option of a graph (thresholds, logits, feature cap, ...), its default and
                 rule written once; the command line, the explorer and these functions' defaults read it

A layer above analysis/ and dictionaries/: imports them and below; viz, report, serve, experiments and
commands import it.
"""
from circuitlab.graphs.attribution import LogitTarget, attribute, logit_difference
from circuitlab.graphs.export import neuronpedia_json, write_neuronpedia
from circuitlab.graphs.attribution_graph import Graph, Pruned
from circuitlab.graphs.options import GraphOptions
from circuitlab.graphs.replacement import Intervention, ReplacementModel, ReplacementRun
from circuitlab.graphs.transcoders import Transcoders

__all__ = ["Graph", "GraphOptions", "Intervention", "LogitTarget", "Pruned", "ReplacementModel", "ReplacementRun",
           "Transcoders", "attribute", "logit_difference", "neuronpedia_json", "write_neuronpedia"]
