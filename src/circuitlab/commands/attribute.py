"""circuitlab attribute: which input tokens a prediction depends on (input attribution)."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from circuitlab.analysis.input_attribution import InputAttribution, Technique

HELP = ("attribute a next-token prediction to the prompt's tokens (integrated gradients, saliency, occlusion, "
        "KernelSHAP, LIME, ...)")
EXAMPLE = ('circuitlab attribute --checkpoint runs/demo/2l --prompt "Lily saw a cat. Lily" --target " s" '
           '--foil " w" --method ig --out attribution.html   (--estimate: what it will hold and take, then stop)')


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.analysis.input_attribution import attribution_options
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.spec import add_arguments as add_options

    add_options(p, attribution_options())   # the registry's: --method's choices, each technique's options
    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from circuitlab.analysis.input_attribution import (attribute_inputs, attribution_estimate, attribution_options,
                                                       get_technique)
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    opts: Any = attribution_options().from_args(args)
    assert opts.checkpoint is not None and opts.prompt is not None   # required: check() refuses None
    if opts.out:
        from circuitlab.training.outputs import check_writable

        check_writable(opts.out, "the attribution")   # before the model is read
    model, tok, _ = load_checkpoint(opts.checkpoint)
    if tok is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    ids = tok.encode(opts.prompt)
    if not ids:
        raise CircuitlabError("the prompt is empty: give some text to attribute")
    technique = get_technique(opts.method)
    kwargs = {"tokenizer": tok, **opts.method_keywords(), **_token_keywords(opts, technique, tok)}
    est = attribution_estimate(model, min(len(ids), model.cfg.n_ctx), opts.method,
                               **technique.option_values(opts.to_dict())).timed()
    print(est.line())   # what it will hold and take, before the work
    if args.estimate:
        return 0
    result = attribute_inputs(model, torch.tensor(ids), opts.method, **kwargs)
    _print(result)
    if opts.out:
        _write(result, Path(opts.out))
    return 0


def _token_keywords(opts: Any, technique: Technique, tok: Any) -> dict[str, Any]:
    """The keywords of attribute_inputs that the tokenizer reads, as far as the technique takes them: target and
    foil ids, the baseline, the token a deleted coalition starts with (shap, lime) and the token occlusion puts in
    (its EOS)."""
    from circuitlab.errors import CircuitlabError

    kw: dict[str, Any] = {}
    if technique.no_target is None:
        kw["target"] = tok.token_id(opts.target, "target") if opts.target is not None else None
        kw["foil"] = tok.token_id(opts.foil, "foil") if opts.foil is not None else None
        if kw["foil"] is not None and kw["foil"] == kw["target"]:
            raise CircuitlabError(f"the foil {opts.foil!r} is the target: give a different token to contrast with")
    if technique.baseline is not None:
        kw["baseline"] = _baseline(getattr(opts, "baseline", None), technique, tok)
    if technique.removes:
        kw["start_token"] = tok.eos_id
    if technique.replacement:
        kw["replacement"] = tok.eos_id
    return kw


def _print(result: InputAttribution) -> None:
    """The result's line, then one row per token: its score and a bar as long as its share of the largest."""
    print(result.describe())
    assert result.token_strs is not None  # attributed with the tokenizer
    width = max(len(repr(s)) for s in result.token_strs)
    scale = float(result.scores.abs().max()) or 1.0
    for i, (s, v) in enumerate(zip(result.token_strs, result.scores.tolist())):
        bar = "#" * round(20 * abs(v) / scale)
        print(f"{i:>4} {s!r:<{width}} {v:>+10.4f} {'-' if v < 0 else ' '}{bar}")


def _write(result: InputAttribution, out: Any) -> None:
    from circuitlab.atomic import atomic_write_text, json_text

    if out.suffix == ".json":
        atomic_write_text(out, json_text(result.to_dict(), indent=1))
    else:
        atomic_write_text(out, "<!doctype html><meta charset='utf-8'><body>" + result._repr_html_() + "</body>")
    print(f"wrote {out}")


def _baseline(text: str | None, technique: Technique, tok: Any) -> Any:
    """--baseline as input_attribution takes it: a name, a token id, or a prompt's token ids [pos] (None: the
    technique's own; delete where it removes no token is refused by the options' check)."""
    import torch

    from circuitlab.errors import CircuitlabError

    if text is None:
        return technique.baseline
    if text in ("zeros", "mean", "delete"):
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
