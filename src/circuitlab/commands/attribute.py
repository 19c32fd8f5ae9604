"""circuitlab attribute: which input tokens a prediction depends on (input attribution)."""
from __future__ import annotations

import argparse

HELP = "attribute a next-token prediction to the prompt's tokens (integrated gradients, saliency, occlusion, ...)"
EXAMPLE = ('circuitlab attribute --checkpoint runs/demo/2l --prompt "Lily saw a cat. Lily" --target " s" '
           '--foil " w" --method ig --out attribution.html')


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.analysis.input_attribution import DEFAULT_STEPS, METHODS, STEPS
    from circuitlab.checks import COUNT, INT

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--prompt", required=True, help="the text whose last token's prediction is explained")
    p.add_argument("--target", default=None, help="the predicted token to explain (one token; default: the "
                                                  "model's top prediction)")
    p.add_argument("--foil", default=None, help="explain target against this token (logit difference)")
    p.add_argument("--method", default="ig", choices=METHODS)
    p.add_argument("--pos", type=INT.arg, default=-1, help="the position whose prediction is explained (default: last)")
    p.add_argument("--steps", type=STEPS["gausslegendre"].arg, default=DEFAULT_STEPS,
                   help=f"integrated gradients: points on the path (default {DEFAULT_STEPS}, at most "
                        f"{STEPS['gausslegendre'].high}; run in chunks that fit memory)")
    p.add_argument("--baseline", default="zeros",
                   help="integrated gradients: 'zeros', 'eos' (the EOS embedding at every position) or a prompt "
                        "of the same number of tokens")
    p.add_argument("--span", type=COUNT.arg, default=1, help="occlusion: tokens replaced at a time")
    p.add_argument("--out", default=None, help="write the result: .html (tokens shaded) or .json")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from circuitlab.analysis.input_attribution import attribute
    from circuitlab.atomic import atomic_write_text, json_text
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    if args.out and Path(args.out).suffix not in (".html", ".json"):
        raise CircuitlabError(f"--out {args.out}: give a file name ending in .html (tokens shaded) or .json")
    if args.out:
        from circuitlab.training.outputs import check_writable

        check_writable(args.out, "the attribution")   # before the model is read
    model, tok, _ = load_checkpoint(args.checkpoint)
    if tok is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    ids = tok.encode(args.prompt)
    if not ids:
        raise CircuitlabError("the prompt is empty: give some text to attribute")
    kwargs: dict = {"tokenizer": tok, "pos": args.pos}
    if args.method != "context-mixing":
        kwargs["target"] = tok.token_id(args.target, "target") if args.target is not None else None
        kwargs["foil"] = tok.token_id(args.foil, "foil") if args.foil is not None else None
        if kwargs["foil"] is not None and kwargs["foil"] == kwargs["target"]:
            raise CircuitlabError(f"the foil {args.foil!r} is the target: give a different token to contrast with")
    elif args.target is not None or args.foil is not None:
        raise CircuitlabError("context mixing reads attention, not a target: drop --target/--foil")
    if args.method == "ig":
        kwargs["steps"] = args.steps
        if args.baseline == "zeros":
            kwargs["baseline"] = "zeros"
        elif args.baseline == "eos":
            kwargs["baseline"] = tok.eos_id
        else:
            kwargs["baseline"] = torch.tensor(tok.encode(args.baseline))
    if args.method == "occlusion":
        kwargs.update(span=args.span, replacement=tok.eos_id)
    result = attribute(model, torch.tensor(ids), args.method, **kwargs)
    print(result.describe())
    width = max(len(repr(s)) for s in result.token_strs)
    scale = float(result.scores.abs().max()) or 1.0
    for i, (s, v) in enumerate(zip(result.token_strs, result.scores.tolist())):
        bar = "#" * round(20 * abs(v) / scale)
        print(f"{i:>4} {s!r:<{width}} {v:>+10.4f} {'-' if v < 0 else ' '}{bar}")
    if args.out:
        out = Path(args.out)
        if out.suffix == ".json":
            atomic_write_text(out, json_text(result.to_dict(), indent=1))
        else:
            atomic_write_text(out, "<!doctype html><meta charset='utf-8'><body>" + result._repr_html_() + "</body>")
        print(f"wrote {out}")
    return 0
