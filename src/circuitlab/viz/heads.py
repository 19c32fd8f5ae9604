"""Figures for head detectors: one heatmap of [layer, head] scores per detector."""
from __future__ import annotations

from pathlib import Path

import torch

from circuitlab.analysis.heads import HeadClasses, HeadScores
from circuitlab.names import head_name
from circuitlab.viz.circuits import _annotate
from circuitlab.viz.png import save_png, subplots

TITLES = {"previous_token": "previous token", "current_token": "current token", "first_token": "first token (sink)",
          "duplicate_token": "duplicate token", "induction": "induction",
          "entropy": "attention entropy (0 sharp, 1 uniform)"}


def plot_head_scores(scores: HeadScores, path: str | Path, classes: HeadClasses | None = None) -> Path:
    """A [layer, head] heatmap per detector, values annotated; with classes, the title lists the
    heads labelled by that detector."""
    names = list(scores.scores)
    L, H = scores[names[0]].shape
    cols = 3 if len(names) > 3 else len(names)
    rows = -(-len(names) // cols)
    fig, axes = subplots(rows, cols, figsize=(cols * (1.2 + 0.5 * H), rows * (1.4 + 0.45 * L)), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        grid = scores[name].float()
        ax.imshow(grid.numpy(), cmap="Blues", vmin=0, vmax=1)
        _annotate(ax, grid)
        title = TITLES.get(name, name)
        if classes is not None and name != "entropy":
            heads = classes.heads_with(name.replace("_", "-"))
            title += "\n" + (", ".join(head_name(l, h) for l, h in heads) or "none")
        ax.set(title=title, xlabel="head", ylabel="layer", xticks=range(H), yticks=range(L))
        ax.title.set_fontsize(8)
    return save_png(fig, path)


def plot_attention_patterns(patterns: dict[str, torch.Tensor], path: str | Path, title: str = "") -> Path:
    """One panel per head: name -> pattern [query_pos, key_pos] (e.g. cache["pattern", l][0, h])."""
    fig, axes = subplots(1, len(patterns), figsize=(3.4 * len(patterns), 3.6), squeeze=False)
    for ax, (name, pattern) in zip(axes[0], patterns.items()):
        ax.imshow(pattern.detach().float().cpu().numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set(title=name, xlabel="key position", ylabel="query position")
    if title:
        fig.suptitle(title, fontsize=9)
    return save_png(fig, path)
