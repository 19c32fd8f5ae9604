"""Figures for causal analyses: patching heatmaps, attribution vs patching, path patching, ablations."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from circuitlab.analysis.ablation import AblationResult
from circuitlab.analysis.attribution_patching import AttributionCheck
from circuitlab.analysis.path_patching import PathPatchResult
from circuitlab.analysis.patching import PatchResult
from circuitlab.viz.png import save_png, subplots




def _heatmap(ax, grid: torch.Tensor, xlabels: Sequence[str], ylabels: Sequence[str], title: str,
             xlabel: str, ylabel: str, limit: float | None = None) -> None:
    """grid [rows, cols] on a diverging map centred on 0 (NaN left blank)."""
    grid = grid.detach().float().cpu()
    if limit is None:
        finite = grid[grid.isfinite()]
        limit = float(finite.abs().max()) if len(finite) else 1.0
    im = ax.imshow(grid.numpy(), cmap="RdBu", vmin=-(limit or 1.0), vmax=limit or 1.0, aspect="auto")
    ax.set_title(title, fontsize=9)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7, rotation=90 if len(xlabels) > 8 else 0)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
    ax.figure.colorbar(im, ax=ax, fraction=0.04)


def _pos_labels(n: int, tokens: Sequence[str] | None) -> list[str]:
    return [f"{i} {tokens[i]!r}" if tokens else str(i) for i in range(n)]


def plot_patching(result: PatchResult, path: str | Path, tokens: Sequence[str] | None = None,
                  value: str = "recovery", title: str | None = None) -> Path:
    """Heatmap(s) of a PatchResult: value "recovery" (default), "effect" or "values".

    [layer, pos] and [layer, head] results are one heatmap (layer down); [layer, pos, head] and
    [layer, head, dest_pos] results get one panel per layer, heads down and positions across.
    tokens: the prompt's token strings, to label positions.
    """
    grid = {"recovery": result.recovery, "effect": result.effect, "values": lambda: result.values}[value]()
    limit = 1.0 if value == "recovery" else None
    name = title or f"{result.method} patching: {result.target} ({value}, metric {result.metric}, {result.direction})"
    labels = {"pos": lambda n: _pos_labels(n, tokens), "dest_pos": lambda n: _pos_labels(n, tokens),
              "head": lambda n: [f"H{h}" for h in range(n)]}
    if len(result.axes) == 1:
        fig, ax = subplots(figsize=(max(6.0, 0.4 * grid.shape[1] + 2), 1.4 + 0.45 * grid.shape[0]))
        axis = result.axes[0]
        _heatmap(ax, grid, labels[axis](grid.shape[1]), [f"L{l}" for l in result.layers], name,
                 "position" if axis == "pos" else axis, "layer", limit)
        return save_png(fig, path, crop=False)
    # Heads down, positions across.
    per_layer = grid if result.axes[0] == "head" else grid.transpose(1, 2)
    n_heads, n_pos = per_layer.shape[1:]
    fig, axes = subplots(len(result.layers), 1, squeeze=False,
                             figsize=(max(4.0, 0.4 * n_pos + 2), len(result.layers) * (1.2 + 0.3 * n_heads)))
    for ax, l, panel in zip(axes[:, 0], result.layers, per_layer):
        _heatmap(ax, panel, labels["pos"](n_pos), labels["head"](n_heads), f"layer {l}", "position", "head", limit)
    fig.suptitle(name, fontsize=9)
    return save_png(fig, path, crop=False)


def plot_attribution_vs_patching(check: AttributionCheck, path: str | Path) -> Path:
    """One scatter per target: attribution patching's estimated effect against the real one, with r."""
    names = list(check.correlation)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = subplots(rows, cols, figsize=(3.4 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        real = check.patching[name].effect().flatten()
        est = check.attribution[name].effect().flatten()
        ax.scatter(real.numpy(), est.numpy(), s=10, alpha=0.7)
        lo, hi = float(torch.cat([real, est]).min()), float(torch.cat([real, est]).max())
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        ax.set_title(f"{name}: r = {check.correlation[name]:.3f}", fontsize=9)
        ax.set(xlabel="activation patching effect", ylabel="attribution estimate")
    return save_png(fig, path, crop=False)


def plot_path_patching(results: Sequence[PathPatchResult], path: str | Path) -> Path:
    """One [layer, head] heatmap per receiver input: the recovery (1 = path unused, 0 = the whole corruption)
    with each sender's path patched, minus 1, so unused paths are white."""
    fig, axes = subplots(1, len(results), figsize=(3.6 * len(results), 2.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        l, h = res.receiver
        grid = res.recovery() - 1
        _heatmap(ax, grid[:l], [f"H{i}" for i in range(grid.shape[1])], [f"L{i}" for i in range(l)],
                 f"sender -> L{l}H{h} {res.receiver_input}", "sender head", "sender layer", 1.0)
    fig.suptitle("path patching: change in normalised metric (-1 = the whole corruption)", fontsize=9)
    return save_png(fig, path, crop=False)


def plot_ablation(result: AblationResult, path: str | Path, title: str | None = None) -> Path:
    """The metric's change per ablated component: bars for [layer] results, a heatmap for [layer, head]
    or [layer, neuron]."""
    change = result.change()
    name = title or f"{result.method} ablation of each {result.kind}: change in {result.metric}"
    if change.dim() == 1:
        fig, ax = subplots(figsize=(max(6.0, 0.6 * len(change) + 2), 3))
        ax.bar([f"L{l}" for l in result.layers], change.numpy(), color=["C3" if v > 0 else "C0" for v in change])
        ax.axhline(0, color="grey", lw=0.8)
        ax.set(ylabel=f"change in {result.metric}", title=name)
        ax.title.set_fontsize(9)
        return save_png(fig, path, crop=False)
    n = change.shape[1]
    prefix = "H" if result.kind == "head" else "N"
    xlabels = [f"{prefix}{i}" for i in range(n)] if n <= 48 else [str(i) if i % 16 == 0 else "" for i in range(n)]
    fig, ax = subplots(figsize=(min(14.0, max(6.0, 0.45 * n + 2)), 1.4 + 0.45 * len(result.layers)))
    _heatmap(ax, change, xlabels, [f"L{l}" for l in result.layers], name, result.kind, "layer")
    return save_png(fig, path, crop=False)
