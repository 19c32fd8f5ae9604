"""The attribution graph's options, declared once (circuitlab.spec): every default and rule below is the only
one. `circuitlab graph`'s arguments, the explorer's /api/graphs/compute request (its EXPLORER fields) and the
page's inputs, graph_experiment's keywords and the defaults of attribute() and Graph.prune() all read them.
GraphInputs are the command's other inputs (the model and transcoders, the prompt and its target, the output).

    opts = GraphOptions(node_threshold=0.9).check()        # InputError naming the field on a bad value
    add_arguments(parser, GraphOptions)                    # --node-threshold, --edge-threshold, --max-logits, ...
    GraphOptions.from_args(args)                           # the parsed command line, checked
    DEFAULTS.node_threshold                                # what a Python keyword defaults to

The command line:      commands/graph.py       add_arguments(p, GraphOptions); GraphOptions.from_args(args);
                                               the same for GraphInputs (its flags around GraphOptions')
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
from circuitlab.errors import InputError, refuse_unknown
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


@dataclass(frozen=True)
class GraphInputs(Options):
    """What `circuitlab graph` reads besides GraphOptions: the model and its transcoders (saved, or the planted
    model), the prompt and the logit it explains, what the run adds (QK attributions) and where it writes. The
    command's flags and its run read them; check() holds the rules between them."""

    checkpoint: str | None = option(None, aliases=("--model",), help="a run or checkpoint directory")
    transcoders: str | None = option(None, help="per-layer transcoders (a folder of dictionary folders, a `sae train` "
                                                "run, or circuit-tracer's layout: config.yaml + layer_{i}.safetensors) "
                                                "or a cross-layer transcoder folder (ours, circuit-tracer's "
                                                "cross_layer_transcoder layout or sparsify's)")
    transcoder_set: str | None = option(None, metavar="NAME",
                                        help="when --transcoders is a run holding several sets (clt-demo: a CLT beside "
                                             "a transcoder per layer), the one to use: the CLT's folder name "
                                             "(clt-batchtopk) or the per-layer set's (transcoders); a run with several "
                                             "lists them")
    planted: bool = option(False, help="use the built-in forged model whose MLPs are planted features (tokens x A B Z "
                                       "y)")
    prompt: str | None = option(None, help="the text whose next-token prediction the graph explains (required)")
    target: str | None = option(None, help="explain this token (one token) instead of the top predictions")
    foil: str | None = option(None, help="with --target: explain the logit difference target - foil")
    mmap: bool = option(False, help="memory-map the transcoders' weights from their files (circuitlab's own layouts), "
                                    "read as each layer uses them: their pages can be dropped under memory pressure")
    qk: bool = option(False, help="also explain why the heads carrying the strongest cross-position edges attended "
                                  "where they did: each head's score split into (query part x key part) terms (QK "
                                  "attributions)")
    partial: bool = option(False, help="allow transcoders that do not cover every layer (the rest stay whole in error "
                                       "nodes)")
    out: str = option("runs/graph", help="output folder (default {default}); an earlier graph there is set aside as "
                                         "OUT.<time>")
    overwrite: bool = option(False, help="replace an earlier graph in --out instead")

    def check(self, error: type[Exception] = InputError) -> "GraphInputs":
        """Each field's rule, then the rules between them: a prompt; --foil only with --target, and another token;
        the planted model alone, or a checkpoint with its transcoders."""
        checked = super().check(error)
        if checked.prompt is None:
            raise error("give --prompt TEXT (the text whose next token the graph explains), or run the demo: "
                        "circuitlab graph demo")
        if checked.target is None and checked.foil is not None:
            raise error("--foil needs --target (the graph explains target minus foil)")
        if checked.target is not None and checked.target == checked.foil:
            raise error(f"the foil {checked.foil!r} is the target: give a different token to contrast with (or no "
                        "--foil)")
        if checked.planted and (checked.checkpoint or checked.transcoders or checked.transcoder_set):
            raise error("--planted uses the built-in model: drop --checkpoint/--transcoders/--transcoder-set")
        if not checked.planted and checked.checkpoint and not checked.transcoders:
            raise error(how_to_make_transcoders(checked.checkpoint))
        if not checked.planted and not (checked.checkpoint and checked.transcoders):
            raise error("give --checkpoint DIR and --transcoders DIR (or --planted for the built-in model)")
        return checked


QUICK_TRANSCODERS = "transcoders-quick"   # the bundled `sae train` config the message below names


def how_to_make_transcoders(checkpoint: str) -> str:
    """The one line for a graph of a model given without transcoders: the command that trains a set for it (a
    transcoder per MLP, the bundled quick recipe) and the flag that then reads it."""
    import shlex
    from pathlib import PurePath

    name = PurePath(checkpoint.rstrip("/") or checkpoint).name or "model"
    out = f"runs/transcoders-{name}"
    return (f"a graph of {checkpoint} needs transcoders for it (--transcoders DIR); to make a set, one per MLP, in "
            f"minutes: circuitlab sae train --config {QUICK_TRANSCODERS} --set model={shlex.quote(checkpoint)} --out "
            f"{shlex.quote(out)}, then give --transcoders {shlex.quote(out)} (docs/dictionaries.md: sets for real "
            "models)")



def graph_options(options: GraphOptions | None = None, **values: Any) -> GraphOptions:
    """`options` (or the defaults) with `values` (GraphOptions fields) put in, checked: the Python API's keywords."""
    refuse_unknown(values, [f.name for f in dataclasses.fields(GraphOptions)], "graph option(s)", list_known=True)
    return dataclasses.replace(options if options is not None else DEFAULTS, **values).check()
