"""Experiments for `circuitlab interpret` on inputs and layers: input attribution by every method, and the
tuned lens against the logit lens.

EXPERIMENTS maps a name to fn(model, tokenizer, out_dir, prompt, lens=None) -> ExperimentResult (lens: a
tuned-lens folder; the default is the one saved beside the checkpoint, else one is trained here).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from circuitlab.analysis.input_attribution import attribute_methods
from circuitlab.analysis.lens.tuned import (TunedLens, compare_lenses, mean_kl_to_final, story_batches,
                                            train_tuned_lens)
from circuitlab.data.stories import DEFAULT_PROMPT
from circuitlab.experiments.interpret_reading import prompt_tokens
from circuitlab.experiments.result import ExperimentResult
from circuitlab.model import model_device

if TYPE_CHECKING:
    from circuitlab.model import Transformer

QUICK_LENS_STEPS = 150  # a lens trained inside `interpret` when none is saved (`circuitlab lens train` does more)


def run_input_attribution(model: Transformer, tokenizer, out_dir: Path, prompt: str | None, lens: str | None = None
                          ) -> ExperimentResult:
    """Integrated gradients, gradient × input, saliency, occlusion and context mixing for the prediction
    at the prompt's last token: the model's top token against its second (a logit difference)."""
    tokens = prompt_tokens(model, tokenizer, prompt)
    with torch.no_grad():
        top2 = model(tokens[None].to(model_device(model)))[0, -1].topk(2).indices.tolist()
    found = attribute_methods(model, tokens, top2[0], top2[1], tokenizer=tokenizer)
    first = found["ig"]
    summary = [f"explained: logit({first.target_str!r}) - logit({first.foil_str!r}) after the last token"]
    for method, res in found.items():
        strs = res.token_strs or [str(t) for t in res.tokens]
        tops = ", ".join(f"{strs[p]!r} (pos {p}) {s:+.3g}" for p, s in res.top(3))
        summary.append(f"{method}: {tops}")
    assert first.completeness_error is not None  # integrated gradients always measures it
    summary.append(f"integrated gradients: completeness error {100 * first.completeness_error:.2g}% with "
                   f"{first.steps} steps from the {first.baseline} baseline")
    data = {"prompt": prompt or DEFAULT_PROMPT, "target": first.target_str, "foil": first.foil_str,
            "methods": {m: r.to_dict() for m, r in found.items()}}
    return ExperimentResult("input_attribution", summary, [], data)


def load_or_train_lens(model: Transformer, tokenizer, lens: str | Path | None, steps: int = QUICK_LENS_STEPS
                       ) -> tuple[TunedLens, str]:
    """The tuned lens saved in `lens` (checked against the model), or one trained on built-in stories
    when lens is None or holds none; and where it came from."""
    if lens is not None and TunedLens.exists(lens):
        return TunedLens.load(lens, model), f"loaded from {lens}"
    seq = min(64, model.cfg.n_ctx)
    trained = train_tuned_lens(model, story_batches(tokenizer, n_batches=8, batch_size=8, seq_len=seq), steps=steps,
                               progress=True)   # seconds to a minute: shown
    return trained, (f"trained here for {steps} steps on built-in stories (train a better one with "
                     "`circuitlab lens train`)")


def run_tuned_lens(model: Transformer, tokenizer, out_dir: Path, prompt: str | None, lens: str | Path | None = None
                   ) -> ExperimentResult:
    """The tuned lens beside the logit lens on the prompt, and both lenses' KL to the model's final
    distribution per layer on held-out built-in stories."""
    if model.cfg.n_layers == 0:
        return ExperimentResult("tuned_lens", ["a 0-layer model has no layers to translate"])
    tuned, source = load_or_train_lens(model, tokenizer, lens)
    tokens = prompt_tokens(model, tokenizer, prompt)
    both = compare_lenses(model, tokens, tuned, tokenizer=tokenizer)
    held_out = story_batches(tokenizer, n_batches=2, batch_size=8, seq_len=min(64, model.cfg.n_ctx), seed=2)
    logit_kl, tuned_kl = mean_kl_to_final(model, held_out), mean_kl_to_final(model, held_out, tuned)
    labels = both.logit.labels
    summary = [f"tuned lens {source}",
               "KL to the final distribution on held-out stories (nats), logit lens -> tuned lens: "
               + ", ".join(f"{lab} {a:.3g} -> {b:.3g}" for lab, a, b in
                           zip(labels[:-1], logit_kl.tolist(), tuned_kl.tolist()))]
    table = ["| after | logit lens KL | tuned lens KL |", "|---|---|---|"]
    table += [f"| {lab} | {a:.4f} | {b:.4f} |" for lab, a, b in zip(labels, logit_kl.tolist(), tuned_kl.tolist())]
    data = {"prompt": prompt or DEFAULT_PROMPT, "lens_source": source, "train": tuned.train_info,
            "comparison": both.to_dict(),
            "held_out_kl": {"labels": labels, "logit": [round(x, 6) for x in logit_kl.tolist()],
                            "tuned": [round(x, 6) for x in tuned_kl.tolist()]},
            "tables": {"KL to the final distribution on held-out stories": table}}
    return ExperimentResult("tuned_lens", summary, [], data)


EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "input_attribution": run_input_attribution,
    "tuned_lens": run_tuned_lens,
}
