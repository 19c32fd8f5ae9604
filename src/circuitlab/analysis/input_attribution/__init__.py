"""Input attribution: which input tokens a prediction depends on.

    attr = integrated_gradients(model, tokens, target=tok_id, foil=other_id)   # tokens [pos]
    attr.scores                  # [pos] one number per input token
    attr.completeness_error      # |Σ scores − (f(x) − f(baseline))| / |f(x) − f(baseline)|
    saliency(...), gradient_x_input(...), occlusion(..., span=1), context_mixing(model, tokens)
    kernel_shap(..., samples=1024, baseline="mean", seed=0), lime(..., samples=1024, kernel_width=1.0)

What is explained is a metric of the logits: by default the logit of `target` at position `pos`
(the next-token prediction there), minus the logit of `foil` when one is given (contrastive), or
any function `metric(logits [batch, pos, d_vocab]) -> [batch]`. Gradient methods differentiate with
respect to the token embeddings (the output of hook_embed; positional embeddings stay as they are),
the convention of Captum's LayerIntegratedGradients on the embedding layer. Integrated gradients runs
all its steps as batched forward/backward passes in chunks (of `batch_size`; by default as many path points
as fit row_budget() floats of saved activations, as Captum's internal_batch_size bounds its memory), never one
call per step; occlusion runs its occluded copies the same way. Memory stays bounded whatever the count. Context mixing reads no gradient: it is the
norm-based measure (Kobayashi et al. 2020) of how much each source position's value vector, weighted
by attention and sent through W_O, moves into each position, with the residual stream kept, rolled out
through every layer. KernelSHAP and LIME treat the tokens up to pos as players that are present (their
embedding) or removed (the baseline's embedding, or the token deleted from the sequence), evaluate the model on
sampled coalitions in batched forward passes, and fit a linear surrogate (analysis/surrogate.py).

Modules: options.py (the methods, their rules and defaults: AttributionOptions, `circuitlab attribute`'s
options declared once), base.py (the result, what is explained, baselines, the row budget), gradients.py (saliency,
gradient x input, integrated gradients), perturbation.py (occlusion, KernelSHAP, LIME), mixing.py (context
mixing); this one dispatches by method name (attribute_inputs, attribute_methods) and is what callers import.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.input_attribution.base import (BASELINE_NAMES, DEFAULT_ALPHA, ROW_BUDGET,  # noqa: F401
                                                        Baseline, Explain, InputAttribution, Metric, _run_embeds,
                                                        _sequence, attribution_estimate, baseline_embeddings,
                                                        logit_metric, row_budget, rows_per_chunk)
from circuitlab.analysis.input_attribution.gradients import (gradient_x_input, integrated_gradients,  # noqa: F401
                                                             path_nodes, saliency)
from circuitlab.analysis.input_attribution.mixing import context_mixing
from circuitlab.analysis.input_attribution.options import (DEFAULT_KERNEL_WIDTH, DEFAULT_SAMPLES,  # noqa: F401
                                                           DEFAULT_STEPS, DEFAULTS, EXACT_MAX_POSITIONS,
                                                           KERNEL_WIDTH, METHODS, SAMPLES, SEED, STEPS,
                                                           AttributionOptions)
from circuitlab.analysis.input_attribution.perturbation import (check_samples, coalition_values,  # noqa: F401
                                                                kernel_shap, lime, occlusion)
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def attribute_inputs(model: Transformer, tokens: torch.Tensor, method: str = DEFAULTS.method, **kwargs: Any
                     ) -> InputAttribution:
    """Dispatch by method name (METHODS): ig, saliency, grad-x-input, occlusion, context-mixing, shap, lime."""
    fns: dict[str, Callable[..., InputAttribution]] = {"ig": integrated_gradients, "saliency": saliency, "grad-x-input": gradient_x_input,
           "occlusion": occlusion, "context-mixing": context_mixing, "shap": kernel_shap, "lime": lime}
    if method not in fns:
        raise CircuitlabError(f"unknown attribution method {method!r}; choose one of {', '.join(METHODS)}")
    return fns[method](model, tokens, **kwargs)


def attribute_methods(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                      methods: tuple[str, ...] = METHODS, steps: int = DEFAULT_STEPS, tokenizer=None,
                      samples: int = DEFAULT_SAMPLES, seed: int = DEFAULTS.seed,
                      kernel_width: float = DEFAULT_KERNEL_WIDTH,
                      baseline: Baseline = "mean", progress: bool = True) -> dict[str, InputAttribution]:
    """Several methods on the prediction at the last position of tokens [pos]: method -> result. target
    defaults to the model's top prediction there; occlusion replaces tokens by the tokenizer's EOS (a zero
    embedding without one); context mixing reads attention and takes no target; shap and lime draw `samples`
    coalitions from `seed`, a removed token becoming `baseline` (lime weighs them with `kernel_width`)."""
    tokens = _sequence(tokens, model)
    if target is None:
        with torch.no_grad():
            target = int(model(tokens[None])[0, -1].argmax())
    found = {}
    for method in methods:
        kwargs: dict[str, Any] = {"tokenizer": tokenizer}
        if method != "context-mixing":
            kwargs.update(target=target, foil=foil)
        if method == "ig":
            kwargs["steps"] = steps
        if method == "occlusion":
            kwargs["replacement"] = getattr(tokenizer, "eos_id", None)
        if method in ("shap", "lime"):
            kwargs.update(samples=samples, seed=seed, baseline=baseline, progress=progress)
        if method == "lime":
            kwargs["kernel_width"] = kernel_width
        found[method] = attribute_inputs(model, tokens, method, **kwargs)
    return found
