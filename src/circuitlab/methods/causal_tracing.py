"""Causal tracing as a method (Meng et al. 2022; the analysis: analysis/patching/causal_tracing.py, docs/causal.md):
its options, its run on a checkpoint's prompt, its typed result, its view and its report section.

    circuitlab interpret --checkpoint RUN --experiments causal_tracing --prompt "..." --subject "..."
    options = CausalTracingOptions(subject="Lily", noise_samples=4).check()
    found = run_causal_tracing(model, tokenizer, out_dir, options, prompt="One day, Lily saw a big")
    found.trace.peak("mlp"); causal_trace_figure(found.trace); causal_tracing_section(found)

Without a prompt the default story prompt is traced with subject "Lily" (its first token if the context cuts Lily
off). The noise's defaults are Noise's (analysis/patching/noise.py), the one place they are written.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitlab.analysis.patching.causal_tracing import (KINDS, AverageTrace, CausalTrace, causal_trace, check_kinds,
                                                         check_window, subject_span, trace_estimate)
from circuitlab.analysis.patching.checks import check_grid
from circuitlab.analysis.patching.noise import NOISE_KINDS, SCALE, Noise
from circuitlab.checks import COUNT, INT, NONNEG_INT
from circuitlab.display import renders
from circuitlab.errors import InputError
from circuitlab.memory import Estimate
from circuitlab.methods.base import Method, MethodResult, figures_estimate, prompt_tokens
from circuitlab.spec import Options, option
from circuitlab.viz import token_label
from circuitlab.viz.fragments import Section, bullet_list
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, as_array, field_of

if TYPE_CHECKING:
    from circuitlab.model import Transformer

NAME = "causal_tracing"
DEEP = 12   # layers; deeper models leave the severed trace (hidden_no_mlp, one kind of four) out by default
DEFAULT_SUBJECT = "Lily"  # in the default story prompt


@dataclass(frozen=True)
class CausalTracingOptions(Options):
    title = "causal tracing (--experiments causal_tracing; docs/causal.md)"
    subject: str | None = option(None, help="the words of --prompt whose token embeddings are corrupted")
    noise: str = option(Noise.kind, choices=NOISE_KINDS,
                        help="gaussian (default, the paper's), uniform, or replace (symmetric token replacement)")
    noise_scale: float = option(Noise.scale, SCALE, metavar="K",
                                help="noise std = K x the subject embeddings' std (default {default:g}, at most "
                                     f"{SCALE.high:g})")
    noise_samples: int = option(Noise.samples, COUNT, metavar="N", help="corrupted runs averaged (default {default})")
    window: int | None = option(None, COUNT, metavar="W",
                                help="layers restored together for MLP and attention (default: 10/48 of the depth)")
    replace_with: tuple[str, ...] | None = option(None, nargs="+", metavar="TEXT",
                                                  help="with --noise replace: other subjects of the same token length, "
                                                       "one run each")
    trace_kinds: tuple[str, ...] | None = option(None, choices=KINDS, nargs="+", metavar="KIND",
                                                 help="what is restored (default: hidden, mlp, attn, and "
                                                      f"hidden_no_mlp when the model has MLPs and at most {DEEP} "
                                                      "layers); of: " + ", ".join(KINDS))
    trace_positions: tuple[int, ...] | None = option(None, INT, nargs="+", metavar="P",
                                                     help="the positions traced, -1 the last (default: every "
                                                          "position from the subject on)")
    trace_layers: tuple[int, ...] | None = option(None, NONNEG_INT, nargs="+", metavar="L",
                                                  help="the layers traced (default: every layer)")


@dataclass
class CausalTracingFindings(MethodResult):
    """The trace of the prompt's subject (results.json: trace, summary, figures)."""

    name = NAME
    trace: CausalTrace

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CausalTracingFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), CausalTrace.from_dict(d["trace"]))


# ---------------------------------------------------------------------------- run


def tracing_noise(options: CausalTracingOptions, tokenizer: Any) -> Noise:
    """The Noise the options ask for (checked), replacements encoded with the tokenizer."""
    replacements = tuple(tuple(tokenizer.encode(r)) for r in options.replace_with or ())
    if replacements and options.noise != "replace":
        raise InputError("--replace-with goes with --noise replace (symmetric token replacement)")
    return Noise(options.noise, options.noise_scale, options.noise_samples, replacements=replacements).check()


def _kinds(model: "Transformer", options: CausalTracingOptions) -> list[str]:
    """--trace-kinds, else hidden, mlp, attn (those the model has) and the severed hidden_no_mlp up to DEEP layers."""
    if options.trace_kinds:
        return check_kinds(model, list(dict.fromkeys(options.trace_kinds)))
    return check_kinds(model, None) + (["hidden_no_mlp"] if model.cfg.has_mlp and model.cfg.n_layers <= DEEP else [])


