"""Figures of a hand-built vs trained adder comparison (`circuitlab forge compare`)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib
import torch
from matplotlib.figure import Figure


def write_comparison_figures(out: Path, results: dict[str, Any]) -> list[str]:
    """PNG figures of `forge compare`'s results (summarize_comparison's dict) into out: attention of
    every head (mean and one example), agreement and OV similarity, the training curve; returns their
    file names."""
    names = []
    labels = results["positions"]
    n, m = results["digits"]
    K = max(n, m) + 1
    qlabels = [f"{q}→s{K - 1 - r}" for r, q in enumerate(labels[n + m:])]  # each query and the digit it predicts
    for kind, title in (("attention_mean", "mean attention at the answer positions, {s} problems"),
                        ("attention_example", "attention on {a} + {b}")):
        src = {"hand": {h: v["mean_pattern"] for h, v in results["attention"]["hand"].items()},
               "trained": {h: v["mean_pattern"] for h, v in results["attention"]["trained"].items()}}
        if kind == "attention_example":
            src = {"hand": results["example"]["hand"], "trained": results["example"]["trained"]}
        cols = max(len(src["hand"]), len(src["trained"]))
        fig = Figure(figsize=(3.2 * cols + 1, 6.4), layout="constrained")
        axes = fig.subplots(2, cols, squeeze=False)
        for r, model in enumerate(("hand", "trained")):
            heads = list(src[model])
            for c in range(cols):
                ax = axes[r][c]
                if c >= len(heads):
                    ax.axis("off")
                    continue
                h = heads[c]
                im = ax.imshow(src[model][h], vmin=0, vmax=1, cmap="viridis", aspect="auto")
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
                ax.set_yticks(range(len(qlabels)), qlabels, fontsize=8)
                ax.set_title(f"{'hand-built' if model == 'hand' else 'trained'} {h}", fontsize=10)
                if c == 0:
                    ax.set_ylabel("query (→ digit it predicts)")
        fig.colorbar(im, ax=axes, shrink=0.6, label="attention")
        ex = results["example"]
        fig.suptitle(title.format(s=results["samples"], a=ex["a"], b=ex["b"]))
        fig.savefig(out / f"{kind}.png", dpi=110)
        names.append(f"{kind}.png")

    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    mats = [("attention agreement", results["agreement"]["agreement"])]
    for side in ("input", "output"):
        mats.append((f"OV {side} similarity (top directions)",
                     [[c["top_similarity"] for c in row] for row in results["ov"][side]]))
    fig = Figure(figsize=(4.2 * len(mats), 0.6 * len(hand_heads) + 2.4), layout="constrained")
    axes = fig.subplots(1, len(mats), squeeze=False)[0]
    for ax, (title, mat) in zip(axes, mats):
        values = torch.tensor([[math.nan if v is None else v for v in row] for row in mat], dtype=torch.float64)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="lightgray")
        im = ax.imshow(values.numpy(), vmin=0, vmax=1, cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(other_heads)), other_heads)
        ax.set_yticks(range(len(hand_heads)), hand_heads)
        ax.set_xlabel("trained head")
        ax.set_ylabel("hand-built head")
        ax.set_title(title, fontsize=10)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                v = values[i, j].item()
                ax.text(j, i, "—" if math.isnan(v) else f"{v:.2f}", ha="center", va="center",
                        color="white" if not math.isnan(v) and v < 0.6 else "black", fontsize=9)
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.savefig(out / "similarity.png", dpi=110)
    names.append("similarity.png")

    train = results.get("training") or {}
    if train.get("loss_curve"):
        fig = Figure(figsize=(6, 3.6), layout="constrained")
        ax = fig.subplots()
        steps, loss = zip(*train["loss_curve"])
        ax.plot(steps, loss, label="training loss (every position)")
        if train.get("val_curve"):
            vs, vl = zip(*train["val_curve"])
            ax.plot(vs, vl, "o-", label="held-out loss")
        ax.axhline(results["training"]["loss_floor"], color="gray", ls="--",
                   label="floor: unpredictable digits of a and b")
        ax.set_xlabel("step")
        ax.set_ylabel("next-token loss")
        ax.legend(fontsize=8)
        fig.savefig(out / "training.png", dpi=110)
        names.append("training.png")
    return names
