"""Activation, attribution and path patching as a method (`interpret --experiments patching`; the analyses:
analysis/patching/): denoising over the residual stream, layer outputs and heads on the clean and corrupted
prompts (methods/pairs.py), attribution patching against it, path patching into the strongest later head; its
typed result and report section (the views: viz/patching.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.analysis.patching import default_targets, patching_sweep
from circuitlab.analysis.patching.attribution_patching import attribution_vs_patching
from circuitlab.analysis.patching.path import INPUTS, path_patching
import circuitlab.memory as memory
from circuitlab.analysis.patching.targets import TARGETS
from circuitlab.checks import NONNEG_INT
from circuitlab.methods.base import Method, MethodResult, figures_estimate
from circuitlab.methods.pairs import check_pairs, pair_prompts
from circuitlab.spec import Options, option
from circuitlab.names import head_name
from circuitlab.viz.fragments import Section, bullet_list, heading, table_html

if TYPE_CHECKING:
    from circuitlab.model import Transformer


DEEP = 12   # layers; deeper models leave out the (layer, position, head) grid by default
DEEP_TARGETS = ("resid_pre", "attn_out", "mlp_out", "head_out")


@dataclass(frozen=True)
class PatchingOptions(Options):
    title = "patching (--experiments patching)"
    patch_targets: tuple[str, ...] | None = option(None, choices=tuple(TARGETS), nargs="+", metavar="TARGET",
                                                   help="what is patched (default: resid_pre, attn_out, mlp_out, "
                                                        "head_out and head_out_by_pos where the model has them; "
                                                        f"head_out_by_pos left out beyond {DEEP} layers); one or "
                                                        "more of: " + ", ".join(TARGETS))
    patch_layers: tuple[int, ...] | None = option(None, NONNEG_INT, nargs="+", metavar="L",
                                                  help="the layers patched (default: every layer)")
    path_patching: bool = option(True, flag="--no-path-patching",
                                 help="leave out path patching into the strongest later head (default: on)")


def patching_targets(model: "Transformer", options: PatchingOptions) -> list[str]:
    """--patch-targets, else the default targets the model has hooks for (head_out_by_pos, a grid of layers x
    positions x heads, only up to DEEP layers: 6,480 patched runs on SmolLM2's 30 x 24 x 9, ~17 min)."""
    from circuitlab.analysis.patching.targets import get_target

    if options.patch_targets:
        return [get_target(model, t).name for t in options.patch_targets]
    found = default_targets(model)
    return [t for t in found if t in DEEP_TARGETS] if model.cfg.n_layers > DEEP else found


def check_patching(model: "Transformer", tokenizer: Any, options: PatchingOptions, clean: str | None = None,
                   corrupt: str | None = None, **_: Any) -> None:
    """The pairs' check, the targets the model has, --patch-layers within it."""
    from circuitlab.methods.ablation import check_model_layers

    check_pairs(model, tokenizer, options, clean, corrupt)
    patching_targets(model, options)
    check_model_layers(model, options.patch_layers, "--patch-layers")


@dataclass
class PatchingFindings(MethodResult):
    """prompts: what the prompts and the metric are; tokens: row 0's token strings; patching: target -> its
    PatchResult.to_dict(); gap_within_noise: True when the clean - corrupted gap is within noise (nothing more is
    reported); attribution_correlation: target -> Pearson r of attribution patching against activation patching;
    path_patching: receiver input -> its PathPatchResult.to_dict(); composition: the strongest path."""

    name = "patching"
    prompts: str
    tokens: list[str]
    patching: dict[str, Any]
    gap_within_noise: bool | None = None
    attribution_correlation: dict[str, float | None] | None = None
    path_patching: dict[str, Any] | None = None
    composition: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PatchingFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d.get("prompts", ""), d.get("tokens") or [],
                   d.get("patching") or {}, d.get("gap_within_noise"), d.get("attribution_correlation"),
                   d.get("path_patching"), d.get("composition"))


def _percent(x: float) -> str:
    return f"{x if abs(x) >= 0.005 else 0.0:.0%}"  # no "-0%"


def _where(w: dict[str, int]) -> str:
    """{"layer": 1, "pos": 5, "head": 0} -> "L1H0 pos 5"."""
    pos = w.get("pos", w.get("dest_pos"))
    return f"L{w['layer']}" + (f"H{w['head']}" if "head" in w else "") + (f" pos {pos}" if pos is not None else "")


