"""Feature dashboards drawn: self-contained HTML cards (no script needed) and a plotly density figure.

    feature_card_html(dash, 12)          # one feature: top contexts with tokens highlighted by activation,
                                         # activation histogram (inline SVG), density, promoted/suppressed tokens
    dashboards_html(dash, [12, 40])      # several cards with their stylesheet (Jupyter, report.html)
    density_figure(dash)                 # a FigureSpec: log10 feature density over the whole dictionary

dash is a circuitlab.dictionaries.features.FeatureDashboards; nothing here reads or writes files.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from circuitlab.dictionaries.features import FeatureDashboards
from circuitlab.display import renders
from circuitlab.viz import token_label
from circuitlab.viz.figure import FigureSpec, Panel, Series

CARD_CSS = """
.feature-card { border: 1px solid #d9dee7; border-radius: .4rem; padding: .6rem .9rem; margin: .6rem 0 1rem; }
.feature-card h4 { margin: 0 0 .3rem; font-size: 1rem; }
.feature-card .facts { color: #5b6475; font-size: .85rem; margin-bottom: .4rem; }
.feature-card .ctx { font: 13px/1.9 ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; overflow-x: auto; }
.feature-card .ctx .val { display: inline-block; min-width: 4.5rem; color: #5b6475; }
.feature-card .tok { padding: 1px 0; border-radius: 2px; }
.feature-card .tok.at { outline: 1px solid #b34700; }
.feature-card .cols { display: flex; gap: 1.5rem; flex-wrap: wrap; align-items: flex-start; }
.feature-card .logits span { display: inline-block; font: 12px ui-monospace, monospace; margin: 1px 3px 1px 0;
                             padding: 0 3px; border-radius: 2px; }
.feature-card .up { background: #dbe9fb; } .feature-card .down { background: #fbe0dd; }
"""


def _esc(s: Any) -> str:
    return html.escape(str(s))


def highlight(value: float, top: float) -> str:
    """Background colour of a token whose activation is value (orange, opacity value / top)."""
    alpha = 0.0 if top <= 0 or value <= 0 else min(1.0, value / top)
    return f"rgba(255,140,0,{alpha:.2f})"


def context_html(context: dict[str, Any], top: float) -> str:
    """One context (FeatureDashboards.contexts item) as a line of tokens shaded by the feature's activation
    (hover: the activation); the activating token is outlined."""
    spans = []
    for n, (tok, act) in enumerate(zip(context["tokens"], context["acts"])):
        cls = "tok at" if n == context["at"] else "tok"
        spans.append(f'<span class="{cls}" style="background:{highlight(act, top)}" '
                     f'title="{act:.3f}">{_esc(token_label(tok))}</span>')
    return f'<div class="ctx"><span class="val">{context["value"]:.3f}</span>{"".join(spans)}</div>'


def histogram_svg(edges: Sequence[float], counts: Sequence[int], width: int = 260, height: int = 70) -> str:
    """Bars of counts over log-spaced bins (edges: len(counts) + 1), trimmed to the bins in use, as inline SVG."""
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return '<div class="facts">(never active)</div>'
    lo, hi = used[0], used[-1] + 1
    shown = counts[lo:hi]
    peak = max(shown)
    bar = width / len(shown)
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - 14 - (height - 14) * c / peak:.1f}" width="{max(bar - 1, 1):.1f}" '
        f'height="{(height - 14) * c / peak:.1f}" fill="#2a5db0"><title>{edges[lo + i]:.3g}-{edges[lo + i + 1]:.3g}: '
        f'{c}</title></rect>' for i, c in enumerate(shown))
    labels = (f'<text x="0" y="{height - 2}" font-size="10" fill="#5b6475">{edges[lo]:.2g}</text>'
              f'<text x="{width}" y="{height - 2}" font-size="10" fill="#5b6475" text-anchor="end">{edges[hi]:.2g}</text>')
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="activation histogram">'
            f"{rects}{labels}</svg>")


def _percent(x: float) -> str:
    return f"{x:.3%}" if x < 0.01 else f"{x:.1%}"


def feature_card_html(dash, feature: int, max_contexts: int = 10) -> str:
    """One feature's dashboard as an HTML card."""
    f = dash.feature(feature)
    contexts = f["contexts"][:max_contexts]
    top = max((c["value"] for c in contexts), default=0.0)
    facts = (f"density {_percent(f['density'])} of {dash.n_tokens:,} tokens · max {f['max_act']:.3g} · "
             f"mean when active {f['mean_act']:.3g}")
    lines = "".join(context_html(c, top) for c in contexts) or '<div class="facts">never active on these tokens</div>'
    logit_html = ""
    if f["logits"] is not None:
        logit_html = "".join(
            f'<div class="logits"><b>{kind}</b><br>' + "".join(
                f'<span class="{cls}" title="{t["value"]:+.3f}">{_esc(token_label(t["token"]))}</span>'
                for t in f["logits"][kind]) + "</div>"
            for kind, cls in (("promoted", "up"), ("suppressed", "down")))
    hist = histogram_svg(f["histogram"]["edges"], f["histogram"]["counts"])
    return (f'<div class="feature-card" id="feature-{feature}"><h4>Feature {feature}</h4>'
            f'<div class="facts">{facts}</div>{lines}'
            f'<div class="cols"><div><b>activation histogram</b> (log scale)<br>{hist}</div>{logit_html}</div></div>')


def dashboards_html(dash, features: Sequence[int]) -> str:
    """Cards of several features with their stylesheet, for Jupyter or a report section."""
    return f"<style>{CARD_CSS}</style>" + "".join(feature_card_html(dash, f) for f in features)


def density_figure(dash) -> FigureSpec:
    """Histogram (40 bins) of log10(density) over every feature of the dictionary; dead features counted in
    the title."""
    density = dash.all_density.double()
    alive = density[density > 0].log10().numpy()
    dead = int((density == 0).sum())
    counts, edges = np.histogram(alive, bins=40) if alive.size else (np.zeros(0), np.zeros(1))
    centres = [round(float(a + b) / 2, 3) for a, b in zip(edges[:-1], edges[1:])]
    floor = math.log10(1 / max(dash.n_tokens, 1))
    bars = Series(centres, counts.tolist(), "", "bar", "#2a5db0")
    return FigureSpec([Panel(series=[bars], x_title=f"log10 fraction of tokens active (one token = {floor:.1f})",
                             y_title="features")],
                      f"Feature density over {dash.n_tokens:,} tokens ({dead} of {dash.d_sae} never fired)", height=300)


renders(FeatureDashboards)(lambda dash: dashboards_html(dash, dash.features[:10]))  # Jupyter (circuitlab.display)
