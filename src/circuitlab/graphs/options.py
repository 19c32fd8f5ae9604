"""The attribution graph's options, declared once (circuitlab.spec): every default and rule below is the only
one. `circuitlab graph`'s arguments, the explorer's /api/graphs/compute request (its EXPLORER fields) and the
page's inputs, graph_experiment's keywords and the defaults of attribute() and Graph.prune() all read them.

    opts = GraphOptions(node_threshold=0.9).check()        # InputError naming the field on a bad value
    add_arguments(parser, GraphOptions)                    # --node-threshold, --edge-threshold, --max-logits, ...
    GraphOptions.from_args(args)                           # the parsed command line, checked
    DEFAULTS.node_threshold                                # what a Python keyword defaults to

The command line:      commands/graph.py       add_arguments(p, GraphOptions); GraphOptions.from_args(args)
The explorer:          serve/graphs.py         request_model(spec.only(GraphOptions, EXPLORER)); the page reads the
                                               defaults and bounds from /api/graphs ("options")
The Python API:        methods/graph.py        graph_experiment(..., options=None, **fields)
The computation:       graphs/attribution.py (attribute: logits, batch, feature cap, token nodes) and
                       graphs/attribution_graph.py (Graph.prune: the thresholds)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from circuitlab.checks import CARD_TOKENS, COUNT, SHARE
from circuitlab.errors import refuse_unknown
from circuitlab.spec import Options, option

# What a token node is: the whole embedding at its position (W_E[token] + W_pos[pos] on learned-position models:
# every input is a node, the default) or W_E[token] alone (circuit-tracer's, for graphs that compare with its).
TOKEN_NODES = ("embedding", "W_E")


@dataclass(frozen=True)
class GraphOptions(Options):
    """How an attribution graph is made, pruned and reported (see the module docstring for who reads it)."""

    node_threshold: float = option(0.8, SHARE, help="keep the nodes holding this share of the influence, in (0, 1] "
                                                    "(default {default})")
    edge_threshold: float = option(0.98, SHARE, help="keep the edges holding this share of the edge influence, in "
                                                     "(0, 1] (default {default})")
    max_n_logits: int = option(10, COUNT, flag="--max-logits", metavar="MAX_LOGITS",
                                help="at most this many logit nodes (default {default})")
    desired_logit_prob: float = option(0.95, SHARE, flag="--logit-prob", metavar="LOGIT_PROB",
                                       help="logit nodes until their probability adds to this (default {default})")
    max_feature_nodes: int | None = option(None, COUNT, help="keep at most this many feature nodes, the most "
                                                             "influential first (long prompts)")
    batch_size: int = option(128, COUNT, help="target rows per backward pass")
    token_nodes: str = option("embedding", choices=TOKEN_NODES,
                              help="what a token node is: the whole embedding at its position (default; W_E[token] + "
                                   "W_pos[pos] on learned-position models, so every input is a node) or W_E: the "
                                   "token's row alone, as circuit-tracer (and Neuronpedia's graphs) make them, to "
                                   "compare with those")
    dashboard_tokens: int = option(4096, CARD_TOKENS,
                                   help="held-out story tokens the report's feature cards (hover in the viewer) are "
                                        "built on when the transcoders have no saved dashboards (`circuitlab sae "
                                        "dashboards`); 0: none (default {default}, "
                                        f"at most {CARD_TOKENS.high})")
    qk_heads: int = option(10, COUNT, help="with --qk: this many (head, query, key) places, the most influential "
                                           "first (default {default})")


DEFAULTS = GraphOptions()
# What the explorer's page may set (the rest keep their defaults there: it answers while you wait).
EXPLORER = ("node_threshold", "edge_threshold", "max_feature_nodes", "token_nodes")



def graph_options(options: GraphOptions | None = None, **values: Any) -> GraphOptions:
    """`options` (or the defaults) with `values` (GraphOptions fields) put in, checked: the Python API's keywords."""
    refuse_unknown(values, [f.name for f in dataclasses.fields(GraphOptions)], "graph option(s)", list_known=True)
    return dataclasses.replace(options if options is not None else DEFAULTS, **values).check()
