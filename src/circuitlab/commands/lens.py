"""circuitlab lens: train a tuned lens for a checkpoint, and read a prompt through it beside the logit lens."""
from __future__ import annotations

import argparse
from pathlib import Path

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
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--lens", default=None, help="the lens folder (default: <checkpoint>/tuned_lens)")
    p.add_argument("--prompt", required=True, help="the text to read layer by layer")
    p.add_argument("--out", default=None, help="write report.html here (a folder, or a path ending in .html)")


def _run_show(args: argparse.Namespace) -> int:
    from circuitlab.analysis.lens.tuned import TunedLens, compare_lenses, default_lens_dir
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    folder = Path(args.lens) if args.lens else default_lens_dir(args.checkpoint)
    if not TunedLens.exists(folder):
        raise CircuitlabError(f"{folder} holds no tuned lens; train one with `circuitlab lens train --checkpoint "
                              f"{args.checkpoint}`" + (f" --out {args.lens}" if args.lens else ""))
    model, tok, _ = load_checkpoint(args.checkpoint)
    if tok is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    if not args.prompt.strip():
        raise CircuitlabError("the prompt is empty: give some text to read")
    if args.out:
        from circuitlab.methods import NoOptions, tuned_lens
        from circuitlab.report.html import write_html_report

        found = tuned_lens.run_tuned_lens(model, tok, Path("."), NoOptions(), args.prompt, folder)
        path = write_html_report(args.out, [tuned_lens.tuned_lens_section(found)], "circuitlab lens",
                                 f"{args.checkpoint}: tuned lens from {folder}")
        print("\n".join(found.summary))
    import torch

    ids = tok.encode(args.prompt)[-model.cfg.n_ctx:]
    both = compare_lenses(model, torch.tensor(ids), TunedLens.load(folder, model), k=1, tokenizer=tok)
    print(f"KL to the final distribution on this prompt (mean over its {len(ids)} tokens):")
    print(both.table())
    a, b = both.logit, both.tuned
    assert a.token_strs is not None and a.top_strs is not None and b.top_strs is not None  # read with tok
    print(f"top next token after {a.token_strs[-1]!r}, by layer: logit lens | tuned lens")
    for i, label in enumerate(a.labels):
        print(f"  {label:<8}{a.top_strs[i][-1][0]!r:>12} {float(a.top_probs[i, -1, 0]):.2f} | "
              f"{b.top_strs[i][-1][0]!r:>12} {float(b.top_probs[i, -1, 0]):.2f}")
    if args.out:
        print(f"wrote {path}")
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
