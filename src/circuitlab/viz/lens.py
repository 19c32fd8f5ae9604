"""Figures for the residual stream: logit lens table, direct logit attribution bars."""
from __future__ import annotations

from pathlib import Path


from circuitlab.analysis.attribution import LogitAttribution
from circuitlab.analysis.lens import LogitLens
from circuitlab.viz import token_label
from circuitlab.viz.png import save_png, subplots


def plot_logit_lens(lens: LogitLens, path: str | Path, max_positions: int = 24) -> Path:
    """Rows: residual after embed / each layer; columns: the last max_positions positions. Colour:
    probability of the top-1 token at that point; text: that token."""
    n_pos = len(lens.tokens)
    start = max(0, n_pos - max_positions)
    probs = lens.top_probs[:, start:, 0].float()
    fig, ax = subplots(figsize=(1.5 + 0.75 * probs.shape[1], 1.2 + 0.45 * probs.shape[0]))
    ax.imshow(probs.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(probs.shape[0]):
        for j in range(probs.shape[1]):
            tok = lens.top_strs[i][start + j][0] if lens.top_strs else str(int(lens.top_tokens[i, start + j, 0]))
            ax.text(j, i, token_label(tok, 8), ha="center", va="center", fontsize=6,
                    color="white" if probs[i, j] > 0.6 else "black")
    inputs = lens.token_strs[start:] if lens.token_strs else [str(t) for t in lens.tokens[start:]]
    ax.set_xticks(range(len(inputs)), [token_label(s, 8) for s in inputs], rotation=90, fontsize=7)
    ax.set_yticks(range(len(lens.labels)), lens.labels, fontsize=8)
    ax.set(xlabel="input token (prediction is for the next one)", ylabel="residual after",
           title="Logit lens: top-1 next token and its probability")
    return save_png(fig, path)


def plot_logit_attribution(dla: LogitAttribution, path: str | Path, n: int = 20) -> Path:
    """Horizontal bars of the n largest mean direct logit attributions, biggest on top."""
    top = dla.top(n)[::-1]
    fig, ax = subplots(figsize=(6, 1 + 0.28 * len(top)))
    ax.barh([c for c, _ in top], [v for _, v in top], color=["C3" if v < 0 else "C0" for _, v in top])
    ax.axvline(0, color="black", lw=0.8)
    what = "logit difference" if dla.wrong is not None else "logit"
    ax.set(xlabel=f"direct contribution to the {what}", title=f"Direct logit attribution at position {dla.pos}")
    ax.tick_params(axis="y", labelsize=8)
    return save_png(fig, path)
