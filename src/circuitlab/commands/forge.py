"""circuitlab forge: hand-built transformers. `forge adder` checks or explains the hand-built adders."""
from __future__ import annotations

import argparse
import json

HELP = "hand-built transformers: check the adders on every input, or walk through one sum"
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
    adder.add_argument("--samples", type=int, default=10_000, help="random pairs checked beyond 3+3 digits")
    adder.add_argument("--seed", type=int, default=0, help="seed of the random pairs")
    adder.add_argument("--a", help="first number")
    adder.add_argument("--b", help="second number")
    adder.add_argument("--explain", action="store_true",
                       help="with --a/--b: each token's residual and where the heads attend")
    adder.add_argument("--json", action="store_true", help="print the --check result as JSON")


def run(args: argparse.Namespace) -> int:
    from circuitlab.errors import CircuitlabError

    if getattr(args, "forge_command", None) != "adder":
        raise CircuitlabError("choose a forge command: circuitlab forge adder --help")
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
        print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    if args.a is not None:
        a = parse_operand(args.a, "a", n, f" (use --digits {len(args.a.strip())})")
        b = parse_operand(args.b, "b", m, f" (use --digits-b {len(args.b.strip())})")
        print(adder.explain(a, b) if args.explain else f"{a} + {b} = {adder.add(a, b)}")
    return 0
