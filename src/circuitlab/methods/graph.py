"""The attribution-graph method (`circuitlab graph`, the explorer's /graphs): the graph of one prompt, end to end:
attribute, score, prune, write every file. Its options are graphs.options.GraphOptions; it is not in
methods.REGISTRY, whose methods `interpret` runs on a model alone: this one needs transcoders too.

    run = graph_experiment(model, transcoders, "Lily saw a cat. Lily", tokenizer=tok, out="runs/graph")
    run.summary            # findings in words; run.graph, run.pruned; run (in Jupyter) shows them
    graph_experiment(..., node_threshold=0.9)   # any GraphOptions field (or options=GraphOptions(...))

Files in `out` (built in a temporary folder and swapped in whole, so an interrupted run leaves nothing
that looks complete): graph/ (graph.safetensors + graph.json, the unpruned graph, exact and reloadable),
graph.json (the pruned graph for Neuronpedia / circuit-tracer's viewer), graph.svg (a static drawing),
results.json (scores, top paths in words, timings, sizes), report.md and report.html (the interactive
viewer of circuitlab.viz.graph_view reading graph.json's content, with the pruned features' dashboards).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.atomic import atomic_dir, json_text
from circuitlab.graphs import Graph, Pruned, Transcoders, attribute, logit_difference
from circuitlab.graphs.draw import graph_svg
from circuitlab.graphs.export import neuronpedia_json
from circuitlab.graphs.heads import head_loadings, strongest_heads
from circuitlab.graphs.options import DEFAULTS, GraphOptions, graph_options
from circuitlab.graphs.qk import qk_attributions, qk_cost
from circuitlab.viz.graph_view import (feature_cards, graph_report_html, graph_report_markdown, graph_result_html,
                                       graph_view_html)
from circuitlab.training.outputs import MARKER, check_output_folder, output_folder

if TYPE_CHECKING:
    from circuitlab.model import Transformer

GRAPH_DIR, VIEWER_JSON, SVG = "graph", "graph.json", "graph.svg"
FILES = {"graph": GRAPH_DIR, "viewer": VIEWER_JSON, "svg": SVG}   # the names the reports link to


@dataclass
class GraphResult:
    """The graph of one prompt (`circuitlab graph`): the graph, its pruning, the findings in words, results.json's
    content (data), the output folder, the feature cards and QK attributions the reports show."""

    graph: Graph
    pruned: Pruned
    summary: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None
    kept: Path | None = None    # where an earlier graph in `out` was set aside
    cards: dict[str, Any] = field(default_factory=dict)   # feature dashboards shown by the viewer
    qk: list[Any] = field(default_factory=list)           # QKAttributions of the strongest heads (with --qk)

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, "summary": self.summary}

    def _repr_html_(self) -> str:
        """The findings and the interactive viewer (the static drawing where scripts do not run)."""
        view = graph_view_html(viewer_data(self), features=self.cards,
                               fallback=graph_svg(self.graph, self.pruned))
        return graph_result_html(self.summary, view)


def graph_experiment(model: Transformer, transcoders: Transcoders, prompt: str, tokenizer: Any,
                     out: str | Path | None = None,
                     target: str | None = None, foil: str | None = None, *, options: GraphOptions | None = None,
                     progress: bool = True, slug: str = "graph", overwrite: bool = False,
                     saved_dashboards: dict[int, Any] | None = None, qk: bool = False, **values: Any) -> GraphResult:
    """Attribute the prediction after `prompt`, prune, split the pruned graph's cross-position edges over the
    heads that carried them (graph.loadings), and (with `out`) write the files. options: GraphOptions (the
    thresholds, logit nodes, feature cap, batch, token nodes, feature-card tokens, QK heads), or any of its fields
    as keywords (node_threshold=0.9, ...); each defaults to GraphOptions' own. qk: also the QK attributions of the
    qk_heads (head, query, key) carrying the most influence across positions. The report's feature cards come
    from saved_dashboards ({layer: FeatureDashboards}, viz.graph_view.saved_dashboards(folder)) where they hold
    a feature, else are built on dashboard_tokens held-out story tokens (0: none).
    Every argument and the output folder are checked before any work (the output policy of
    training.outputs); an earlier graph in `out` is set aside (run.kept says where) only once the new one
    is ready."""
    from circuitlab.errors import InputError

    opts = graph_options(options, **values)
    if out is not None:
        check_output_folder(out, "graph", overwrite=overwrite)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise InputError("the prompt is empty: give some text whose next token the graph explains")
    targets = _targets(model, tokenizer, target, foil)
    graph = attribute(model, transcoders, torch.tensor(ids), targets=targets, max_n_logits=opts.max_n_logits,
                      desired_logit_prob=opts.desired_logit_prob, batch_size=opts.batch_size,
                      max_feature_nodes=opts.max_feature_nodes, tokenizer=tokenizer, progress=progress,
                      prompt=prompt, verbose=progress, token_nodes=opts.token_nodes)
    t0 = time.perf_counter()
    pruned = graph.prune(opts.node_threshold, opts.edge_threshold)
    paths = graph.top_paths(5, pruned)
    t_prune = time.perf_counter() - t0
    t0 = time.perf_counter()
    directions = [t.direction for t in targets] if foil is not None and targets else None   # a difference
    graph.loadings = head_loadings(model, transcoders, graph, pruned, logit_directions=directions,
                                   batch_size=opts.batch_size, progress=progress, verbose=progress)
    heads = strongest_heads(graph, opts.qk_heads)
    t_heads = time.perf_counter() - t0
    qks: list[Any] = []
    t0 = time.perf_counter()
    if qk and heads:
        if progress:
            c = qk_cost(model, transcoders, len(heads), graph.n_pos)
            print(f"QK attributions: {c['requests']} heads; head outputs kept {c['head_outputs_mb']:.2f} MB, terms at "
                  f"most {c['terms_mb_max']:.0f} MB per head")
        qks = qk_attributions(model, transcoders, graph.tokens, [(h["layer"], h["head"], h["query_pos"],
                                                                  h["key_pos"]) for h in heads],
                              tokenizer, bos=graph.bos)
    t_qk = time.perf_counter() - t0
    info = dict(graph.info)
    info["seconds"] = {**info.get("seconds", {}), "prune": t_prune, "head_loadings": t_heads}
    if qk:
        info["seconds"]["qk"] = t_qk
    s = graph.summary(pruned)
    data = {"prompt": prompt, "graph": s, "top_paths": [{"strength": p["strength"], "words": p["words"]}
                                                         for p in paths],
            "transcoders": graph.transcoders, "token_nodes": graph.token_nodes, "identity": graph.identity,
            "timings_s": info["seconds"],
            "memory": {"adjacency_mb": info.get("adjacency_mb"), "attribution_peak_mb": info.get("peak_mb")},
            "head_loadings": {**graph.loadings.to_dict(), "strongest": heads}}
    if qk:
        data["qk"] = [r.to_dict() for r in qks]
    run = GraphResult(graph, pruned, _summary(graph, s, opts, paths, heads, qks, info), data, qk=qks)
    if opts.dashboard_tokens or saved_dashboards:
        run.cards = graph_feature_cards(model, transcoders, graph, pruned, tokenizer, n_tokens=opts.dashboard_tokens,
                                        saved=saved_dashboards)
    if out is not None:
        run.out = write_graph_run(run, Path(out), slug, overwrite)
    return run


def _targets(model: Transformer, tokenizer: Any, target: str | None, foil: str | None) -> list[Any] | None:
    """The logit targets: the top predictions (None), one token, or target minus foil."""
    from circuitlab.errors import InputError

    if target is None:
        if foil is not None:
            raise InputError("--foil needs --target (the graph explains target minus foil)")
        return None
    t = tokenizer.token_id(target, "target")
    return [t] if foil is None else [logit_difference(tokenizer, t, tokenizer.token_id(foil, "foil"), model.cfg.d_vocab)]


def _summary(graph: Graph, s: dict[str, Any], opts: GraphOptions, paths: list[dict[str, Any]],
             heads: list[dict[str, Any]], qks: list[Any], info: dict[str, Any]) -> list[str]:
    """The findings in words (s: graph.summary(pruned); info: the graph's info with every stage's seconds)."""
    summary = [f"{graph.n_pos} tokens, {s['n_active_features']} active features, {graph.n_nodes} nodes; logits: "
               + ", ".join(f"{x['label']!r} ({x['weight']:.2f})" for x in s["logits"]),
               f"replacement score {s['replacement_score']:.3f}, completeness score {s['completeness_score']:.3f}",
               f"pruned (nodes {opts.node_threshold}, edges {opts.edge_threshold}): {s['pruned']['nodes']} nodes "
               f"({s['pruned']['features']} features), {s['pruned']['edges']} edges"]
    if paths:
        summary.append(f"strongest path: {paths[0]['words']} (strength {paths[0]['strength']:.3g})")
    if heads:
        summary.append("heads carrying the most across positions: " + "; ".join(h["words"] for h in heads[:3]))
    for r in qks[:3]:
        lines = r.summary(1)
        summary.append(lines[0] + (f"; top pair {r.top_pairs(1)[0]['words']}" if r.pairs else ""))
    peak = "" if info.get("peak_mb") is None else f", peak memory {info['peak_mb']:.0f} MB"
    summary.append(f"attribution {info['seconds'].get('total', 0.0):.1f} s ({info.get('backward_passes')} backward "
                   f"passes){peak}; dense adjacency {info.get('adjacency_mb', 0.0):.1f} MB")
    return summary


def write_graph_run(run: GraphResult, out: Path, slug: str, overwrite: bool = False) -> Path:
    """Write every file of the run into `out` (the output-folder policy: an earlier graph folder is set aside,
    or replaced with overwrite; any other non-empty folder is refused), as one folder swapped in whole."""
    data = viewer_data(run, slug)
    viewer = json_text(data)
    svg = graph_svg(run.graph, run.pruned)
    view = graph_view_html(data, features=run.cards, fallback=svg)
    run.kept = output_folder(out, "graph", overwrite=overwrite)
    marker = (out / MARKER).read_text()
    with atomic_dir(out) as tmp:
        (tmp / MARKER).write_text(marker)
        run.graph.save(tmp / GRAPH_DIR)
        (tmp / VIEWER_JSON).write_text(viewer)
        # what circuit-tracer's local viewer lists (`circuit-tracer start-server --graph_file_dir OUT`)
        (tmp / "graph-metadata.json").write_text(json_text({"graphs": [data["metadata"]]}))
        (tmp / SVG).write_text(svg)
        sizes = {"viewer_json_kb": len(viewer.encode()) / 1024,
                 "graph_safetensors_kb": (tmp / GRAPH_DIR / "graph.safetensors").stat().st_size / 1024}
        run.data["files"] = sizes
        (tmp / "results.json").write_text(json_text(run.to_dict(), indent=1))
        (tmp / "report.md").write_text(_markdown(run))
        (tmp / "report.html").write_text(graph_report_html(*_report_parts(run), view=view, files=FILES))
    return out


def viewer_data(run: GraphResult, slug: str = "graph") -> dict[str, Any]:
    """The viewer's JSON (export.neuronpedia_json: links carry their heads) with the QK attributions, if any."""
    data = neuronpedia_json(run.graph, run.pruned, slug=slug)
    if run.qk:
        data["qk"] = [r.to_dict() for r in run.qk]
    return data


def _report_parts(run: GraphResult) -> tuple[str, list[str], list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    """What the reports show: prompt, findings, strongest paths, strongest heads, QK attributions."""
    return (run.data["prompt"], run.summary, run.data["top_paths"],
            run.data.get("head_loadings", {}).get("strongest", []), run.qk)


def _markdown(run: GraphResult) -> str:
    return graph_report_markdown(*_report_parts(run), files=FILES)


def graph_feature_cards(model: Transformer, transcoders: Transcoders, graph: Graph, pruned: Pruned, tokenizer: Any,
                        n_tokens: int = DEFAULTS.dashboard_tokens, saved: dict[int, Any] | None = None) -> dict[str, Any]:
    """Feature cards (viz.graph_view.feature_cards) of the pruned graph's feature nodes."""
    wanted: dict[int, list[int]] = {}
    for layer, _, feat in graph.features[pruned.node_mask[:graph.n_features]].tolist():
        wanted.setdefault(layer, []).append(feat)
    return feature_cards(model, transcoders, wanted, tokenizer, n_tokens=n_tokens, saved=saved)

