"""The methods: one module each, holding a method's options, run, typed result, view and report section
(methods/base.py says what a module declares). REGISTRY lists them; `interpret`, its command line and the report
iterate over it:

    from circuitlab.methods import REGISTRY
    m = REGISTRY["causal_tracing"]
    options = m.options_from({"subject": "Lily", "noise_samples": 4})   # checked, the rest default
    found = m.run(model, tokenizer, out_dir, options, "One day, Lily saw a big")
    m.report_section(found.to_dict())                                   # the report reads results.json back

Each record carries its estimate (`interpret --estimate`): its own, or base.one_prompt_estimate for a method that
reads one prompt. This floor sits above the views (viz/) and below the report, the explorer and the experiments.
graph.py (attribution graphs: `circuitlab graph`, the explorer's /graphs) is a method module outside REGISTRY:
it needs the model's transcoders, which `interpret` does not load.
"""
from __future__ import annotations

from circuitlab.methods import (ablation, attribution, causal_tracing, circuits, heads, input_attribution, logit_lens,
                                patching, probing, tuned_lens)
from circuitlab.methods.base import Method, MethodResult, NoOptions, prompt_tokens

# In the order `interpret` runs them (cheap reading first, interventions last).
REGISTRY: dict[str, Method] = {m.METHOD.name: m.METHOD for m in (circuits, heads, logit_lens, attribution,
                                                                  input_attribution, tuned_lens, patching, ablation,
                                                                  probing, causal_tracing)}
# The order of their own report sections (circuits' and heads' are drawn from the run, earlier in the report):
# what the layers predict, then what the prediction depends on.
REPORT_ORDER = ("logit_lens", "tuned_lens", "attribution", "input_attribution", "patching", "causal_tracing",
                "ablation", "probing")

__all__ = ["REGISTRY", "REPORT_ORDER", "Method", "MethodResult", "NoOptions", "prompt_tokens"]
