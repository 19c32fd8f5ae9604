"""circuitlab steer: a direction from two prompt sets, added to the residual stream, measured
(the pipeline: experiments/steer.py)."""
from __future__ import annotations

import argparse

HELP = "steer a model with the difference of two prompt sets' mean activations; measure effect and cost"
EXAMPLE = ("circuitlab steer --checkpoint runs/demo/2l --positive dragon.txt --negative cat.txt --layer 1 "
           "--coef 0 2 4 8 --count dragon --out runs/steer   (--estimate: what it will hold and take, then stop)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.checks import FINITE, INT
    from circuitlab.experiments.steer import MAX_TOKENS, SAMPLES

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--positive", required=True, help="text file, one prompt per line: what to steer towards")
    p.add_argument("--negative", required=True, help="text file, one prompt per line: what to steer away from")
    p.add_argument("--layer", type=INT.arg, required=True, help="add the direction to the residual before this layer")
    p.add_argument("--coef", type=FINITE.arg, nargs="+", default=[0.0, 1.0, 2.0, 4.0], help="coefficients to sweep")
    p.add_argument("--neutral", default=None, help="text file of neutral text for the loss cost "
                                                   "(default: 32 built-in stories the demo did not train on)")
    p.add_argument("--prompt", default="Once upon a time,", help="generations start from this prompt")
    p.add_argument("--samples", type=SAMPLES.arg, default=8, help=f"generations per coefficient (at most {SAMPLES.high})")
    p.add_argument("--max-tokens", type=MAX_TOKENS.arg, default=40, help=f"tokens per generation (at most {MAX_TOKENS.high})")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--count", default=None, help="a word to count in the generations (e.g. the positive set's topic)")
    p.add_argument("--seed", type=INT.arg, default=0)
    p.add_argument("--out", default=None, help="folder for steering.json, steering.png and report.html (an earlier "
                                               "steer output there is kept, renamed; or replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier steer output in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (and no estimate before the work)")
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from circuitlab.errors import CircuitlabError
    from circuitlab.experiments.steer import MAX_COEFS, SteerOptions, estimate_steer, run_steer
    from circuitlab.model.sampling import check_sampling

    check_sampling(args.temperature, cli=True)  # the command's spellings, before the model is loaded
    if len(args.coef) > MAX_COEFS:
        raise CircuitlabError(f"--coef: give at most {MAX_COEFS} coefficients (each is one more sweep), got "
                              f"{len(args.coef)}")
    opts = SteerOptions(
        checkpoint=args.checkpoint, positive=args.positive, negative=args.negative, layer=args.layer,
        coefs=args.coef, neutral=args.neutral, prompt=args.prompt, samples=args.samples, max_tokens=args.max_tokens,
        temperature=args.temperature, count=args.count, seed=args.seed, out=args.out, overwrite=args.overwrite,
        progress=not args.no_progress)
    if args.estimate:   # the model and the prompts read; nothing generated or written
        print(estimate_steer(opts).line())
        return 0
    result = run_steer(opts)
    print("\n".join(result.summary()))
    if result.kept:
        print(f"kept the earlier steer output as {result.kept}")
    if result.out is not None:
        out = result.out
        print(f"wrote {out / 'steering.json'}, {out / 'steering.png'} and {out / 'report.html'}")
    return 0
