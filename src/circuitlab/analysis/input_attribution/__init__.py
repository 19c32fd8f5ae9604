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

Modules: options.py (what the techniques take, declared once: the shared inputs and each technique's options),
techniques.py (the technique registry: Technique, register_technique; `circuitlab attribute`'s options class,
attribution_options, and every front end's choices are made from it), base.py (the result, what is explained,
baselines, the row budget), gradients.py (saliency, gradient x input, integrated gradients), perturbation.py
(occlusion, KernelSHAP, LIME), mixing.py (context mixing), each with its techniques' records; this one registers
the built-ins, dispatches by name (attribute_inputs, attribute_methods) and is what callers import.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.input_attribution.base import (BASELINE_NAMES, DEFAULT_ALPHA, ROW_BUDGET,  # noqa: F401
                                                        Baseline, Explain, InputAttribution, Metric, _run_embeds,
                                                        _sequence, baseline_embeddings, logit_metric, row_budget,
                                                        rows_per_chunk)
from circuitlab.analysis.input_attribution.gradients import (GRAD_X_INPUT, IG, SALIENCY,  # noqa: F401
                                                             gradient_x_input, integrated_gradients, path_nodes,
                                                             saliency)
from circuitlab.analysis.input_attribution.mixing import CONTEXT_MIXING, context_mixing
from circuitlab.analysis.input_attribution.options import (DEFAULT_KERNEL_WIDTH, DEFAULT_METHOD,  # noqa: F401
                                                           DEFAULT_POS, DEFAULT_SAMPLES, DEFAULT_SEED, DEFAULT_SPAN,
                                                           DEFAULT_STEPS, EXACT_MAX_POSITIONS, KERNEL_WIDTH, SAMPLES,
                                                           SEED, STEPS, AttributeInputs, CoalitionOptions, IGOptions,
                                                           LimeOptions, OcclusionOptions, ShapOptions)
from circuitlab.analysis.input_attribution.perturbation import (LIME, OCCLUSION, SHAP,  # noqa: F401
                                                                check_samples, coalition_values, kernel_shap, lime,
                                                                occlusion)
from circuitlab.analysis.input_attribution.techniques import (Technique, attribution_estimate,  # noqa: F401
                                                              attribution_options, get_technique, register_technique, technique_names,
                                                              technique_options, techniques, unregister_technique)
from circuitlab.errors import CircuitlabError
from circuitlab.spec import options_of

if TYPE_CHECKING:
    from circuitlab.model import Transformer

for _builtin in (IG, SALIENCY, GRAD_X_INPUT, OCCLUSION, CONTEXT_MIXING, SHAP, LIME):   # the order results list them
    register_technique(_builtin)
METHODS = technique_names()            # the built-in techniques (technique_names(): what is registered now)
AttributionOptions = attribution_options()   # `circuitlab attribute`'s options with the built-ins
DEFAULTS = AttributionOptions()        # (commands/attribute.py asks attribution_options() for the current class)


def attribute_inputs(model: Transformer, tokens: torch.Tensor, method: str = DEFAULT_METHOD, **kwargs: Any
                     ) -> InputAttribution:
    """Dispatch by technique name (technique_names(): ig, saliency, grad-x-input, occlusion, context-mixing, shap,
    lime and any registered since): its run(model, tokens [pos], **kwargs)."""
    return get_technique(method).run(model, tokens, **kwargs)


def attribute_methods(model: Transformer, tokens: torch.Tensor, target: int | None = None, foil: int | None = None,
                      methods: tuple[str, ...] | None = None, tokenizer=None, baseline: Baseline = "mean",
                      progress: bool = True, **options: Any) -> dict[str, InputAttribution]:
    """Several techniques (default: every registered one) on the prediction at the last position of tokens [pos]:
    name -> result. target defaults to the model's top prediction there; options: the techniques' option values
    by name (steps=, samples=, seed=, kernel_width=, ...; absent: each one's default), each technique given its
    own. Occlusion replaces tokens by the tokenizer's EOS (a zero embedding without one); context mixing reads
    attention and takes no target; a token shap and lime remove becomes `baseline` (ig keeps its own)."""
    tokens = _sequence(tokens, model)
    found = techniques() if methods is None else tuple(get_technique(m) for m in methods)
    known = {f.name for t in techniques() if t.options is not None for f, _ in options_of(t.options)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"attribute_methods() got option(s) no technique takes: {', '.join(unknown)}")
    if target is None:
        with torch.no_grad():
            target = int(model(tokens[None])[0, -1].argmax())
    eos = getattr(tokenizer, "eos_id", None)
    return {t.name: t.run(model, tokens, **t.keywords(options, target=target, foil=foil,
                                                      baseline=baseline if t.removes else None, eos=eos,
                                                      progress=progress, tokenizer=tokenizer))
            for t in found}
