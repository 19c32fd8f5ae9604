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

The viewer has a browser mode too, `circuitlab serve`'s /graphs: graph_browser_html is its page (pick a listed
graph, open it, compute a new one from a form of the options the server takes), CLGraphView.browse in
graph_view.js drives it over the server's JSON API (serve/graphs.py's routes).

    page = graph_browser_html("/api/graphs", ComputeOptions, assets="/static/")   # the page /graphs serves

The pages around the viewer live here too, rendered from plain data (the experiments return it): a Graph's
Jupyter display, `circuitlab graph`'s report.md / report.html, the graphs demo's; paths_table is the one
rendering of the strongest paths.
"""
from __future__ import annotations

import dataclasses
import html
import itertools
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.atomic import json_text
from circuitlab.checks import Number
from circuitlab.display import renders
from circuitlab.graphs.attribution_graph import Graph, Pruned
from circuitlab.graphs.options import DEFAULTS
from circuitlab.spec import Option, Options, options_of

if TYPE_CHECKING:
    from circuitlab.model import Transformer

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


def feature_cards(model: Transformer, transcoders: Any, wanted: Mapping[int, Iterable[int]], tokenizer: Any,
                  n_tokens: int = DEFAULTS.dashboard_tokens, saved: dict[int, Any] | None = None) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------- the browser (`circuitlab serve`)

PROMPT = "Once upon a time, there was a little girl named Lily. She"   # the compute form's prompt to start from
CHOICE_WORDS = {"W_E": "W_E (circuit-tracer)"}                         # a choice's words in the form, where not itself


def _option_input(f: dataclasses.Field, opt: Option) -> str:
    """One option's input, option-<field>: a menu of its choices, a number (whole: step 1; else 0.01; no default:
    empty, the server's None) or text. Its default, bounds and help are the server's (filled in by browse)."""
    esc, name = html.escape, f.name
    words = name.replace("_", " ")
    if opt.choices is not None:
        items = "".join(f'<option value="{esc(str(c))}">{esc(CHOICE_WORDS.get(c, str(c)))}</option>'
                        for c in opt.choices)
        return f'<label>{words} <select id="option-{name}">{items}</select></label>'
    if isinstance(opt.rule, Number):
        step = "1" if opt.rule.kind is int else "0.01"
        empty = ' placeholder="all"' if f.default is None else ""   # a cap left empty: none
        return f'<label>{words} <input id="option-{name}" type="number" step="{step}"{empty}></label>'
    return f'<label>{words} <input id="option-{name}" type="text"></label>'


def graph_browser_html(api: str, options: type[Options], *, assets: str, stylesheets: Iterable[str] = (),
                       nav: str = "", title: str = "circuitlab graphs") -> str:
    """The graph browser's page: CLGraphView.browse over the JSON API at `api` (serve/graphs.py's /api/graphs):
    the header (title, nav: its links as HTML, graph-info: what is listed), a menu of the graphs (graph-list) and
    open, a compute form (compute-prompt and one input option-<field> per field of the options class `options`,
    shown when the server can compute), status, and the viewer the graph opens in (data-clgv-browse: graph_view.js
    starts the browser there). assets: the URL folder graph_view.js and .css are served from (not inlined: the
    explorer's pages run no inline scripts); stylesheets: more style sheets' URLs (the explorer's)."""
    esc = html.escape
    links = "\n  ".join(f'<link rel="stylesheet" href="{esc(u)}">' for u in [*stylesheets, assets + "graph_view.css"])
    inputs = "\n      ".join(_option_input(f, opt) for f, opt in options_of(options))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{esc(title)}</title>
  {links}
  <script src="{esc(assets)}graph_view.js" defer></script>
</head>
<body>
  <header>
    <h1>{esc(title)}</h1>
    {nav}
    <span id="graph-info">loading the graphs…</span>
  </header>
  <main>
    <form id="open-form" class="controls">
      <label>graph <select id="graph-list"></select></label>
      <button id="open" type="submit">Open</button>
    </form>
    <form id="compute-form" class="controls" hidden>
      <label>prompt <input id="compute-prompt" type="text" size="50" value="{esc(PROMPT)}"></label>
      {inputs}
      <button id="compute" type="submit">Compute a graph</button>
    </form>
    <div id="status" class="status" role="status"></div>
    <div id="viewer" data-clgv-browse="{esc(api)}"></div>
  </main>
</body>
</html>
"""


# ---------------------------------------------------------------------------- the pages around the viewer
# (`circuitlab graph`'s and the graphs demo's report.md / report.html, Jupyter): plain data in, text out.

def bullets_html(lines: Iterable[str]) -> str:
    """<li> items of sentences, escaped (the caller puts them in its <ul>)."""
    return "".join(f"<li>{html.escape(s)}</li>" for s in lines)


def paths_table(paths: Iterable[dict[str, Any]], markdown: bool = False) -> str:
    """The strongest-paths table (Graph.top_paths: {"words", "strength"} each), HTML or Markdown: the one
    rendering the graph's summary, its report.html and its report.md share."""
    cells = [(p["words"], f"{p['strength']:.3g}") for p in paths]
    if markdown:
        return "\n".join(["| strongest paths | strength |", "|---|---|"] + [f"| {w} | {s} |" for w, s in cells])
    rows = "".join(f"<tr><td>{html.escape(w)}</td><td>{s}</td></tr>" for w, s in cells)
    return f"<table><tr><th>strongest paths</th><th>strength</th></tr>{rows}</table>"


def graph_summary_html(graph: Graph, pruned: Pruned | None = None) -> str:
    """A Graph in Jupyter: its size, logits, scores and strongest paths."""
    s = graph.summary(pruned)
    logits = ", ".join(f"{html.escape(repr(x['label']))} ({x['weight']:.2f})" for x in s["logits"])
    return (f"<div><b>Attribution graph</b>: {graph.n_pos} positions, {s['n_feature_nodes']} feature nodes, "
            f"{s['n_nodes']} nodes; logits {logits}<br>replacement score {s['replacement_score']:.3f}, "
            f"completeness score {s['completeness_score']:.3f}{paths_table(graph.top_paths(5, pruned))}</div>")


renders(Graph)(graph_summary_html)   # Jupyter (circuitlab.display; the package root imports this module there)


def graph_result_html(summary: list[str], view: str) -> str:
    """`circuitlab graph`'s result in Jupyter: the findings, then the viewer."""
    return f"<b>attribution graph</b><ul>{bullets_html(summary)}</ul>{view}"


def _heads_markdown(strongest: list[dict[str, Any]], qk: list[Any]) -> list[str]:
    lines = []
    if strongest:
        lines += ["## Heads", "", "Which heads carried the pruned graph's cross-position edges (each edge's head "
                  "loadings; the strongest by influence):", ""] + [f"- {h['words']}" for h in strongest] + [""]
    for r in qk:
        lines += [f"### QK: {r.summary(0)[0]}", ""] + [f"- {x}" for x in r.summary(5)[1:]] + [""]
    return lines


def graph_report_markdown(prompt: str, summary: list[str], paths: list[dict[str, Any]],
                          strongest: list[dict[str, Any]], qk: list[Any], files: dict[str, str]) -> str:
    """`circuitlab graph`'s report.md: the findings, the strongest paths, the heads (strongest_heads) and QK
    attributions, the drawing; files: {"graph", "viewer", "svg"} names in the output folder."""
    lines = ["# Attribution graph", "", f"Prompt: `{prompt}`", ""]
    lines += [f"- {s}" for s in summary]
    lines += ["", paths_table(paths, markdown=True)]
    lines += [""] + _heads_markdown(strongest, qk)
    lines += ["", f"![pruned graph]({files['svg']})", "",
              f"Files: `{files['graph']}/` (the full graph, reload with `Graph.load`), `{files['viewer']}` (open in "
              "Neuronpedia's or circuit-tracer's graph viewer), `results.json`.", ""]
    return "\n".join(lines)


def graph_report_html(prompt: str, summary: list[str], paths: list[dict[str, Any]], strongest: list[dict[str, Any]],
                      qk: list[Any], view: str, files: dict[str, str]) -> str:
    """`circuitlab graph`'s report.html (graph_report_markdown's content, with the viewer `view`)."""
    from circuitlab.graphs.qk import qk_html

    heads = ""
    if strongest:
        heads = ("<h2>Heads</h2><p>Which heads carried the pruned graph's cross-position edges (click an edge in "
                 f"the viewer for its heads):</p><ul>{bullets_html(h['words'] for h in strongest)}</ul>")
    if qk:
        heads += "<h2>QK attributions</h2>" + qk_html(qk)
    svg, viewer = files["svg"], files["viewer"]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>attribution graph</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}</style></head>"
            f"<body><h1>Attribution graph</h1><p>Prompt: <code>{html.escape(prompt)}</code></p>"
            f"<ul>{bullets_html(summary)}</ul>{paths_table(paths)}{heads}"
            f"<h2>The pruned graph</h2>{view}<p>A static drawing: <a href='{svg}'>{svg}</a>; the graph file the "
            f"view reads: <a href='{viewer}'>{viewer}</a>.</p></body></html>")


