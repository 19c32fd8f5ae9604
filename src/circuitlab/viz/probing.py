"""Figure for linear probes: score by residual point per task, with the random-label control and chance."""
from __future__ import annotations

from pathlib import Path


from circuitlab.analysis.probing import ProbeResult
from circuitlab.viz.png import save_png, subplots


def plot_probe_accuracy(results: dict[str, ProbeResult] | ProbeResult, path: str | Path) -> Path:
    """Val score by residual point, one colour per task: solid = probe, dashed = random-label control,
    dotted = chance (the most frequent class). Accuracy and R² share the 0..1 axis."""
    if isinstance(results, ProbeResult):
        results = {results.task: results}
    points = next(iter(results.values())).points
    fig, ax = subplots(figsize=(max(6.0, 0.7 * len(points) + 3.0), 3.8))
    x = range(len(points))
    for i, (name, res) in enumerate(results.items()):
        color = f"C{i}"
        ax.plot(x, res.val_score.numpy(), color=color, marker="o", label=f"{name} ({res.score})")
        if not res.control_score.isnan().all():
            ax.plot(x, res.control_score.numpy(), color=color, ls="--", alpha=0.7, label=f"{name} control")
        ax.axhline(res.chance, color=color, ls=":", lw=0.8)
    ax.set_xticks(list(x), points, fontsize=8)
    ax.set(xlabel="residual stream point", ylabel="val score", ylim=(-0.05, 1.05),
           title="Linear probes by layer (dashed: random-label control, dotted: chance)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_png(fig, path, crop=False)