def run_causal_tracing(model: "Transformer", tokenizer: Any, out_dir: Path, options: CausalTracingOptions,
                       prompt: str | None = None, progress: bool = True) -> CausalTracingFindings:
    """Causal tracing of the prompt's subject: hidden states, MLP and attention outputs (the three panels),
    and the hidden states again with later MLPs frozen (severed), when the model has MLPs."""
    subject: str | tuple[int, int] | None = options.subject
    if prompt is not None and subject is None:
        raise InputError("causal_tracing needs --subject: the words of --prompt to corrupt (e.g. --subject Lily)")
    noise = tracing_noise(options, tokenizer)
    window = check_window(model, options.window)
    kinds = _kinds(model, options)
    tokens = prompt_tokens(model, tokenizer, prompt)
    layers, positions = check_grid(model, len(tokens), options.trace_layers, options.trace_positions)
    note = None
    if subject is None:  # the default story prompt: its "Lily", unless the context cut it off
        text = tokenizer.decode(tokens.tolist())
        subject = DEFAULT_SUBJECT if DEFAULT_SUBJECT in text else (0, 1)
        note = None if subject == DEFAULT_SUBJECT else (f"the default prompt's {DEFAULT_SUBJECT!r} does not fit the "
                                                        "context: its first token is the subject (give --prompt and "
                                                        "--subject)")
    if progress:   # what it will hold and take, before the work
        first = subject_span(tokens.tolist(), subject, tokenizer)[0]
        print(trace_estimate(model, len(tokens), runs=noise.n_runs, kinds=kinds, layers=layers,
                             positions=positions, window=window, first=first).timed().line(), flush=True)
    trace = causal_trace(model, tokens, subject, tokenizer=tokenizer, kinds=kinds, window=window, noise=noise,
                         layers=layers, positions=positions)
    figure = causal_trace_figure(trace).save_png(Path(out_dir) / f"{NAME}.png").name
    summary = trace.summary() + ([note] if note else [])
    if "hidden_no_mlp" in trace.values:
        s, e = trace.subject
        with_mlp = trace.indirect_effect("hidden")[:, e - 1]
        without = trace.indirect_effect("hidden_no_mlp")[:, e - 1]
        summary.append("at the subject's last token, restoring the hidden state gives back on average "
                       f"{float(with_mlp.mean()):+.4g} over the layers, and {float(without.mean()):+.4g} with the "
                       "later MLPs frozen at their corrupted values (the gap is what travels through the MLPs)")
    return CausalTracingFindings(summary, [figure], trace)


def check_tracing(model: "Transformer", tokenizer: Any, options: CausalTracingOptions, prompt: str | None = None,
          **_: Any) -> None:
    """Refuse now what run_causal_tracing() would refuse later: the noise, the window, a subject not in the prompt."""
    import warnings

    tracing_noise(options, tokenizer)
    check_window(model, options.window)
    _kinds(model, options)
    with warnings.catch_warnings():   # run_causal_tracing() warns about a long prompt once, when it runs
        warnings.simplefilter("ignore")
        tokens = prompt_tokens(model, tokenizer, prompt)
    check_grid(model, len(tokens), options.trace_layers, options.trace_positions)
    if options.subject is not None:
        subject_span(tokens.tolist(), options.subject, tokenizer)


def missing_subject(options: CausalTracingOptions, prompt: str | None = None, **_: Any) -> tuple[str, str] | None:
    """A prompt of the user's needs its subject named (the default prompt's is "Lily")."""
    if prompt is None or options.subject is not None:
        return None
    return (f"{NAME} needs --subject: the words of --prompt to corrupt",
            f"{NAME} left out: give --subject (the words of --prompt to corrupt) to run it")


def estimate_tracing(model: "Transformer", tokenizer: Any, options: CausalTracingOptions, prompt: str | None = None,
             **_: Any) -> "Estimate":
    """What tracing the prompt (or the default prompt) would hold and take: its noise runs and restorations."""
    tokens = prompt_tokens(model, tokenizer, prompt)
    noise = tracing_noise(options, tokenizer)
    layers, positions = check_grid(model, len(tokens), options.trace_layers, options.trace_positions)
    subject = options.subject or (DEFAULT_SUBJECT if DEFAULT_SUBJECT in tokenizer.decode(tokens.tolist()) else (0, 1))
    first = subject_span(tokens.tolist(), subject, tokenizer)[0]   # restorations before it need no pass
    trace = trace_estimate(model, len(tokens), runs=noise.n_runs, kinds=_kinds(model, options), layers=layers,
                           positions=positions, window=check_window(model, options.window), first=first)
    return Estimate.one_after_another(trace.what, [trace, figures_estimate(model, 1)]).timed()


# ---------------------------------------------------------------------------- view

# The paper's colours: purple hidden states, green MLPs, red attention.
COLOURS = {"hidden": "Purples", "mlp": "Greens", "attn": "Reds", "hidden_no_mlp": "Purples",
           "hidden_no_attn": "Purples"}


