"""The methods: one module each, holding a method's options, run, typed result, view and report section
(methods/base.py says what a module declares). METHODS is the registry `interpret`, its command line and the
report iterate over:

    from circuitlab.methods import METHODS
    m = METHODS["causal_tracing"]
    options = m.options_from({"subject": "Lily", "noise_samples": 4})   # checked, the rest default
    found = m.run(model, tokenizer, out_dir, options, "One day, Lily saw a big")
    m.report_section(found.to_dict())                                   # the report reads results.json back

This floor sits above the views (viz/) and below the report, the explorer and the experiments.
"""
from __future__ import annotations

from circuitlab.methods import causal_tracing
from circuitlab.methods.base import Method, MethodResult, prompt_tokens

METHODS: dict[str, Method] = {m.name: m for m in (causal_tracing.METHOD,)}

__all__ = ["METHODS", "Method", "MethodResult", "prompt_tokens"]