def graphs_demo_markdown(result: Any, out: Path) -> str:
    """The graphs demo's report.md (experiments.graphs_demo.GraphsDemoResult): its summary, each graph's
    finding in words with its strongest features, the numbers side by side."""
    lines = ["# circuitlab graphs demo", ""] + result.summary()
    for g in result.graphs:
        lines += ["", f"## {g.slug}: {g.target!r} after {g.prompt[-40:]!r}", ""] + [f"- {s}" for s in g.sentences()]
        lines += ["", "| feature node | influence on the logit | signed effect on the logit | activation |",
                  "|---|---|---|---|"]
        lines += [f"| {f['label']} | {f['influence']:.3f} | {f['effect']:+.3f} | "
                  f"{f['activation']:.3g} |" for f in g.top_features]
        if g.heads:
            lines += ["", f"Heads: {g.heads['words']}"]
        lines += ["", f"Files: `{Path(g.files).relative_to(out) if g.files else ''}/` (graph.json opens in "
                      "Neuronpedia's or circuit-tracer's viewer; graph.svg is the pruned graph)."]
    lines += ["", "## Numbers", "", "| graph | p(target) | replacement | completeness | focus share | "
              "p after intervention (real model) | control | confirms |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {g.slug} | {g.p_target:.3f} | {g.scores['replacement']:.3f} | {g.scores['completeness']:.3f} | "
              f"{g.token_share['focus']:.3f} | {g.ablation.p_model:.3f} | {g.ablation.p_control:.3f} | "
              f"{ {True: 'yes', False: 'no', None: 'untested'}[g.confirmed]} |" for g in result.graphs]
    return "\n".join(lines) + "\n"


