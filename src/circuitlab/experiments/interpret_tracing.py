"""Causal tracing for `circuitlab interpret --experiments causal_tracing --prompt ... --subject ...`.

EXPERIMENTS maps a name to fn(model, tokenizer, out_dir, opts) -> ExperimentResult, opts holding prompt,
subject, noise, noise_scale, noise_samples, window and replace_with (None = the defaults). Without a
prompt the default story prompt is traced with subject "Lily" (its first token if the context cuts Lily off).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.analysis.patching.causal_tracing import causal_trace, check_kinds, check_window, trace_estimate
from circuitlab.analysis.patching.noise import Noise
from circuitlab.errors import InputError
from circuitlab.experiments.interpret_reading import prompt_tokens
from circuitlab.experiments.result import ExperimentResult

if TYPE_CHECKING:
    from circuitlab.model import Transformer

DEFAULT_SUBJECT = "Lily"  # in the default story prompt


def tracing_noise(opts: dict[str, Any], tokenizer) -> Noise:
    """The Noise the options ask for (checked), replacements encoded with the tokenizer."""
    kind = opts.get("noise") or "gaussian"
    replacements = tuple(tuple(tokenizer.encode(r)) for r in opts.get("replace_with") or ())
    if replacements and kind != "replace":
        raise InputError("--replace-with goes with --noise replace (symmetric token replacement)")
    noise = Noise(kind, 3.0 if opts.get("noise_scale") is None else opts["noise_scale"],
                  10 if opts.get("noise_samples") is None else opts["noise_samples"], replacements=replacements)
    return noise.check()


def run_causal_tracing(model: Transformer, tokenizer, out_dir: Path, opts: dict[str, Any]) -> ExperimentResult:
    """Causal tracing of the prompt's subject: hidden states, MLP and attention outputs (the three panels),
    and the hidden states again with later MLPs frozen (severed), when the model has MLPs."""
    from circuitlab.viz.tracing import causal_trace_figure

    prompt, subject = opts.get("prompt"), opts.get("subject")
    if prompt is not None and subject is None:
        raise InputError("causal_tracing needs --subject: the words of --prompt to corrupt (e.g. --subject Lily)")
    noise = tracing_noise(opts, tokenizer)
    window = check_window(model, opts.get("window"))
    kinds = check_kinds(model, None) + (["hidden_no_mlp"] if model.cfg.has_mlp else [])
    tokens = prompt_tokens(model, tokenizer, prompt)
    note = None
    if subject is None:  # the default story prompt: its "Lily", unless the context cut it off
        text = tokenizer.decode(tokens.tolist())
        subject = DEFAULT_SUBJECT if DEFAULT_SUBJECT in text else (0, 1)
        note = None if subject == DEFAULT_SUBJECT else (f"the default prompt's {DEFAULT_SUBJECT!r} does not fit the "
                                                        "context: its first token is the subject (give --prompt and "
                                                        "--subject)")
    if opts.get("progress", True):   # what it will hold and take, before the work
        print(trace_estimate(model, len(tokens), runs=noise.n_runs, kinds=len(kinds)).timed().line(), flush=True)
    trace = causal_trace(model, tokens, subject, tokenizer=tokenizer, kinds=kinds, window=window, noise=noise)
    figure = causal_trace_figure(trace).save_png(Path(out_dir) / "causal_tracing.png").name
    summary = trace.summary() + ([note] if note else [])
    if "hidden_no_mlp" in trace.values:
        s, e = trace.subject
        with_mlp, without = trace.indirect_effect("hidden")[:, e - 1], trace.indirect_effect("hidden_no_mlp")[:, e - 1]
        summary.append("at the subject's last token, restoring the hidden state gives back on average "
                       f"{float(with_mlp.mean()):+.4g} over the layers, and {float(without.mean()):+.4g} with the later "
                       "MLPs frozen at their corrupted values (the gap is what travels through the MLPs)")
    return ExperimentResult("causal_tracing", summary, [figure], {"trace": trace.to_dict()})


EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {"causal_tracing": run_causal_tracing}
