"""Figures of training runs: loss and induction score against tokens seen; attention patterns."""
from __future__ import annotations

from pathlib import Path

import torch

from circuitlab.training.phase import best_head_score
from circuitlab.viz.png import save_png, subplots


def plot_training_curves(curves: dict[str, list[dict]], path: str | Path,
                         phase_change: dict[str, dict | None] | None = None) -> Path:
    """curves: run name -> metrics.jsonl records. Left: train loss and loss on the repeated half of
    random sequences; middle: best induction and previous-token head scores, and the best induction
    score on [r, r] at the longest tracked period; right: the in-context-learning score on natural text;
    x: tokens seen. phase_change: run name -> the demo's phase_change dict, drawn as a dashed line."""
    fig, (ax_loss, ax_score, ax_icl) = subplots(1, 3, figsize=(15, 4))
    for i, (name, records) in enumerate(curves.items()):
        color = f"C{i}"
        logged = [r for r in records if "loss" in r]
        ax_loss.plot([r["tokens"] for r in logged], [r["loss"] for r in logged], color=color, alpha=0.5,
                     label=f"{name} train loss")
        tracked = [r for r in records if "induction" in r]
        tokens = [r["tokens"] for r in tracked]
        ax_loss.plot(tokens, [r["repeat_loss"] for r in tracked], color=color, ls="--",
                     label=f"{name} loss on repeated tokens")
        ax_score.plot(tokens, [best_head_score(r["induction"]) for r in tracked], color=color,
                      label=f"{name} best induction score")
        ax_score.plot(tokens, [best_head_score(r["prev_token"]) for r in tracked], color=color, ls=":",
                      label=f"{name} best previous-token score")
        periods = {int(p) for r in tracked for p in r.get("induction_by_period") or {}}
        if periods:
            longest = str(max(periods))
            ax_score.plot(tokens, [(r.get("induction_by_period") or {}).get(longest, float("nan")) for r in tracked],
                          color=color, ls="-.", label=f"{name} best induction, [r, r] period {longest}")
        icl = [r for r in records if r.get("icl") is not None]
        ax_icl.plot([r["tokens"] for r in icl], [r["icl"] for r in icl], color=color, marker=".",
                    label=f"{name} in-context learning score")
        pc = (phase_change or {}).get(name)
        if pc:
            for ax in (ax_loss, ax_score, ax_icl):
                ax.axvline(pc["tokens"], color=color, ls="--", lw=1, alpha=0.7)
    ax_loss.set(xlabel="tokens seen", ylabel="loss (nats)", title="Loss")
    ax_score.set(xlabel="tokens seen", ylabel="score", ylim=(0, 1), title="Head scores")
    ax_icl.set(xlabel="tokens seen", ylabel="late minus early loss (nats)", title="In-context learning score")
    for ax in (ax_loss, ax_score, ax_icl):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return save_png(fig, path, crop=False)


def plot_induction_by_period(sweeps: dict[str, dict], path: str | Path, min_score: float = 0.6,
                             max_loss: float = 2.0) -> Path:
    """sweeps: model name -> PeriodSweep.to_dict(). Left: the best head's induction score on [r, r]
    by period; right: the loss on the first and the second copy; the demo's targets as grey lines."""
    fig, (ax_score, ax_loss) = subplots(1, 2, figsize=(11, 4))
    for i, (name, sweep) in enumerate(sweeps.items()):
        color = f"C{i}"
        ax_score.plot(sweep["periods"], sweep["best"], color=color, marker=".", label=f"{name} best head")
        ax_loss.plot(sweep["periods"], sweep["loss_second"], color=color, marker=".", label=f"{name} second copy")
        ax_loss.plot(sweep["periods"], sweep["loss_first"], color=color, ls=":", label=f"{name} first copy")
    ax_score.axhline(min_score, color="grey", ls="--", lw=1)
    ax_loss.axhline(max_loss, color="grey", ls="--", lw=1)
    ax_score.set(xlabel="period of r", ylabel="induction score", ylim=(0, 1.02),
                 title="Induction score on [r, r] by period")
    ax_loss.set(xlabel="period of r", ylabel="loss (nats)", ylim=(0, None), title="Loss on [r, r] by period")
    for ax in (ax_score, ax_loss):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return save_png(fig, path, crop=False)



def plot_attention_heads(model, tokens: torch.Tensor, heads: list[str], path: str | Path) -> Path:
    """Attention patterns [query, key] of the heads named "L{layer}H{head}" on tokens [pos]."""
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_pattern"))
    fig, axes = subplots(1, len(heads), figsize=(3.6 * len(heads), 3.6), squeeze=False)
    for ax, name in zip(axes[0], heads):
        layer, head = (int(x) for x in name[1:].split("H"))
        ax.imshow(cache["pattern", layer][0, head].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(title=f"head {name}", xlabel="key position", ylabel="query position")
    fig.suptitle("Attention on a random 12-token segment repeated 3 times", fontsize=9)
    return save_png(fig, path, crop=False)
