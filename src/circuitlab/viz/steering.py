"""Figure for a steering sweep: the target metric and the neutral-text loss cost against the coefficient."""
from __future__ import annotations

from pathlib import Path

from circuitlab.analysis.steering import SteeringSweep
from circuitlab.viz.png import save_png, subplots


def plot_steering(sweep: SteeringSweep, path: str | Path) -> Path:
    """Left: preference for the positive prompts (and the custom metric, if any) by coefficient;
    right: the increase of the loss on neutral text."""
    fig, (left, right) = subplots(1, 2, figsize=(8.5, 3.2))
    left.plot(sweep.coefs, sweep.preference.numpy(), marker="o", label="preference (nats/token)")
    if sweep.metric is not None:
        left.plot(sweep.coefs, sweep.metric.numpy(), marker="s", label=sweep.metric_name or "metric")
    left.axhline(0, color="black", lw=0.6)
    left.set(xlabel="coefficient", title=f"Target metric ({sweep.vector.hook_name})")
    left.legend(fontsize=7)
    right.plot(sweep.coefs, sweep.neutral_cost().numpy(), marker="o", color="C3")
    right.axhline(0, color="black", lw=0.6)
    right.set(xlabel="coefficient", ylabel="Δ loss (nats/token)", title="Cost on neutral text")
    for ax in (left, right):
        ax.title.set_fontsize(9)
    return save_png(fig, path)
