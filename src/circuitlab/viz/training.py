"""Figures of training runs: loss and induction score against tokens seen; attention patterns."""
from __future__ import annotations

from pathlib import Path

import torch

from circuitlab.training.phase import best_head_score
from circuitlab.viz.png import save_png, subplots


def plot_training_curves(curves: dict[str, list[dict]], path: str | Path) -> Path:
    """curves: run name -> metrics.jsonl records. Left: train loss and loss on the repeated half of
    random sequences; right: best induction and previous-token head scores; x: tokens seen."""
    fig, (ax_loss, ax_score) = subplots(1, 2, figsize=(11, 4))
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
    ax_loss.set(xlabel="tokens seen", ylabel="loss (nats)", title="Loss")
    ax_score.set(xlabel="tokens seen", ylabel="score", ylim=(0, 1), title="Head scores")
    for ax in (ax_loss, ax_score):
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
