"""Probing as a method (`interpret --experiments probing`; the analysis: analysis/probing.py): linear probes for the
previous token, "has this token occurred before" and the position at every residual point, on tiled random
sequences (the prompts are not used); its typed result and report section (the view: viz/probing.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.analysis.probing import random_sequences, train_probes
import circuitlab.memory as memory
from circuitlab.methods.base import Method, MethodResult, NoOptions
from circuitlab.methods.pairs import SEED, check_pairs
from circuitlab.viz.fragments import Section, bullet_list, paragraph

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class ProbingFindings(MethodResult):
    """probes: probed property -> its ProbeResult.to_dict(); data: what the probes were trained on."""

    name = "probing"
    probes: dict[str, Any]
    data: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProbingFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d["probes"], d.get("data", ""))


def run_probing(model: "Transformer", tokenizer: Any, out_dir: Path, options: NoOptions, clean: str | None = None,
                corrupt: str | None = None) -> ProbingFindings:
    from circuitlab.viz.probing import probe_figure

    pos = min(64, model.cfg.n_ctx)
    data = random_sequences(model.cfg.d_vocab, n_batches=8, batch=16, pos=pos, seed=SEED)
    results = train_probes(model, data, ["prev_token", "repeat", "position"])
    figure = probe_figure(results).save_png(Path(out_dir) / "probe_accuracy.png").name
    summary = []
    for name, res in results.items():
        point, score = res.best()
        i = res.points.index(point)
        summary.append(f"{name}: best at {point} with val {res.score} {score:.3f} (control "
                       f"{float(res.control_score[i]):.3f}, chance {res.chance:.3f}); by point: "
                       + ", ".join(f"{p} {float(v):.2f}" for p, v in zip(res.points, res.val_score)))
    return ProbingFindings(summary, [figure], {k: v.to_dict() for k, v in results.items()},
                         f"8 x 16 tiled random sequences of {pos}")


def probing_section(found: ProbingFindings) -> Section:
    from circuitlab.viz.probing import probe_figure

    parts = [paragraph(f"Data: {found.data}") if found.data else "", bullet_list(found.summary),
             probe_figure(found.probes)]
    return Section("probes", "Probe accuracy by layer", parts,
                   "Linear probes on the residual stream before each layer and after the last (solid); dashed: the "
                   "same probe on random labels (control); dotted: chance.")


def estimate_probing(model: Transformer, tokenizer: Any, options: Any, **_: Any) -> memory.Estimate:
    """Every residual point of 8 batches of 16 random sequences, kept for the probes."""
    from circuitlab.model.transformer import cache_estimate

    pos = min(64, model.cfg.n_ctx)
    est = cache_estimate(model, 8 * 16, pos, lambda n: "resid" in n or n == "hook_embed")
    est.what = f"probing (every residual point of 8 x 16 x {pos} tokens)"
    return est


METHOD = Method("probing", NoOptions, ProbingFindings, run_probing, probing_section, inputs=("clean", "corrupt"),
                check=check_pairs, estimate=estimate_probing)