def graphs_demo_html(result: Any) -> str:
    """The graphs demo's report.html: the summary, then each graph's finding and its viewer (g.view: the
    (Graph, Pruned, feature cards) kept beside the finding)."""
    from circuitlab.graphs.export import neuronpedia_json

    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>circuitlab graphs demo</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:80em}.graph{overflow-x:auto;border:1px solid #ddd;"
             "margin:1em 0}td,th{padding:2px 8px;text-align:left}li{margin:.3em 0}</style></head><body>",
             "<h1>circuitlab graphs demo</h1><section id='summary'><ul>", bullets_html(result.summary()),
             "</ul></section>"]
    for g in result.graphs:
        parts.append(f"<section id='{esc(g.slug)}'><h2>{esc(g.slug)}: {esc(repr(g.target))}</h2>"
                     f"<p>Prompt: <code>{esc(g.prompt)}</code></p><ul>{bullets_html(g.sentences())}</ul>")
        if g.heads:
            parts.append(f"<p>Heads: {esc(g.heads['words'])}</p>")
        view = getattr(g, "view", None)
        if view is not None:
            graph, pruned, cards = view
            data = neuronpedia_json(graph, pruned, slug=g.slug)
            parts.append(f"<div class='graph'>{graph_view_html(data, features=cards, title=g.slug)}</div>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "".join(parts)


def graphs_demo_summary_html(result: Any) -> str:
    """The graphs demo's result in Jupyter: the summary and each graph's finding."""
    graphs = "".join(f"<h4>{html.escape(g.slug)}</h4><ul>{bullets_html(g.sentences())}</ul>" for g in result.graphs)
    return f"<ul>{bullets_html(result.summary())}</ul>{graphs}"