def run_patching(model: "Transformer", tokenizer: Any, out_dir: Path, options: PatchingOptions, clean: str | None = None,
                 corrupt: str | None = None) -> PatchingFindings:
    """Activation patching (denoising) over the residual stream, layer outputs and heads; attribution
    patching against it; path patching from every earlier head into the strongest later head's q, k, v."""
    from circuitlab.viz.patching import attribution_vs_patching_figure, path_patching_figure, patching_figure

    out_dir = Path(out_dir)
    c, x, metric, what, strs = pair_prompts(model, tokenizer, clean, corrupt)
    targets = patching_targets(model, options)
    layers = list(options.patch_layers) if options.patch_layers else None
    results = patching_sweep(model, c, x, metric, targets, layers=layers)
    any_result = next(iter(results.values()))
    summary = [f"prompts: {what}",
               f"metric clean {any_result.clean_value:.3f}, corrupted {any_result.corrupt_value:.3f}"]
    figures = [patching_figure(res, strs).save_png(out_dir / f"patching_{t}.png").name for t, res in results.items()]
    found = PatchingFindings(summary, figures, what, strs, {t: r.to_dict() for t, r in results.items()})
    gap = any_result.clean_value - any_result.corrupt_value
    if not gap:
        summary.append("the metric is the same on both prompts, so there is nothing to localise")
        return found
    note = any_result.noise_note()
    if note is not None:  # recoveries of a gap within noise would read as findings: say so, show none
        found.gap_within_noise = True
        summary.append(note)
        return found
    for t in ("resid_pre", "head_out", "head_out_by_pos"):
        if t in results:
            top = results[t].top(3)
            summary.append(f"{t}: largest recovery at " + ", ".join(f"{_where(w)} ({e / gap:+.2f})" for w, e in top))

    check = attribution_vs_patching(model, c, x, metric, targets, layers=layers, patching=results)
    figures.append(attribution_vs_patching_figure(check).save_png(out_dir / "attribution_vs_patching.png").name)
    found.attribution_correlation = check.to_dict()["correlation"]
    summary.append("attribution patching vs activation patching, Pearson r: "
                   + ", ".join(f"{t} {r:.3f}" for t, r in check.correlation.items() if r == r))

    swept = results["head_out"].layers if "head_out" in results else []
    later = [i for i, l in enumerate(swept) if l > 0]
    if model.cfg.n_layers > 1 and options.path_patching and later:
        # Receiver: the head after layer 0 whose output recovers the metric most (the induction head here).
        recovery = results["head_out"].recovery()[later]
        best_head = int(recovery.argmax())
        receiver = (swept[later[best_head // model.cfg.n_heads]], best_head % model.cfg.n_heads)
        paths = [path_patching(model, c, x, metric, receiver, inp) for inp in INPUTS]
        figures.append(path_patching_figure(paths).save_png(out_dir / "path_patching.png").name)
        found.path_patching = {p.receiver_input: p.to_dict() for p in paths}
        # Each input's strongest sender, and the fraction of the clean - corrupted gap its path removes.
        best = {p.receiver_input: (p.top(1)[0][0], -p.top(1)[0][1] / gap) for p in paths}
        summary.append(f"path patching into {head_name(*receiver)} (the later head whose output recovers most): "
                       + "; ".join(f"{inp.upper()} input: {head_name(*s)} -> {_percent(frac)} of the gap"
                                   for inp, (s, frac) in best.items()))
        inp, (sender, frac) = max(best.items(), key=lambda kv: abs(kv[1][1]))
        found.composition = {"receiver": head_name(*receiver), "sender": head_name(*sender), "input": inp,
                             "fraction_of_gap": round(frac, 6)}
    return found


def patching_section(found: PatchingFindings) -> Section:
    from circuitlab.viz.patching import path_patching_figure, patching_figure

    parts: list[Any] = [bullet_list(found.summary)]
    parts += [patching_figure(res, found.tokens or None) for res in found.patching.values()]
    if found.attribution_correlation:
        parts.append(heading("Attribution patching against activation patching"))
        parts.append(table_html([{"target": t, "Pearson r": float("nan") if r is None else float(r)}
                                 for t, r in found.attribution_correlation.items()]))
    if found.path_patching:
        parts.append(path_patching_figure(found.path_patching))
    return Section("patching", "Activation patching", parts,
                   "Denoising: each activation of the clean run patched into the corrupted run; recovery 1 = the clean "
                   "behaviour is back, 0 = still corrupted.")


def estimate_patching(model: Transformer, tokenizer: Any, options: PatchingOptions, clean: str | None = None,
                      corrupt: str | None = None, **_: Any) -> memory.Estimate:
    """Activation patching of the targets on the rows (--clean/--corrupt, or the induction rows) at the layers,
    then path patching into one receiver's q, k and v (when on, with head_out swept after layer 0)."""
    from circuitlab.analysis.patching import sweep_estimate
    from circuitlab.analysis.patching.path import path_patching_estimate
    from circuitlab.methods.pairs import pair_prompts

    rows = pair_prompts(model, tokenizer, clean, corrupt)[0]
    batch, pos = rows.shape
    targets = patching_targets(model, options)
    layers = list(options.patch_layers) if options.patch_layers else list(range(model.cfg.n_layers))
    parts = [sweep_estimate(model, batch, pos, targets, layers=layers)]
    path = model.cfg.n_layers > 1 and options.path_patching and "head_out" in targets and any(l > 0 for l in layers)
    if path:
        parts += [path_patching_estimate(model, batch, pos)] * 3
    parts.append(figures_estimate(model, len(targets) + 1 + path))   # each target's, attribution's, the paths'
    return memory.Estimate.one_after_another(f"patching (activation patching of {batch} x {pos} tokens: "
                                             f"{', '.join(targets)} at {len(layers)} layers"
                                             f"{', then path patching' if path else ''})", parts)


METHOD = Method("patching", PatchingOptions, PatchingFindings, run_patching, patching_section,
                inputs=("clean", "corrupt"), check=check_patching, estimate=estimate_patching)
