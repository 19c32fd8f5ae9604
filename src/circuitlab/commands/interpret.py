"""circuitlab interpret: run analyses on a checkpoint and write figures, results.json and a report."""
from __future__ import annotations

import argparse

from circuitlab.analysis.patching.noise import NOISE_KINDS, SCALE
from circuitlab.checks import COUNT

HELP = ("analyse a checkpoint: circuits, heads, logit lens, attribution, patching, ablation, probing, input "
        "attribution, tuned lens, causal tracing")
EXAMPLE = ('circuitlab interpret --checkpoint runs/demo/2l --experiments heads logit_lens causal_tracing '
           '--prompt "One day, Lily saw a big" --subject Lily --out runs/demo/interpret')


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--experiments", nargs="+", default=None,
                   help="which analyses to run (default: all available); see the list in the error for names")
    p.add_argument("--prompt", default=None, help="text for the logit lens and attribution")
    p.add_argument("--clean", default=None, help="clean prompt for patching")
    p.add_argument("--corrupt", default=None, help="corrupted prompt for patching (same token length as --clean)")
    p.add_argument("--lens", default=None, help="a tuned-lens folder for the tuned_lens experiment (default: "
                                                "<checkpoint>/tuned_lens if saved, else a quick one is trained)")
    tracing = p.add_argument_group("causal tracing (--experiments causal_tracing; docs/causal.md)")
    tracing.add_argument("--subject", default=None, help="the words of --prompt whose token embeddings are corrupted")
    tracing.add_argument("--noise", choices=NOISE_KINDS, default=None,
                         help="gaussian (default, the paper's), uniform, or replace (symmetric token replacement)")
    tracing.add_argument("--noise-scale", type=SCALE.arg, default=None, metavar="K",
                         help=f"noise std = K x the subject embeddings' std (default 3, at most {SCALE.high:g})")
    tracing.add_argument("--noise-samples", type=COUNT.arg, default=None, metavar="N",
                         help="corrupted runs averaged (default 10)")
    tracing.add_argument("--window", type=COUNT.arg, default=None, metavar="W",
                         help="layers restored together for MLP and attention (default: 10/48 of the depth)")
    tracing.add_argument("--replace-with", nargs="+", default=None, metavar="TEXT",
                         help="with --noise replace: other subjects of the same token length, one run each")
    p.add_argument("--out", default=None, help="output directory (default: <checkpoint>/interpret)")
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.interpret import run_interpret
    from circuitlab.training.outputs import check_writable

    if args.estimate:
        for line in interpret_estimates(args):
            print(line)
        return 0
    out = Path(args.out) if args.out else Path(args.checkpoint) / "interpret"
    check_writable(out, "the interpret results")   # before the model is read
    results = run_interpret(args.checkpoint, out, args.experiments, prompt=args.prompt, clean=args.clean,
                            corrupt=args.corrupt, lens=args.lens, subject=args.subject, noise=args.noise,
                            noise_scale=args.noise_scale, noise_samples=args.noise_samples, window=args.window,
                            replace_with=args.replace_with)
    print(f"ran {', '.join(results.experiments)} -> {out}/results.json, {out}/report.md, {out}/report.html")
    return 0


def interpret_estimates(args: argparse.Namespace) -> list[str]:
    """What the large experiments of `interpret` would hold and take (causal tracing: its noise runs and
    restorations, on --prompt or the default prompt), without running them."""
    from circuitlab.analysis.patching.causal_tracing import check_kinds, trace_estimate
    from circuitlab.experiments.interpret_reading import prompt_tokens
    from circuitlab.experiments.interpret_tracing import tracing_noise
    from circuitlab.training import load_checkpoint

    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    tokens = prompt_tokens(model, tokenizer, args.prompt)
    noise = tracing_noise({"noise": args.noise, "noise_scale": args.noise_scale, "noise_samples": args.noise_samples,
                           "replace_with": args.replace_with}, tokenizer)
    kinds = len(check_kinds(model, None)) + (1 if model.cfg.has_mlp else 0)
    return [trace_estimate(model, len(tokens), runs=noise.n_runs, kinds=kinds).timed().line()]
