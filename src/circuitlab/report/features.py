"""Report sections for a sparse dictionary: its numbers, the feature-density histogram, and one dashboard
card per chosen feature (contexts with tokens highlighted, activation histogram, promoted/suppressed tokens).

    write_dashboards_report("runs/sae/dashboards", dash, features=[3, 17], metrics=eval_metrics)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from circuitlab.report.html import Section, bullet_list, key_value_table, markdown_lite, write_html_report
from circuitlab.report.results import DictionarySummary
from circuitlab.viz.features import dashboards_html, density_figure

DEFAULT_CARDS = 50  # cards in a report when no features are named: the most active ones


def default_features(dash, n: int = DEFAULT_CARDS) -> list[int]:
    """The n features (of those in the dashboards) that fire most often, most frequent first."""
    order = dash.density.argsort(descending=True)[:n].tolist()
    return [dash.features[i] for i in order if float(dash.density[i]) > 0]


def dictionary_section(dash, metrics: Mapping[str, Any] | None = None) -> Section:
    info = DictionarySummary.from_dict(dash.summary())
    rows = {"hook": info.hook_name, **{k: v for k, v in (info.dictionary or {}).items() if k not in ("hook_name", "d_sae")},
            "features (d_sae)": info.d_sae, "tokens seen for the dashboards": info.n_tokens,
            "never fired on them": f"{info.dead_fraction:.1%}", "fire on > 10% of tokens": f"{info.dense_fraction:.1%}"}
    parts: list[Any] = [key_value_table(rows)]
    if metrics:
        parts.append(key_value_table({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}))
    parts.append(density_figure(dash))
    return Section("dictionary", "Dictionary", parts,
                   intro="What the dictionary reads and how often its features fire on the tokens shown below.")


def feature_cards_section(dash, features: Sequence[int], notes: Mapping[int, str] | None = None,
                          title: str = "Features") -> Section:
    """One card per feature; notes: a sentence shown above a feature's card."""
    parts = []
    for f in features:
        if notes and f in notes:
            parts.append(markdown_lite(notes[f]))
        parts.append(dashboards_html(dash, [f]))
    return Section("features", title, parts,
                   intro="Each line is one of the contexts that activate the feature most: the value at the left is "
                         "the activation at the outlined token; orange shading is the feature's activation on each "
                         "token (hover for the number). The histogram counts the tokens where the feature is active; "
                         "promoted and suppressed tokens are the largest and smallest entries of its logit effect "
                         "(decoder direction through the final norm and W_U).")


def write_dashboards_report(out: str | Path, dash, features: Sequence[int] | None = None,
                            metrics: Mapping[str, Any] | None = None, summary: Sequence[str] | str = (),
                            notes: Mapping[int, str] | None = None, title: str | None = None) -> Path:
    """out/report.html (or the .html path out) for a dictionary's dashboards."""
    features = list(features) if features is not None else default_features(dash)
    sections = []
    if summary:
        text = markdown_lite(summary) if isinstance(summary, str) else bullet_list(summary)
        sections.append(Section("summary", "Summary", [text]))
    sections += [dictionary_section(dash, metrics), feature_cards_section(dash, features, notes)]
    return write_html_report(out, sections, title or f"circuitlab features: {dash.hook_name}",
                             f"{len(features)} of {dash.d_sae} features")
