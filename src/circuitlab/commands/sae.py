"""circuitlab sae: sparse dictionaries (SAEs and transcoders) on a model's activations.

Subcommands live in SUBCOMMANDS: name -> (help, example, add_arguments, run); adding one is a
function pair and one entry.
"""
from __future__ import annotations

import argparse

from circuitlab.commands._args import add_option_parts

HELP = "sparse dictionaries: train SAEs / transcoders on a model's activations, evaluate them, draw feature dashboards"
EXAMPLE = "circuitlab sae train --config sae-demo --out runs/sae-demo   (then: circuitlab sae eval --help)"


# ---------------------------------------------------------------------------- train

TRAIN_HELP = "train one or more dictionaries from a config (one forward pass feeds them all)"
TRAIN_EXAMPLE = ("circuitlab sae train --config sae-demo --set train.steps=500 --out runs/sae-demo\n"
                 "  torchrun --nproc_per_node=2 -m circuitlab.cli sae train --config sae-demo --out runs/sae-demo-ddp")


def _train_args(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.experiments.sae_train import SaeTrainOptions

    def device_and_memory(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default=SaeTrainOptions.device,
                       help=f"{SaeTrainOptions.device} (default), cuda or auto; under torchrun each rank takes its "
                            "local GPU (nccl) or runs on the CPU (gloo)")
        add_memory_arguments(p)

    add_option_parts(p, SaeTrainOptions, ("config", "overrides",
                                          "target_l0", "out", "resume", "overwrite", "progress"), device_and_memory, ("parallel",))


def _run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import circuitlab.training.distributed as D
    from circuitlab.experiments.sae_train import SaeTrainOptions, start_or_resume, train_dictionaries
    from circuitlab.training.outputs import check_writable

    opts = replace(SaeTrainOptions.from_args(args), device=args.device)
    data = opts.load_config()
    out = opts.out_folder(data)
    check_writable(out, "the dictionaries")   # before an interrupted folder is tidied or the model read
    # under torchrun: one process group (gloo on the CPU, nccl on GPUs); alone nothing changes
    if args.estimate:   # nothing read or written: the dictionaries' shapes and the step's cost
        print(train_dictionaries(data, out, progress=False, device=opts.device, estimate_only=True)["line"])
        return 0
    rank, _, device = D.setup(opts.device)
    with D.rank_zero_first():  # rank 0 alone tidies an interrupted folder; then every rank sees the same one
        resume = start_or_resume(out, opts.resume, opts.overwrite, quiet=rank != 0, tidy=rank == 0)
    train_dictionaries(data, out, resume=resume, overwrite=opts.overwrite, progress=opts.progress,
                       device=device, parallel=opts.parallel)
    D.teardown()
    if rank == 0:
        print(f"wrote {out}/results.json")
    return 0


# ---------------------------------------------------------------------------- eval

EVAL_HELP = "evaluate a dictionary on a model: L0, explained variance, density, CE loss recovered when spliced in"
EVAL_EXAMPLE = "circuitlab sae eval --dictionary runs/sae-demo/dictionaries/blocks.1.hook_resid_pre-topk --checkpoint runs/demo/2l"


def _eval_args(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.sae_eval import DictionaryEvalOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, DictionaryEvalOptions)


def _run_eval(args: argparse.Namespace) -> int:
    from circuitlab.experiments.sae_eval import DictionaryEvalOptions, evaluate_dictionary

    evaluate_dictionary(DictionaryEvalOptions.from_args(args))
    return 0


# ---------------------------------------------------------------------------- dashboards


def add_dashboards_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.dashboards import DashboardOptions

    def device(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default=DashboardOptions.device, help=f"torch device (default {DashboardOptions.device})")

    add_option_parts(p, DashboardOptions, ("dictionary", "checkpoint", "out", "data", "n_tokens", "overwrite",
                                           "features", "layer"), device, ("progress",))


def run_dashboards(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from circuitlab.experiments.dashboards import DashboardOptions, build_dashboards

    found = build_dashboards(replace(DashboardOptions.from_args(args), device=args.device))
    if found.kept:
        print(f"kept the earlier dashboards as {found.kept}")
    s = found.summary
    print(f"{s['d_sae']} features of {s['hook_name']} on {s['n_tokens']:,} tokens: {s['dead_fraction']:.1%} never "
          f"fired, {s['dense_fraction']:.1%} fire on more than 10% of tokens")
    print(f"wrote {found.folder}/ (dashboards.safetensors, dashboards.json, report.html); browse them with "
          f"circuitlab serve --checkpoint {args.checkpoint} --dictionary {args.dictionary}")
    return 0


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.features_demo import FeaturesDemoOptions

    add_option_parts(p, FeaturesDemoOptions, ("out", "model_steps", "dictionary_steps", "resume"), ("progress",))


def run_sae_demo(args: argparse.Namespace) -> int:
    from circuitlab.experiments.features_demo import FeaturesDemoOptions, run_features_demo

    result = run_features_demo(FeaturesDemoOptions.from_args(args))
    print()
    print((result.out / "report.md").read_text())
    print(f"wrote {result.out}/: report.html, report.md, results.json, model/, dictionary/ in "
          f"{result.wall_seconds['total']:.0f}s ({result.scaled_seconds:.0f}s on a 150 GFLOP/s machine)")
    return 0


# ---------------------------------------------------------------------------- export

EXPORT_HELP = ("write dictionaries in another library's layout: ours, SAELens, circuit-tracer (per-layer sets, CLTs), "
               "sparsify (CLTs), Gemma Scope, Gemma Scope 2, Llama Scope; each read back and checked")
EXPORT_EXAMPLE = "circuitlab sae export runs/clt-demo --layout circuit-tracer --out exports/clt-demo-ct"


def _export_args(p: argparse.ArgumentParser) -> None:
    from circuitlab.dictionaries.export import ExportOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, ExportOptions)


def _run_export(args: argparse.Namespace) -> int:
    from circuitlab.dictionaries.export import ExportOptions, export_dictionaries

    opts = ExportOptions.from_args(args)
    written, kept = export_dictionaries(opts.source, opts.layout, opts.out, only=opts.only, overwrite=opts.overwrite)
    if kept is not None:
        print(f"kept the earlier export as {kept}")
    for name, folders in written.items():
        print(f"{name}: {', '.join(f'{opts.out}/{f}' for f in folders)}")
    print(f"wrote {opts.layout} layout to {opts.out}/ (each read back by circuitlab's reader: same latents and "
          f"reconstructions); export.json lists what came from where")
    return 0


# ---------------------------------------------------------------------------- wiring

SUBCOMMANDS = {
    "train": (TRAIN_HELP, TRAIN_EXAMPLE, _train_args, _run_train),
    "eval": (EVAL_HELP, EVAL_EXAMPLE, _eval_args, _run_eval),
    "dashboards": ("feature dashboards: top contexts, activation histogram, density, promoted/suppressed tokens",
                   "circuitlab sae dashboards --dictionary runs/transcoder-demo/dictionaries/transcoders-0 --checkpoint runs/features/model",
                   add_dashboards_arguments, run_dashboards),
    "export": (EXPORT_HELP, EXPORT_EXAMPLE, _export_args, _run_export),
    "demo": ("features demo: a 1-layer MLP model on the stories, a TopK dictionary on its MLP, readable features",
             "circuitlab sae demo --out runs/features", add_demo_arguments, run_sae_demo),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands import add_subcommands

    add_subcommands(p, SUBCOMMANDS, "sae")


def run(args: argparse.Namespace) -> int:
    from circuitlab.commands import run_subcommand

    return run_subcommand(args, SUBCOMMANDS, "sae")
