"""What each method of `interpret` will hold at its peak and roughly how long it will take, from the model and
its inputs, before anything runs (`circuitlab interpret --estimate`). Each is the registry's
estimate(model, tokenizer, options, **inputs) -> memory.Estimate, built from the estimate its analysis module
owns (patching's sweep_estimate and path_patching_estimate, attribution_estimate, lens_estimate, the model's
cache_estimate); causal tracing's is in its own module. methods/__init__.py gives them to the records that have
none; a method that reads one prompt (circuits, heads, the lenses' readings) is estimated by that prompt's cache.

    est = REGISTRY["patching"].estimate(model, tokenizer, NoOptions())    # the default induction rows
    print(est.timed().line())
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import circuitlab.memory as memory
from circuitlab.methods.base import prompt_tokens

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def estimate_patching(model: Transformer, tokenizer: Any, options: Any, clean: str | None = None,
                      corrupt: str | None = None, **_: Any) -> memory.Estimate:
    """Activation patching of every default target on the rows (--clean/--corrupt, or the induction rows), then
    path patching into one receiver's q, k and v."""
    from circuitlab.analysis.patching import sweep_estimate
    from circuitlab.analysis.patching.path import path_patching_estimate
    from circuitlab.methods.pairs import pair_prompts

    rows = pair_prompts(model, tokenizer, clean, corrupt)[0]
    batch, pos = rows.shape
    parts = [sweep_estimate(model, batch, pos)]
    if model.cfg.n_layers > 1:
        parts += [path_patching_estimate(model, batch, pos)] * 3
    return memory.Estimate.one_after_another(f"patching (activation patching of {batch} x {pos} tokens, "
                                             "then path patching)", parts)


def estimate_input_attribution(model: Transformer, tokenizer: Any, options: Any, prompt: str | None = None,
                               **_: Any) -> memory.Estimate:
    """Every input-attribution method on the prompt, one after another."""
    from circuitlab.analysis.input_attribution import METHODS, attribution_estimate

    n = len(prompt_tokens(model, tokenizer, prompt))
    return memory.Estimate.one_after_another(f"input attribution ({', '.join(METHODS)} on {n} tokens)",
                                             [attribution_estimate(model, n, m) for m in METHODS])


def estimate_tuned_lens(model: Transformer, tokenizer: Any, options: Any, lens: Any = None, **_: Any
                        ) -> memory.Estimate:
    """A quick lens trained when none is saved (8 batches of 8 x 64 tokens), else held-out stories read."""
    from circuitlab.analysis.lens.tuned import TunedLens, lens_estimate
    from circuitlab.methods.tuned_lens import QUICK_LENS_STEPS
    from circuitlab.model.transformer import cache_estimate

    seq = min(64, model.cfg.n_ctx)
    if lens is not None and TunedLens.exists(lens):
        return cache_estimate(model, 8, seq, lambda n: "resid" in n)
    return lens_estimate(model, 8, seq, QUICK_LENS_STEPS, 8)


def estimate_ablation(model: Transformer, tokenizer: Any, options: Any, **_: Any) -> memory.Estimate:
    """The reference sequences' mean activations, then one ablated run per head and MLP."""
    from circuitlab.methods.pairs import BATCH
    from circuitlab.model.transformer import cache_estimate

    half = min(24, model.cfg.n_ctx // 2)
    est = cache_estimate(model, 5 * BATCH, 2 * half, lambda n: n.endswith(("hook_z", "hook_mlp_out")))
    est.flops = (est.flops or 0.0) / 5 * (model.cfg.n_layers * (model.cfg.n_heads + 1) + 5)
    est.what = f"ablation (every head and MLP mean-ablated on {BATCH} x {2 * half} tokens)"
    return est


def estimate_probing(model: Transformer, tokenizer: Any, options: Any, **_: Any) -> memory.Estimate:
    """Every residual point of 8 batches of 16 random sequences, kept for the probes."""
    from circuitlab.model.transformer import cache_estimate

    pos = min(64, model.cfg.n_ctx)
    est = cache_estimate(model, 8 * 16, pos, lambda n: "resid" in n or n == "hook_embed")
    est.what = f"probing (every residual point of 8 x 16 x {pos} tokens)"
    return est


def estimate_one_prompt(name: str):
    """The estimate of a method that reads one prompt (or, without a tokenizer, the weights and 16 tokens)."""
    def estimate(model: Transformer, tokenizer: Any, options: Any, prompt: str | None = None, **_: Any
                 ) -> memory.Estimate:
        from circuitlab.model.transformer import cache_estimate

        n = len(prompt_tokens(model, tokenizer, prompt)) if tokenizer is not None else min(16, model.cfg.n_ctx)
        est = cache_estimate(model, 1, n)
        est.what = f"{name} (the prompt's {n} tokens cached)"
        return est
    return estimate


ESTIMATES = {"patching": estimate_patching, "input_attribution": estimate_input_attribution,
             "tuned_lens": estimate_tuned_lens, "ablation": estimate_ablation, "probing": estimate_probing}
