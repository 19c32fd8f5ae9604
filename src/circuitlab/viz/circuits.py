"""Figures for weight-based circuits: circuit heatmaps, copying scores, composition scores."""
from __future__ import annotations

from pathlib import Path

import torch

from circuitlab.analysis.circuits import MODES, CompositionScores, CopyingScores
from circuitlab.viz import token_label
from circuitlab.viz.png import save_png, subplots


def plot_circuit(matrix: torch.Tensor, path: str | Path, row_labels: list[str] | None = None,
                 col_labels: list[str] | None = None, title: str = "", xlabel: str = "key token",
                 ylabel: str = "query token") -> Path:
    """Heatmap of a dense circuit block [rows, cols] (e.g. FactoredMatrix.submatrix on a token subset),
    on a colour scale centred at 0 (red positive, blue negative)."""
    m = matrix.detach().float().cpu()
    lim = float(m.abs().max()) or 1.0
    size = min(12.0, 3.0 + 0.22 * max(m.shape))
    fig, ax = subplots(figsize=(size + 1.2, size))
    im = ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
    for labels, set_ticks, set_labels, rotation in ((col_labels, ax.set_xticks, ax.set_xticklabels, 90),
                                                    (row_labels, ax.set_yticks, ax.set_yticklabels, 0)):
        if labels is not None:
            set_ticks(range(len(labels)))
            set_labels([token_label(s) for s in labels], fontsize=7, rotation=rotation)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(im, ax=ax, fraction=0.046)
    return save_png(fig, path)


def plot_copying_scores(copying: CopyingScores, path: str | Path) -> Path:
    """Copying score of every head, [layer, head], annotated (1 = pure copying, -1 = anti-copying)."""
    scores = copying.scores.float()
    fig, ax = subplots(figsize=(1.2 + 0.7 * scores.shape[1], 1.2 + 0.6 * scores.shape[0]))
    im = ax.imshow(scores.numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    _annotate(ax, scores)
    ax.set(title="OV copying score (Σλ / Σ|λ|)", xlabel="head", ylabel="layer",
           xticks=range(scores.shape[1]), yticks=range(scores.shape[0]))
    fig.colorbar(im, ax=ax, fraction=0.046)
    return save_png(fig, path)


def plot_composition_scores(comp: CompositionScores, path: str | Path) -> Path:
    """Q-, K- and V-composition of every earlier head (rows) into every later head (columns);
    blank where no path exists. The colour scale starts at the random baseline."""
    L, H = comp.q.shape[:2]
    n = L * H
    # Name every head on small models; on big ones mark where each layer starts.
    ticks = list(range(n)) if n <= 48 else list(range(0, n, H))
    labels = [f"L{i // H}H{i % H}" if n <= 48 else f"L{i // H}" for i in ticks]
    vmax = max(float(torch.nan_to_num(comp.scores(m), nan=0).max()) for m in MODES)
    side = min(6.0, 1.5 + 0.3 * n)
    fig, axes = subplots(1, 3, figsize=(3 * side + 1.5, side + 0.5), squeeze=False)
    for ax, mode in zip(axes[0], MODES):
        grid = comp.scores(mode).reshape(n, n).float()
        im = ax.imshow(grid.numpy(), cmap="viridis", vmin=comp.baseline_mean,
                       vmax=max(vmax, comp.baseline_mean + 1e-6))
        ax.set_xticks(ticks, labels, rotation=90, fontsize=7)
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set(title=f"{mode.upper()}-composition", xlabel="reader head", ylabel="writer head")
    fig.colorbar(im, ax=list(axes[0]), fraction=0.02)
    fig.suptitle(f"composition scores (random baseline {comp.baseline_mean:.3f} ± {comp.baseline_std:.3f})",
                 fontsize=9)
    return save_png(fig, path, tight=False)


def _annotate(ax, grid: torch.Tensor) -> None:
    for (i, j), v in zip(((i, j) for i in range(grid.shape[0]) for j in range(grid.shape[1])), grid.flatten()):
        if v == v:  # skip NaN
            ax.text(j, i, f"{float(v):.2f}", ha="center", va="center", fontsize=7,
                    color="white" if abs(float(v)) > 0.6 else "black")


