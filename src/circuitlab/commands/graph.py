"""circuitlab graph: the attribution graph of one prediction (features, errors, tokens, logits), pruned."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from circuitlab.commands._args import add_dtype_arguments
    from circuitlab.graphs.options import GraphOptions
    from circuitlab.spec import only
    from circuitlab.spec import add_arguments as add_options, options_of

    p.add_argument("--checkpoint", "--model", dest="checkpoint", default=None, help="a run or checkpoint directory")
    p.add_argument("--transcoders", default=None,
                   help="per-layer transcoders (a folder of dictionary folders, a `sae train` run, or circuit-tracer's "
                        "layout: config.yaml + layer_{i}.safetensors) or a cross-layer transcoder folder (ours, "
                        "circuit-tracer's cross_layer_transcoder layout or sparsify's)")
    p.add_argument("--transcoder-set", default=None, metavar="NAME",
                   help="when --transcoders is a run holding several sets (clt-demo: a CLT beside a transcoder per "
                        "layer), the one to use: the CLT's folder name (clt-batchtopk) or the per-layer set's "
                        "(transcoders); a run with several lists them")
    p.add_argument("--planted", action="store_true",
                   help="use the built-in forged model whose MLPs are planted features (tokens x A B Z y)")
    p.add_argument("--prompt", default=None, help="the text whose next-token prediction the graph explains (required)")
    p.add_argument("--target", default=None, help="explain this token (one token) instead of the top predictions")
    p.add_argument("--foil", default=None, help="with --target: explain the logit difference target - foil")
    # GraphOptions' flags (declared once, in graphs/options.py); --qk-heads after --qk, where it always stood
    names = tuple(f.name for f, _ in options_of(GraphOptions))
    add_options(p, only(GraphOptions, tuple(n for n in names if n != "qk_heads"), "GraphOptions"))
    add_dtype_arguments(p)
    p.add_argument("--mmap", action="store_true",
                   help="memory-map the transcoders' weights from their files (circuitlab's own layouts), read as "
                        "each layer uses them: their pages can be dropped under memory pressure")
    p.add_argument("--qk", action="store_true",
                   help="also explain why the heads carrying the strongest cross-position edges attended where they "
                        "did: each head's score split into (query part x key part) terms (QK attributions)")
    add_options(p, only(GraphOptions, ("qk_heads",), "GraphOptions"))
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)
    p.add_argument("--partial", action="store_true",
                   help="allow transcoders that do not cover every layer (the rest stay whole in error nodes)")
    p.add_argument("--out", default="runs/graph", help="output folder (default runs/graph); an earlier graph there "
                                                       "is set aside as OUT.<time>")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier graph in --out instead")
    from circuitlab.commands import add_subcommands

    add_subcommands(p, {"demo": (DEMO_HELP, DEMO_EXAMPLE, add_demo_arguments, run_graph_demo)}, "graph")


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import positive_int

    p.add_argument("--out", default="runs/graphs", help="output directory (an earlier graphs demo there is kept, "
                                                        "renamed; default runs/graphs)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted demo in --out: finished stages are reused, the rest resumes")
    p.add_argument("--transcoders", choices=("clt", "per-layer"), default="clt",
                   help="one TopK cross-layer transcoder (default) or a TopK transcoder per MLP")
    p.add_argument("--model-steps", type=positive_int, default=None, help="training steps of the model (default 600)")
    p.add_argument("--transcoder-steps", type=positive_int, default=None,
                   help="training steps of the transcoders (default 400)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_graph_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.graphs_demo import GraphsDemoOptions, run_graphs_demo
    from circuitlab.perf import REFERENCE_GFLOPS

    opts = GraphsDemoOptions(out=Path(args.out), transcoders=args.transcoders, resume=args.resume,
                             progress=not args.no_progress)
    if args.model_steps is not None:
        opts.model_steps = args.model_steps
    if args.transcoder_steps is not None:
        opts.transcoder_steps = args.transcoder_steps
    result = run_graphs_demo(opts)
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
    if args.prompt is None:
        raise InputError("give --prompt TEXT (the text whose next token the graph explains), or run the demo: "
                         "circuitlab graph demo")
    from circuitlab.methods.graph import graph_experiment
    from circuitlab.graphs import GraphOptions, Transcoders
    from circuitlab.training.outputs import check_output_folder

    if args.target is None and args.foil is not None:
        raise InputError("--foil needs --target (the graph explains target minus foil)")
    if args.target is not None and args.target == args.foil:
        raise InputError(f"the foil {args.foil!r} is the target: give a different token to contrast with (or no "
                         "--foil)")
    check_output_folder(args.out, "graph", overwrite=args.overwrite)   # before the model is even read
    if args.planted:
        if args.checkpoint or args.transcoders or args.transcoder_set:
            raise InputError("--planted uses the built-in model: drop --checkpoint/--transcoders/--transcoder-set")
        from circuitlab.graphs.planted import PlantedTokenizer, planted_path_model

        p = planted_path_model()
        model, tc, tok = p.model, p.transcoders, PlantedTokenizer()
        if args.dtype is not None or args.compute_dtype is not None:
            model.set_dtypes(args.dtype, args.compute_dtype)
            tc.set_dtypes(args.dtype, model.compute_dtype)
        saved = None
    else:
        if not args.checkpoint or not args.transcoders:
            raise InputError("give --checkpoint DIR and --transcoders DIR (or --planted for the built-in model)")
        from circuitlab.training import load_checkpoint

        model, tok, _ = load_checkpoint(args.checkpoint, dtype=args.dtype, compute_dtype=args.compute_dtype)
        if tok is None:
            raise InputError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
        tc = Transcoders.load(model, args.transcoders, allow_partial=args.partial, set_name=args.transcoder_set,
                              dtype=args.dtype, compute_dtype=model.compute_dtype if args.dtype is not None else None,
                              mmap=args.mmap)
        from circuitlab.viz.graph_view import saved_dashboards

        saved = saved_dashboards(args.transcoders)
    if len(tok.encode(args.prompt)) > model.cfg.n_ctx:
        raise InputError(f"the prompt is {len(tok.encode(args.prompt))} tokens but the model's context is "
                         f"{model.cfg.n_ctx}; shorten it")
    opts = GraphOptions.from_args(args)
    if args.estimate:
        print(graph_estimate(model, tc, args, tok, opts).line())
        return 0
    result = graph_experiment(model, tc, args.prompt, tok, out=args.out, target=args.target, foil=args.foil,
                              options=opts, overwrite=args.overwrite, saved_dashboards=saved, qk=args.qk)
    if result.kept:
        print(f"kept the earlier graph as {result.kept}")
    for line in result.summary:
        print(line)
    print(f"wrote {result.out}: graph/ (full graph), graph.json (Neuronpedia viewer), results.json, report.md, "
          f"report.html ({result.data['files']['viewer_json_kb']:.1f} KB viewer JSON)")
    return 0


def graph_estimate(model: Transformer, tc, args: argparse.Namespace, tok, opts):
    """What `circuitlab graph` with these arguments and options (GraphOptions) would hold and take (the reference
    run only)."""
    import torch

    from circuitlab.graphs.attribution import estimate_graph, logit_difference

    targets = None
    if args.target is not None:
        t = tok.token_id(args.target, "target")
        targets = [t] if args.foil is None else [logit_difference(tok, t, tok.token_id(args.foil, "foil"),
                                                                  model.cfg.d_vocab)]
    return estimate_graph(model, tc, torch.tensor(tok.encode(args.prompt)), targets=targets,
                          max_n_logits=opts.max_n_logits, desired_logit_prob=opts.desired_logit_prob,
                          batch_size=opts.batch_size, max_feature_nodes=opts.max_feature_nodes)
