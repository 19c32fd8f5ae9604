"""Views of a hand-built vs trained adder comparison (`circuitlab forge compare`), from its results dict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, Rule, Series

MODELS = {"hand": "hand-built", "trained": "trained"}


def comparison_figures(results: dict[str, Any]) -> dict[str, FigureSpec]:
    """File name -> view of `forge compare`'s results (summarize_comparison's dict): attention of every head
    (mean and one example; hand-built on the first row, trained on the second), agreement and OV
    similarity, the training curve."""
    labels = results["positions"]
    n, m = results["digits"]
    K = max(n, m) + 1
    queries = [f"{q}→s{K - 1 - r}" for r, q in enumerate(labels[n + m:])]  # each query and the digit it predicts
    ex = results["example"]
    means = {model: {h: v["mean_pattern"] for h, v in results["attention"][model].items()} for model in MODELS}
    sources = {"attention_mean": (means, f"mean attention at the answer positions, {results['samples']} problems"),
               "attention_example": ({model: ex[model] for model in MODELS}, f"attention on {ex['a']} + {ex['b']}")}
    figures = {}
    for kind, (src, title) in sources.items():
        cols = max(len(src["hand"]), len(src["trained"]))
        panels = []
        for model, name in MODELS.items():
            heads = list(src[model])
            for c in range(cols):
                if c >= len(heads):  # fewer heads in this model: an empty cell keeps the rows aligned
                    panels.append(Panel(f"{name}: -"))
                    continue
                panels.append(Panel(f"{name} {heads[c]}", y_title="query (→ digit it predicts)" if c == 0 else "",
                                    heatmap=Heatmap(src[model][heads[c]], labels, queries, 0.0, 1.0, "Viridis",
                                                    value_name="attention")))
        figures[f"{kind}.png"] = FigureSpec(panels, title, cols=cols)
    agreement = results["agreement"]
    mats = [("attention agreement", agreement["agreement"])]
    mats += [(f"OV {side} similarity (top directions)",
              [[c["top_similarity"] for c in row] for row in results["ov"][side]]) for side in ("input", "output")]
    figures["similarity.png"] = FigureSpec(
        [Panel(title, "trained head", "hand-built head", Heatmap(mat, agreement["heads_b"], agreement["heads_a"], 0.0,
                                                                 1.0, "Magma", annotate=True))
         for title, mat in mats], "hand-built against trained heads")
    train = results.get("training") or {}
    if train.get("loss_curve"):
        steps, loss = zip(*train["loss_curve"])
        series = [Series(steps, loss, "training loss (every position)", color=0)]
        if train.get("val_curve"):
            vs, vl = zip(*train["val_curve"])
            series.append(Series(vs, vl, "held-out loss", "line+markers", 1))
        floor = Rule(y=train["loss_floor"], label="floor: unpredictable digits of a and b")
        figures["training.png"] = FigureSpec([Panel("Training", "step", "next-token loss", series=series,
                                                    rules=[floor])])
    return figures


def write_comparison_figures(out: Path, results: dict[str, Any]) -> list[str]:
    """The comparison's PNGs into out; returns their file names."""
    return [spec.save_png(Path(out) / name).name for name, spec in comparison_figures(results).items()]