def _what(kind: str, window: int) -> str:
    layers = f"window of {window} layer{'s' if window != 1 else ''}"
    return {"hidden": "hidden states (after each layer)", "mlp": f"MLP outputs ({layers})",
            "attn": f"attention outputs ({layers})", "hidden_no_mlp": "hidden, later MLPs frozen",
            "hidden_no_attn": "hidden, later attention frozen"}[kind]


def _token_rows(trace: Any) -> list[str]:
    tokens = field_of(trace, "tokens")
    strs = field_of(trace, "token_strs") or [str(t) for t in tokens]
    start, end = field_of(trace, "subject")
    return [f"{i} {token_label(s, 12)}" + ("*" if start <= i < end else "") for i, s in enumerate(strs)]


def causal_trace_figure(trace: Any) -> FigureSpec:
    """One heatmap per traced kind: the metric (e.g. the answer's probability) with each (layer, token)
    restored, tokens down (subject tokens marked *), layers across; the colour scale runs from the
    corrupted run's value up. trace: a CausalTrace or its to_dict()."""
    values, window = field_of(trace, "values"), int(field_of(trace, "window"))
    metric, clean, corrupt = field_of(trace, "metric"), float(field_of(trace, "clean_value")), \
        float(field_of(trace, "corrupt_value"))
    answer = field_of(trace, "answer_str") or str(field_of(trace, "answer"))
    rows = _token_rows(trace)
    panels = []
    for kind, v in values.items():
        grid = as_array(v).T  # [pos, layer]
        finite = grid[np.isfinite(grid)]
        lo = min(corrupt, float(finite.min())) if finite.size else corrupt
        hi = max(clean, float(finite.max())) if finite.size else clean
        heat = Heatmap(grid, [f"L{l}" for l in range(grid.shape[1])], rows, lo, hi, COLOURS[kind],
                       value_name=metric)
        panels.append(Panel(_what(kind, window), "layer", "token", heat, name=kind))
    title = (f"Causal tracing: {metric} of {answer!r} (clean {clean:.3g}, subject* corrupted {corrupt:.3g}) "
             "with one state restored")
    return FigureSpec(panels, title, cols=min(4, len(panels)))


def average_trace_figure(average: Any) -> FigureSpec:
    """The average indirect effect over prompts, one heatmap per kind: token categories down (the paper's),
    layers across. average: an AverageTrace or its to_dict()."""
    values, window = field_of(average, "values"), int(field_of(average, "window"))
    categories = list(field_of(average, "categories"))
    panels = []
    for kind, v in values.items():
        grid = as_array(v).T  # [category, layer]
        finite = grid[np.isfinite(grid)]
        hi = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        heat = Heatmap(grid, [f"L{l}" for l in range(grid.shape[1])], categories, min(0.0, float(finite.min()))
                       if finite.size else 0.0, hi, COLOURS[kind], value_name="AIE")
        panels.append(Panel(_what(kind, window), "layer", "", heat, name=kind))
    n = len(field_of(average, "prompts", None) or field_of(average, "traces", None) or [])
    title = (f"Average indirect effect over {n} prompts ({field_of(average, 'metric')}; average total effect "
             f"{float(field_of(average, 'total_effect')):.3g})")
    return FigureSpec(panels, title, cols=min(4, len(panels)))


def _notebook(spec: FigureSpec) -> str:
    from circuitlab.viz.notebook import notebook_html

    return notebook_html(spec)


# How the analysis' results display in Jupyter (circuitlab.display): their figure.
renders(CausalTrace)(lambda trace: _notebook(causal_trace_figure(trace)))
renders(AverageTrace)(lambda average: _notebook(average_trace_figure(average)))


# ---------------------------------------------------------------------------- report section


def causal_tracing_section(found: CausalTracingFindings) -> Section:
    noise = found.trace.noise
    how = (f"replaced by {len(noise.get('replacements', []))} other subjects" if noise.get("kind") == "replace" else
           f"{noise.get('kind')} noise of std {noise.get('nu')} ({noise.get('scale')} x the subject embeddings' std), "
           f"averaged over {noise.get('samples')} samples")
    # drawn from the trace's stored form, whose float64 numbers the page shows (a tensor is drawn in float32)
    figure = causal_trace_figure(found.trace.to_dict())
    return Section("causal-tracing", "Causal tracing", [bullet_list(found.summary), figure],
                   f"The subject's tokens (marked *) corrupted: {how}. Each cell is the answer's metric when that one "
                   "state of the clean run is restored in the corrupted run: the residual stream after a layer "
                   "(hidden), or the MLP / attention outputs of a window of layers centred on it.")


METHOD = Method(NAME, CausalTracingOptions, CausalTracingFindings, run_causal_tracing, causal_tracing_section,
                inputs=("prompt", "progress"), check=check_tracing, missing=missing_subject, estimate=estimate_tracing)
