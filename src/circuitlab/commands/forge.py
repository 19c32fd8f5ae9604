"""circuitlab forge: hand-built transformers. `forge adder` checks or explains the hand-built adders;
`forge compare` trains a small model on the same addition task and compares it with the hand-built one."""
from __future__ import annotations

import argparse

from circuitlab.checks import DEFAULT_SEED
from circuitlab.commands._args import positive_int

HELP = ("hand-built transformers: check the adders on every input, walk through one sum, or compare the "
        "hand-built adder with a trained one")
EXAMPLE = "circuitlab forge adder --a 17 --b 25 --explain"



def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="forge_command", metavar="<forge command>")
    adder = sub.add_parser(
        "adder", help="the hand-built adders: --check counts correct inputs, --a/--b [--explain] adds",
        description="The hand-built adders.\n"
                    "  post:  the reference post's 2-digit design (2 layers, d_model 3, answer read off the residual)\n"
                    "  carry: the exact adder (answer digits as tokens, carries computed by the model,\n"
                    "         any digit counts)",
        epilog="examples:\n  circuitlab forge adder --digits 2 --check\n"
               "  circuitlab forge adder --a 17 --b 25 --explain\n"
               "  circuitlab forge adder --design carry --digits 5 --digits-b 3 --check",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    adder.add_argument("--design", choices=["auto", "post", "carry"], default="auto",
                       help="post: the reference post's design (2+2 digits only); carry: the exact adder; "
                            "auto (default): post for 2+2 digits, carry otherwise")
    adder.add_argument("--digits", type=int, default=2, help="digits of a (default 2)")
    adder.add_argument("--digits-b", type=int, default=None, help="digits of b (default: same as --digits)")
    adder.add_argument("--check", action="store_true",
                       help="count correct answers: every input up to 3+3 digits, else --samples random pairs")
    adder.add_argument("--samples", type=positive_int, default=10_000, help="random pairs checked beyond 3+3 digits")
    adder.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the random pairs")
    adder.add_argument("--a", help="first number")
    adder.add_argument("--b", help="second number")
    adder.add_argument("--explain", action="store_true",
                       help="with --a/--b: each token's residual and where the heads attend")
    adder.add_argument("--json", action="store_true", help="print the --check result as JSON")

    compare = sub.add_parser(
        "compare", help="train a small model on the addition task and compare it with the hand-built adder",
        description="Train a small transformer (2 layers x 2 heads, the hand-built adder's shape) on the addition\n"
                    "task with the project trainer, then compare it with the hand-built carry adder for the same\n"
                    "digit counts: accuracy, where each head attends on the same inputs, attention agreement per\n"
                    "head and OV subspace alignment. Writes results.json, figures (PNG) and report.md, which says\n"
                    "in words what the trained model does differently. A model already trained in OUT/trained\n"
                    "with the same settings is reused.",
        epilog="examples:\n  circuitlab forge compare                      # 2+2 digits, about 30 s on one CPU core\n"
               "  circuitlab forge compare --out runs/cmp --steps 3000 --seed 1\n"
               "  circuitlab forge compare --digits 3 --digits-b 2 --steps 4000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    compare.add_argument("--out", default="runs/forge-compare",
                         help="output folder (default runs/forge-compare); the trained model goes to OUT/trained")
    compare.add_argument("--digits", type=int, default=2, help="digits of a (default 2, at most 9)")
    compare.add_argument("--digits-b", type=int, default=None, help="digits of b (default: same as --digits)")
    compare.add_argument("--steps", type=int, default=None,
                         help="training steps (default 2000: every 2+2-digit answer right for seeds 0..3)")
    compare.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the training and of the test problems")
    compare.add_argument("--samples", type=int, default=1000,
                         help="random problems the attention is compared on (default 1000, at most 50000)")
    compare.add_argument("--retrain", action="store_true",
                         help="train again even if OUT/trained holds a model (it is replaced)")
    compare.add_argument("--no-progress", action="store_true", help="no progress bar while training")


def run(args: argparse.Namespace) -> int:
    from circuitlab.errors import CircuitlabError

    command = getattr(args, "forge_command", None)
    if command == "compare":
        return _compare(args)
    if command != "adder":
        raise CircuitlabError("choose a forge command: circuitlab forge adder --help, circuitlab forge compare --help")
    from circuitlab.atomic import json_text
    from circuitlab.forge.adder import build_adder, parse_operand

    n = args.digits
    m = args.digits_b if args.digits_b is not None else n
    design = args.design if args.design != "auto" else ("post" if (n, m) == (2, 2) else "carry")
    if not args.check and args.a is None and args.b is None:
        raise CircuitlabError("give --check, or two numbers with --a and --b")
    if (args.a is None) != (args.b is None):
        raise CircuitlabError("give both --a and --b")
    if args.explain and args.a is None:
        raise CircuitlabError("--explain walks through one sum: give --a and --b")
    adder = build_adder(design, n, m)
    if args.check:
        result = adder.check(samples=args.samples, seed=args.seed)
        print(json_text(result.to_dict(), indent=2) if args.json else result)
    if args.a is not None:
        a = parse_operand(args.a, "a", n, f" (use --digits {len(args.a.strip())})")
        b = parse_operand(args.b, "b", m, f" (use --digits-b {len(args.b.strip())})")
        print(adder.explain(a, b) if args.explain else f"{a} + {b} = {adder.add(a, b)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.forge_compare import DEFAULT_STEPS, run_forge_compare

    out = Path(args.out)
    results = run_forge_compare(out, digits=args.digits, digits_b=args.digits_b,
                                steps=DEFAULT_STEPS if args.steps is None else args.steps, seed=args.seed,
                                samples=args.samples, retrain=args.retrain, progress=not args.no_progress)
    acc = results["accuracy"]
    train = results["training"]
    how = "reused" if train["reused"] else f"trained in {train['seconds']:.1f} s"
    print(f"trained model ({train['steps']} steps, {how}): {acc['trained']['correct']:,}/{acc['trained']['total']:,} "
          f"correct; hand-built: {acc['hand']['correct']:,}/{acc['hand']['total']:,}")
    for line in results["findings"][1:]:
        print(f"- {line}")
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and {', '.join(results['figures'])}")
    return 0
