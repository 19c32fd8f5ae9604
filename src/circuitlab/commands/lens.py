"""circuitlab lens: train a tuned lens for a checkpoint, and read a prompt through it beside the logit lens.
The flags are declared once beside each pipeline: experiments/lens_train.py LensTrainOptions,
experiments/lens_show.py LensShowOptions (circuitlab.spec)."""
from __future__ import annotations

import argparse

HELP = "tuned lens: train one for a checkpoint (saved beside it), show it against the logit lens on a prompt"
EXAMPLE = "circuitlab lens train --checkpoint runs/demo/2l --steps 300   (then: circuitlab lens show --help)"

TRAIN_HELP = "train a tuned lens (one affine translator per layer) on built-in stories or a text file"
TRAIN_EXAMPLE = ("circuitlab lens train --checkpoint runs/demo/2l --steps 300   "
                 "(writes runs/demo/2l/tuned_lens; --resume continues an interrupted run; --estimate: what it will "
                 "hold and take, then stop)")
SHOW_HELP = "a prompt through the logit lens and the tuned lens, with KL to the final distribution per layer"
SHOW_EXAMPLE = 'circuitlab lens show --checkpoint runs/demo/2l --prompt "Once upon a time, Lily" --out lens.html'


def _train_args(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.experiments.lens_train import LensTrainOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, LensTrainOptions)   # every flag but --memory / --estimate, declared in experiments/lens_train.py
    add_memory_arguments(p)


def _run_train(args: argparse.Namespace) -> int:
    from circuitlab.experiments.lens_train import LensTrainOptions, lens_train_estimate, train_lens

    opts = LensTrainOptions.from_args(args)
    if args.estimate:   # nothing read beyond the checkpoint, nothing written
        print(lens_train_estimate(opts).line())
        return 0
    found = train_lens(opts)
    print("KL to the final distribution on held-out stories (nats per token):")
    print(f"  {'point':<8}{'logit lens':>12}{'tuned lens':>12}")
    for label, a, b in zip(found.labels, found.logit_kl, found.tuned_kl):
        print(f"  {label:<8}{a:>12.4f}{b:>12.4f}")
    print(f"wrote {found.folder} (tuned_lens.safetensors, tuned_lens.json)")
    return 0


def _show_args(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.lens_show import LensShowOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, LensShowOptions)   # every flag, declared in experiments/lens_show.py


def _run_show(args: argparse.Namespace) -> int:
    from circuitlab.experiments.lens_show import LensShowOptions, show_lens

    shown = show_lens(LensShowOptions.from_args(args))
    if shown.report is not None:   # the report section's summary first
        print("\n".join(shown.summary))
    both = shown.both
    print(f"KL to the final distribution on this prompt (mean over its {shown.n_tokens} tokens):")
    print(both.table())
    a, b = both.logit, both.tuned
    assert a.token_strs is not None and a.top_strs is not None and b.top_strs is not None  # read with tok
    print(f"top next token after {a.token_strs[-1]!r}, by layer: logit lens | tuned lens")
    for i, label in enumerate(a.labels):
        print(f"  {label:<8}{a.top_strs[i][-1][0]!r:>12} {float(a.top_probs[i, -1, 0]):.2f} | "
              f"{b.top_strs[i][-1][0]!r:>12} {float(b.top_probs[i, -1, 0]):.2f}")
    if shown.report is not None:
        print(f"wrote {shown.report}")
    return 0


SUBCOMMANDS = {
    "train": (TRAIN_HELP, TRAIN_EXAMPLE, _train_args, _run_train),
    "show": (SHOW_HELP, SHOW_EXAMPLE, _show_args, _run_show),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands import add_subcommands

    add_subcommands(p, SUBCOMMANDS, "lens")


def run(args: argparse.Namespace) -> int:
    from circuitlab.commands import run_subcommand

    return run_subcommand(args, SUBCOMMANDS, "lens")
