"""The interactive attribution-graph viewer: one self-contained piece of HTML (its JavaScript and CSS
inlined, no network) that reads the graph file itself, the viewer JSON of circuitlab.graphs.export.

    html = graph_view_html(neuronpedia_json(graph, pruned), features=cards)      # a fragment for a report
    page = graph_view_html((graph, pruned), page=True)                          # a whole page

Nodes are laid out by layer (rows; tokens at the bottom, logits on top) and position (columns); edges are
blue (positive) or red (negative), wider and darker with |weight|. Click a node to light up its strongest
paths down to the tokens and up to the logits; hover a feature for its card (top-activating contexts,
promoted tokens); the node and edge sliders re-prune in the page (export.reprune's rule); pinned nodes
and named supernodes go into the file's qParams (Neuronpedia's pinnedIds / supernodes), downloaded here
or saved in place by `circuitlab serve` (/graphs), which also runs interventions. graph_view.js is also
served as a static file by the explorer (its pages may not run inline scripts).
"""
from __future__ import annotations

import html
import itertools
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from circuitlab.atomic import json_text

ASSETS = ("graph_view.js", "graph_view.css")
_ids = itertools.count()


def asset(name: str) -> str:
    """The text of graph_view.js or graph_view.css."""
    if name not in ASSETS:
        raise ValueError(f"unknown viewer asset {name!r}")
    return resources.files("circuitlab.viz").joinpath(name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element: no '<' at all (nothing can close it or open a comment)."""
    return json_text(value).replace("<", "\\u003c")


def saved_dashboards(folder: str | Path | None) -> dict[int, Any]:
    """{layer: FeatureDashboards} saved by `circuitlab sae dashboards` under a transcoders folder: each
    layer's dictionary folder's dashboards/ (per-layer transcoders, also under dictionaries/) or a CLT's
    dashboards-layer{L}/. Unreadable ones are skipped (the cards are then computed)."""
    from circuitlab.dictionaries.features import META_FILE, FeatureDashboards
    from circuitlab.errors import CircuitlabError

    if folder is None or not Path(folder).is_dir():
        return {}
    found: dict[int, Any] = {}
    for meta in sorted(Path(folder).glob(f"**/dashboards*/{META_FILE}")):
        if len(meta.relative_to(folder).parts) > 4:
            continue
        try:
            dash = FeatureDashboards.load(meta.parent)
        except CircuitlabError:
            continue
        match = re.match(r"blocks\.(\d+)\.", dash.hook_name)
        layer = dash.dictionary_info.get("clt", {}).get("layer", int(match.group(1)) if match else None)
        if layer is not None:
            found.setdefault(int(layer), dash)
    return found


def feature_cards(model: Any, transcoders: Any, wanted: dict[int, Iterable[int]], tokenizer: Any,
                  n_tokens: int = 4096, saved: dict[int, Any] | None = None) -> dict[str, Any]:
    """Feature cards for the viewer: {"{layer}_{feature}": FeatureDashboards.feature(f) + "from"} of the
    features wanted ({layer: features}) of a circuitlab.graphs.Transcoders. From the saved dashboards
    ({layer: FeatureDashboards}, saved_dashboards(folder)) where they hold the feature; the rest computed,
    each layer's on n_tokens of held-out built-in stories (a cross-layer transcoder: the layer's total write,
    clt.residual_view); none computed with n_tokens=0 or when the tokenizer cannot read the stories (e.g. the
    planted model's)."""
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.dictionaries.features import feature_dashboards, text_batches
    from circuitlab.errors import CircuitlabError

    saved = saved or {}
    cards: dict[str, Any] = {}
    missing: dict[int, list[int]] = {}
    for layer, feats in sorted(wanted.items()):
        dash = saved.get(layer)
        for f in sorted(set(feats)):
            if dash is not None and f in dash.features:
                cards[f"{layer}_{f}"] = {**dash.feature(f), "from": f"saved dashboards ({dash.n_tokens:,} tokens)"}
            else:
                missing.setdefault(layer, []).append(f)
    if not missing or not n_tokens or not hasattr(tokenizer, "eos_id"):
        return cards
    try:
        batches = text_batches(tokenizer, n_tokens=n_tokens, seq_len=min(64, model.cfg.n_ctx))
    except CircuitlabError:
        return cards
    for layer, feats in missing.items():
        d = transcoders.dictionary(layer)
        d = d if isinstance(d, SparseDictionary) else d.residual_view(layer)
        dash = feature_dashboards(model, d, batches, features=feats, k=5, tokenizer=tokenizer)
        cards.update({f"{layer}_{f}": {**dash.feature(f), "from": f"computed on {dash.n_tokens:,} tokens of "
                                                                  "held-out stories"} for f in feats})
    return cards


def graph_view_html(data: Any, *, features: dict[str, Any] | None = None, title: str = "attribution graph",
                    page: bool = False, fallback: str | None = None) -> str:
    """The viewer for one graph. data: the viewer JSON dict (what graph.json holds), or a (Graph, Pruned)
    pair. features: {"{layer}_{feature}": FeatureDashboards.feature(f)} cards shown on hover. page: a whole
    HTML document instead of a fragment (fragments may be repeated in one page). fallback: HTML shown where
    scripts do not run (e.g. the static SVG of graphs.draw); the viewer replaces it."""
    if isinstance(data, tuple):
        from circuitlab.graphs.export import neuronpedia_json

        data = neuronpedia_json(*data)
    uid = f"clgv-{next(_ids)}"
    fragment = (f"<style>{asset('graph_view.css')}</style>"
                f"<div id='{uid}' class='clgv'>{fallback if fallback is not None else 'loading the graph…'}</div>"
                f"<script type='application/json' id='{uid}-data'>{_script_json(data)}</script>"
                f"<script type='application/json' id='{uid}-features'>{_script_json(features or {})}</script>"
                f"<script>{asset('graph_view.js')}</script>"
                f"<script>(function () {{ var d = function (s) {{ return JSON.parse("
                f"document.getElementById('{uid}-' + s).textContent); }};"
                f"CLGraphView.mount(document.getElementById('{uid}'), d('data'), {{features: d('features')}});"
                f"}})();</script>")
    if not page:
        return fragment
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title></head><body>{fragment}</body></html>")
