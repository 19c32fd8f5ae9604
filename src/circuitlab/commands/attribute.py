"""circuitlab attribute: which input tokens a prediction depends on (input attribution)."""
from __future__ import annotations

import argparse

HELP = ("attribute a next-token prediction to the prompt's tokens (integrated gradients, saliency, occlusion, "
        "KernelSHAP, LIME, ...)")
EXAMPLE = ('circuitlab attribute --checkpoint runs/demo/2l --prompt "Lily saw a cat. Lily" --target " s" '
           '--foil " w" --method ig --out attribution.html   (--estimate: what it will hold and take, then stop)')


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.analysis.input_attribution import (DEFAULT_KERNEL_WIDTH, DEFAULT_SAMPLES, DEFAULT_STEPS,
                                                       KERNEL_WIDTH, METHODS, SAMPLES, SEED, STEPS)
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
    p.add_argument("--baseline", default=None,
                   help="what a removed token becomes (ig, shap, lime): 'zeros', 'mean' (the mean token embedding), "
                        "'eos' (the EOS token), 'token:N' (token id N), a prompt of the same number of tokens, or "
                        "(shap, lime) 'delete' (taken out of the sequence). Default: zeros for ig, mean for shap/lime")
    p.add_argument("--span", type=COUNT.arg, default=1, help="occlusion: tokens replaced at a time")
    p.add_argument("--samples", type=SAMPLES.arg, default=DEFAULT_SAMPLES,
                   help=f"shap, lime: coalitions evaluated, one forward pass each, batched (default {DEFAULT_SAMPLES}; "
                        f"{SAMPLES.low} to {SAMPLES.high})")
    p.add_argument("--seed", type=SEED.arg, default=0, help="shap, lime: seed of the coalitions drawn (default 0)")
    p.add_argument("--kernel-width", type=KERNEL_WIDTH.arg, default=DEFAULT_KERNEL_WIDTH,
                   help=f"lime: width of the exponential kernel on the cosine distance from the prompt (default "
                        f"{DEFAULT_KERNEL_WIDTH}, as Captum's)")
    p.add_argument("--exact", action="store_true",
                   help="shap: enumerate every coalition (exact Shapley values; at most 16 positions)")
    p.add_argument("--paired", action="store_true",
                   help="shap: draw each coalition with its complement (fewer samples for the same ranking; not "
                        "Captum's sampling)")
    p.add_argument("--out", default=None, help="write the result: .html (tokens shaded) or .json")
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from circuitlab.analysis.input_attribution import attribute_inputs
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
    if args.method in ("ig", "shap", "lime"):
        kwargs["baseline"] = _baseline(args.baseline, args.method, tok)
    if args.method == "ig":
        kwargs["steps"] = args.steps
    if args.method in ("shap", "lime"):
        kwargs.update(samples=args.samples, seed=args.seed, start_token=tok.eos_id)
        if args.method == "lime":
            kwargs["kernel_width"] = args.kernel_width
        else:
            kwargs.update(exact=args.exact, paired=args.paired)
    if args.method == "occlusion":
        kwargs.update(span=args.span, replacement=tok.eos_id)
    from circuitlab.analysis.input_attribution import attribution_estimate

    est = attribution_estimate(model, min(len(ids), model.cfg.n_ctx), args.method, steps=args.steps,
                               samples=args.samples).timed()
    print(est.line())   # what it will hold and take, before the work
    if args.estimate:
        return 0
    result = attribute_inputs(model, torch.tensor(ids), args.method, **kwargs)
    print(result.describe())
    assert result.token_strs is not None  # attributed with the tokenizer
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


def _baseline(text: str | None, method: str, tok):
    """--baseline as input_attribution takes it: a name, a token id, or a prompt's token ids [pos]."""
    import torch

    from circuitlab.errors import CircuitlabError

    if text is None:
        return "zeros" if method == "ig" else "mean"
    if text in ("zeros", "mean"):
        return text
    if text == "delete":
        if method == "ig":
            raise CircuitlabError("--baseline delete is for shap and lime (a path of embeddings needs the same "
                                  "positions): give zeros, mean, eos, token:N or a prompt")
        return text
    if text == "eos":
        if tok.eos_id is None:
            raise CircuitlabError("--baseline eos: this tokenizer has no EOS token; give zeros, mean or token:N")
        return tok.eos_id
    if text.startswith("token:"):
        try:
            return int(text[len("token:"):])
        except ValueError:
            raise CircuitlabError(f"--baseline {text}: after 'token:' give a token id (a whole number)") from None
    return torch.tensor(tok.encode(text))
