"""circuitlab graph: the attribution graph of one prediction (features, errors, tokens, logits), pruned."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from circuitlab.graphs import Transcoders
    from circuitlab.graphs.options import GraphInputs, GraphOptions
    from circuitlab.model import Transformer

HELP = ("attribution graph of a next-token prediction: transcoder features, error and token nodes, logits; "
        "pruned, scored, written for Neuronpedia's viewer (also: --checkpoint DIR --transcoders DIR --prompt TEXT)")
EXAMPLE = ("circuitlab graph --planted --prompt xAxBxyx --out runs/graph-planted --qk   (--estimate: what it will "
           "hold and take, then stop; --memory 8G: the budget)   "
           "(the graphs demo: circuitlab graph demo --help)")
DEMO_HELP = ("graphs demo: train a 2-layer MLP model on the stories and its transcoders, then explain three "
             "predictions (a repeated name, two memorised phrases) with attribution graphs, each tested by an "
             "intervention (~3 min scaled to a 150 GFLOP/s machine)")
DEMO_EXAMPLE = "circuitlab graph demo --out runs/graphs   (continue an interrupted one: add --resume)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_dtype_arguments, add_memory_arguments, add_option_parts
    from circuitlab.graphs.options import GraphInputs, GraphOptions
    from circuitlab.spec import options_of

    # GraphInputs' and GraphOptions' flags (declared once, in graphs/options.py) in the order --help has always
    # shown: the inputs, the graph's options, the dtypes, --mmap --qk, --qk-heads, the memory, the output
    tuning = tuple(f.name for f, _ in options_of(GraphOptions) if f.name != "qk_heads")
    add_option_parts(p, GraphInputs, ("checkpoint", "transcoders", "transcoder_set", "planted", "prompt", "target",
                                      "foil"))
    add_option_parts(p, GraphOptions, tuning)
    add_dtype_arguments(p)
    add_option_parts(p, GraphInputs, ("mmap", "qk"))
    add_option_parts(p, GraphOptions, ("qk_heads",))
    add_memory_arguments(p)
    add_option_parts(p, GraphInputs, ("partial", "out", "overwrite"))
    from circuitlab.commands import add_subcommands

    add_subcommands(p, {"demo": (DEMO_HELP, DEMO_EXAMPLE, add_demo_arguments, run_graph_demo)}, "graph")


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_option_parts
    from circuitlab.experiments.graphs_demo import GraphsDemoOptions

    add_option_parts(p, GraphsDemoOptions, ("out",), ("resume",), ("transcoders",), ("model_steps",),
                     ("transcoder_steps",), ("progress",))


def run_graph_demo(args: argparse.Namespace) -> int:
    from circuitlab.experiments.graphs_demo import GraphsDemoOptions, run_graphs_demo
    from circuitlab.perf import REFERENCE_GFLOPS

    result = run_graphs_demo(GraphsDemoOptions.from_args(args))
    print()
    assert result.out is not None  # the demo writes into its out folder
    print((result.out / "report.md").read_text())
    print(f"wrote {result.out}/: report.html, report.md, results.json, graphs/ (one folder per graph), model/, "
          "transcoders/")
    print(f"wall time {result.wall_seconds['total']:.1f} s at {result.gflops:.0f} GFLOP/s (fp32 matmul, measured "
          f"before and after); {result.scaled_seconds:.1f} s scaled to a {REFERENCE_GFLOPS:.0f} GFLOP/s machine")
    return 0


def run(args: argparse.Namespace) -> int:
    from circuitlab.errors import InputError

    if getattr(args, "_graph_run", None) is not None:   # a subcommand (demo)
        return args._graph_run(args)
    from circuitlab.graphs import Transcoders
    from circuitlab.graphs.options import GraphInputs, GraphOptions
    from circuitlab.methods.graph import graph_experiment
    from circuitlab.training.outputs import check_output_folder

    inputs, opts = GraphInputs.from_args(args), GraphOptions.from_args(args)
    assert inputs.prompt is not None   # check() refuses a missing prompt
    check_output_folder(inputs.out, "graph", overwrite=inputs.overwrite)   # before the model is even read
    if inputs.planted:
        from circuitlab.graphs.planted import PlantedTokenizer, planted_path_model

        p = planted_path_model()
        model, tc, tok = p.model, p.transcoders, PlantedTokenizer()
        if args.dtype is not None or args.compute_dtype is not None:
            model.set_dtypes(args.dtype, args.compute_dtype)
            tc.set_dtypes(args.dtype, model.compute_dtype)
        saved = None
    else:
        assert inputs.checkpoint is not None and inputs.transcoders is not None   # check() refuses them missing
        from circuitlab.training import load_checkpoint

        model, tok, _ = load_checkpoint(inputs.checkpoint, dtype=args.dtype, compute_dtype=args.compute_dtype)
        if tok is None:
            raise InputError(f"{inputs.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
        tc = Transcoders.load(model, inputs.transcoders, allow_partial=inputs.partial, set_name=inputs.transcoder_set,
                              dtype=args.dtype, compute_dtype=model.compute_dtype if args.dtype is not None else None,
                              mmap=inputs.mmap)
        from circuitlab.viz.graph_view import saved_dashboards

        saved = saved_dashboards(inputs.transcoders)
    if len(tok.encode(inputs.prompt)) > model.cfg.n_ctx:
        raise InputError(f"the prompt is {len(tok.encode(inputs.prompt))} tokens but the model's context is "
                         f"{model.cfg.n_ctx}; shorten it")
    if args.estimate:
        print(graph_estimate(model, tc, inputs, tok, opts).line())
        return 0
    result = graph_experiment(model, tc, inputs.prompt, tok, out=inputs.out, target=inputs.target, foil=inputs.foil,
                              options=opts, overwrite=inputs.overwrite, saved_dashboards=saved, qk=inputs.qk)
    if result.kept:
        print(f"kept the earlier graph as {result.kept}")
    for line in result.summary:
        print(line)
    print(f"wrote {result.out}: graph/ (full graph), graph.json (Neuronpedia viewer), results.json, report.md, "
          f"report.html ({result.data['files']['viewer_json_kb']:.1f} KB viewer JSON)")
    return 0


def graph_estimate(model: Transformer, tc: Transcoders, inputs: GraphInputs, tok: Any, opts: GraphOptions) -> Any:
    """What `circuitlab graph` with these inputs and options would hold and take (the reference run only)."""
    import torch

    from circuitlab.graphs.attribution import estimate_graph, logit_difference

    targets = None
    if inputs.target is not None:
        t = tok.token_id(inputs.target, "target")
        targets = [t] if inputs.foil is None else [logit_difference(tok, t, tok.token_id(inputs.foil, "foil"),
                                                                    model.cfg.d_vocab)]
    assert inputs.prompt is not None   # check() refuses a missing prompt
    return estimate_graph(model, tc, torch.tensor(tok.encode(inputs.prompt)), targets=targets,
                          max_n_logits=opts.max_n_logits, desired_logit_prob=opts.desired_logit_prob,
                          batch_size=opts.batch_size, max_feature_nodes=opts.max_feature_nodes)
