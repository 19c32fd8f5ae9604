"""circuitlab forge: hand-built transformers. `forge adder` checks or explains the hand-built adders;
`forge compare` trains a small model on the same addition task and compares it with the hand-built one.
The flags are declared once beside each pipeline: forge/adder.py AdderOptions, experiments/forge_compare.py
ForgeCompareOptions (circuitlab.spec)."""
from __future__ import annotations

import argparse

HELP = ("hand-built transformers: check the adders on every input, walk through one sum, or compare the "
        "hand-built adder with a trained one")
EXAMPLE = "circuitlab forge adder --a 17 --b 25 --explain"



def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.experiments.forge_compare import ForgeCompareOptions
    from circuitlab.forge.adder import AdderOptions
    from circuitlab.spec import add_arguments as add_options

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
    add_options(adder, AdderOptions)

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
    add_options(compare, ForgeCompareOptions)


def run(args: argparse.Namespace) -> int:
    from circuitlab.errors import CircuitlabError

    command = getattr(args, "forge_command", None)
    if command == "compare":
        return _compare(args)
    if command != "adder":
        raise CircuitlabError("choose a forge command: circuitlab forge adder --help, circuitlab forge compare --help")
    from circuitlab.forge.adder import AdderOptions, run_adder

    for text in run_adder(AdderOptions.from_args(args)):
        print(text)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.experiments.forge_compare import ForgeCompareOptions, run_forge_compare

    opts = ForgeCompareOptions.from_args(args)
    out = Path(opts.out)
    results = run_forge_compare(**opts.to_dict())
    acc = results["accuracy"]
    train = results["training"]
    how = "reused" if train["reused"] else f"trained in {train['seconds']:.1f} s"
    print(f"trained model ({train['steps']} steps, {how}): {acc['trained']['correct']:,}/{acc['trained']['total']:,} "
          f"correct; hand-built: {acc['hand']['correct']:,}/{acc['hand']['total']:,}")
    for line in results["findings"][1:]:
        print(f"- {line}")
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and {', '.join(results['figures'])}")
    return 0
