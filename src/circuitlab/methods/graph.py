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

explain() is one prompt's graph with its story tested (what `circuitlab graph demo` runs on each of its prompts):
the graph written as above, its numbers (scores, which positions and which kinds of node the target's influence
comes from), the intervention of graphs/verify.py on the features the graph says raise the target most, and the
finding in words (GraphFinding.sentences, each verdict from the numbers it states).

    finding = explain(model, transcoders, tokenizer, PromptSpec(...), out=Path("runs/graphs/graphs"))
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.atomic import atomic_dir, json_text
from circuitlab.graphs import Graph, Pruned, Transcoders, attribute, logit_difference
from circuitlab.graphs.attribution_graph import normalized
from circuitlab.graphs.draw import graph_svg
from circuitlab.graphs.export import neuronpedia_json
from circuitlab.graphs.heads import head_loadings, strongest_heads
from circuitlab.graphs.options import DEFAULTS, GraphOptions, graph_options
from circuitlab.graphs.qk import qk_attributions, qk_cost
from circuitlab.graphs.verify import CONFIRMS, N_ABLATED, PREDICTED, Ablation, ablate, head_from_mentions
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


# ---------------------------------------------------------------------------- one prompt's graph, tested


@dataclass
class PromptSpec:
    """A prompt (tokens [pos]) whose next token `target` has a known mechanism; focus: the positions the
    story says the prediction comes from."""

    slug: str
    mechanism: str
    tokens: list[int]             # the document-start token (EOS, as between training documents), then the text
    target: int
    focus: str
    focus_positions: list[int]
    without_context: list[int] | None = None   # name: the last sentence alone (the same final tokens)


def document_start(tokenizer: Any) -> list[int]:
    """The token a document starts after in training (EOS ends every story), or none."""
    eos = getattr(tokenizer, "eos_id", None)
    return [] if eos is None else [eos]


@torch.no_grad()
def target_probability(model: Transformer, tokens: list[int], target: int) -> float:
    """p(target) as the next token after tokens [pos]."""
    return float(model(torch.tensor([tokens]))[0, -1].softmax(-1)[target])


def explain(model: Transformer, tc: Transcoders, tokenizer: Any, spec: PromptSpec, out: Path | None,
            progress: bool = True, dashboard_tokens: int = 0) -> GraphFinding:
    """The graph of spec's target logit, its numbers, and the intervention that tests it; the graph's files
    (graph/, graph.json for Neuronpedia's viewer, graph.svg, report.* with the interactive viewer) in
    out/<slug> when out is given; dashboard_tokens: held-out tokens for the viewer's feature cards."""
    tokens = torch.tensor(spec.tokens)
    prompt = tokenizer.decode(spec.tokens[len(document_start(tokenizer)):])   # the text, without the document start
    target = tokenizer.decode([spec.target])
    graph = attribute(model, tc, tokens, targets=[spec.target], tokenizer=tokenizer, prompt=prompt,
                      progress=progress, verbose=False)
    pruned = graph.prune()   # GraphOptions' thresholds
    with torch.no_grad():
        probs = model(tokens[None])[0, -1].softmax(-1)
    p = float(probs[spec.target])
    rank = int((probs > probs[spec.target]).sum()) + 1
    infl = graph.node_influence()
    tok_infl = infl[graph.token_start:graph.logit_start].clamp(min=0)
    total = float(tok_infl.sum()) or 1.0
    last = graph.n_pos - 1
    focus = sum(float(tok_infl[i]) for i in spec.focus_positions) / total
    share = {"focus": round(focus, 4), "last": round(float(tok_infl[last]) / total, 4)}
    share["other"] = round(max(0.0, 1 - share["focus"] - share["last"]), 4)
    row = normalized(graph.adjacency.double())[graph.logit_start]
    logit_inputs = {"feature": round(float(row[:graph.error_start].sum()), 4),
                    "error": round(float(row[graph.error_start:graph.token_start].sum()), 4),
                    "token": round(float(row[graph.token_start:graph.logit_start].sum()), 4)}
    feat_infl = infl[:graph.n_features]
    order = feat_infl.argsort(descending=True).tolist()
    effects = graph.logit_effects()
    # the intervention's features: those the graph says RAISE the target most (influence ranks |edges|,
    # so its top features can be ones that lower the target)
    top = [i for i in effects.argsort(descending=True).tolist() if effects[i] > 0][:N_ABLATED]
    top_features = [{"label": graph.label(i), "influence": round(float(feat_infl[i]), 4),
                     "effect": round(float(effects[i]), 4),
                     "activation": round(float(graph.feature_activations[i]), 4),
                     **dict(zip(("layer", "pos", "feature"), graph.features[i].tolist()))} for i in order[:8]]
    paths = graph.top_paths(1, pruned)
    ablation = ablate(model, tc, tokens, spec.target, graph, top, tokenizer)
    finding = GraphFinding(
        spec.slug, spec.mechanism, prompt, target, round(p, 4), rank, tokenizer.decode([int(probs.argmax())]),
        {k: round(v, 4) for k, v in graph.scores().items()}, len(graph.active_features),
        {"nodes": int(pruned.node_mask.sum()), "features": int(pruned.node_mask[:graph.n_features].sum()),
         "edges": int(pruned.edge_mask.sum())},
        spec.focus, spec.focus_positions, share, logit_inputs, top_features,
        paths[0]["words"] if paths else "", ablation,
        round(target_probability(model, spec.without_context, spec.target), 4) if spec.without_context else None)
    qk: list[Any] = []
    if spec.mechanism == "name":
        finding.heads, qk = head_from_mentions(model, tc, tokenizer, graph, pruned, spec.focus_positions, tokens)
    cards = (graph_feature_cards(model, tc, graph, pruned, tokenizer, n_tokens=dashboard_tokens)
             if dashboard_tokens else {})
    if out is not None:
        run = GraphResult(graph, pruned, finding.sentences(), {
            "prompt": prompt, "graph": graph.summary(pruned), "finding": finding.to_dict(),
            "top_paths": [{"strength": x["strength"], "words": x["words"]} for x in paths]}, cards=cards, qk=qk)
        finding.files = str(write_graph_run(run, out / spec.slug, spec.slug, overwrite=True))
    setattr(finding, "view", (graph, pruned, cards))   # for report.html's viewer (not a field: not in results.json)
    return finding


@dataclass
class GraphFinding:
    """One prompt's graph in numbers; sentences() says them in words."""

    slug: str
    mechanism: str                # "name" or "phrase"
    prompt: str
    target: str
    p_target: float
    rank: int                     # of the target among the model's predictions (1 = top)
    top_prediction: str
    scores: dict[str, float]      # replacement, completeness
    n_active_features: int
    pruned: dict[str, int]        # nodes, features, edges
    focus: str                    # what the focus positions are ("the earlier mentions of 'Kilomo'")
    focus_positions: list[int]
    token_share: dict[str, float]  # the token nodes' influence on the target: focus, last, other (sum 1)
    logit_inputs: dict[str, float]  # the target logit's direct inputs by kind: feature, error, token (|Â| shares)
    top_features: list[dict[str, Any]]
    top_path: str
    ablation: Ablation
    p_without_context: float | None = None   # name: p(target) with the earlier mentions cut away
    files: str = ""
    heads: dict[str, Any] | None = None      # name: the head carrying the name from its earlier mention, and why

    @property
    def predicted(self) -> bool:
        """Whether the model predicts the target enough for a story about the prediction to be tested."""
        return self.p_target >= PREDICTED

    @property
    def confirmed(self) -> bool | None:
        """Whether the intervention confirms the story; None when it cannot (the target is not predicted)."""
        return self.ablation.confirms if self.predicted else None

    def sentences(self) -> list[str]:
        """The finding in words; each verdict follows from the numbers it states, or says that nothing can be
        concluded from them (tests/methods/test_graph_finding.py turns every number against its verdict)."""
        s, a = self.scores, self.ablation
        out = [f"Prompt {self.prompt!r} → {self.target!r}: the model gives {self.target!r} probability "
               f"{self.p_target:.2f}" + (" (its top prediction)." if self.rank == 1 else
                                          f" (rank {self.rank}; its top prediction is {self.top_prediction!r}).")]
        if self.p_without_context is not None:
            out.append(self._context_sentence())
        out.append(f"The graph has {self.n_active_features} active features; pruned, {self.pruned['features']} "
                   f"feature nodes and {self.pruned['edges']} edges remain. Replacement score "
                   f"{s['replacement']:.2f}, completeness {s['completeness']:.2f}: "
                   f"{_replacement_verdict(s['replacement'])}.")
        out.append(self._trace_sentence())
        li = self.logit_inputs
        out.append(f"The logit's direct inputs: {li['feature']:.0%} from features, {li['error']:.0%} from error "
                   f"nodes, {li['token']:.0%} straight from token embeddings (through attention).")
        if self.top_path:
            out.append(f"Strongest path: {self.top_path}.")
        zeroed = "" if a.p_zeroed is None else f"; zeroing them instead gives {a.p_zeroed:.2f}"
        # 'still' only when the intervention left the model's top prediction where it was
        still = "still" if a.top_after == self.top_prediction else "now"
        out.append(f"Intervention: steering the {len(a.features)} features the graph says raise {self.target!r} "
                   f"most ({', '.join(a.features)}) to {a.scale:g}x their activation moves p({self.target!r}) "
                   f"from {a.p_before:.2f} to {a.p_replacement:.2f} in the replacement model and to "
                   f"{a.p_model:.2f} in the real model (attention free; {still} predicting {a.top_after!r}){zeroed}; "
                   f"steering {len(a.control)} other active features at the same layers and positions the same "
                   f"way gives {a.p_control:.2f}. {self._intervention_verdict()}")
        return out

    def _not_predicted(self) -> str:
        return (f"the model gives {self.target!r} only {self.p_target:.2f} (less than {PREDICTED:g}), so there is "
                "no prediction to explain")

    def _context_sentence(self) -> str:
        """p(target) from the last sentence alone against p with the earlier mentions."""
        p, alone = self.p_target, self.p_without_context
        assert alone is not None  # said only for prompts that measured it
        head = f"Without the earlier mentions (the last sentence alone) it gives {alone:.2f}: "
        if not self.predicted:
            return head + f"nothing can be concluded about copying: {self._not_predicted()}."
        if alone < 0.5 * p:
            return head + (f"the context raises p({self.target!r}) from {alone:.2f} to {p:.2f}, so the prediction "
                           "comes from the context, not from the name's first piece alone.")
        if alone >= p:
            return head + ("the name's first piece predicts it at least as well alone, so this prompt does not "
                           "test copying from earlier.")
        return head + ("the context raises it less than twofold, so this prompt does not clearly test copying "
                       "from earlier.")

    def _trace_sentence(self) -> str:
        """Where the token nodes' influence on the target comes from: the focus positions, the last token, the rest."""
        focus, last, other = self.token_share["focus"], self.token_share["last"], self.token_share["other"]
        lead = (f"{self.focus[0].upper()}{self.focus[1:]} (positions {_positions(self.focus_positions)}) hold "
                f"{focus:.0%} of the token nodes' influence on {self.target!r}, the last token {last:.0%}")
        if not self.predicted:
            return lead + f"; nothing can be concluded about the prediction: {self._not_predicted()}."
        if self.mechanism == "name":
            most = f", though other positions hold more ({other:.0%})" if other > max(focus, last) else ""
            if focus > last:
                return lead + (": the graph traces more of the prediction to the earlier mention than to the last "
                               f"token{most}.")
            if last > focus:
                return lead + (": the graph traces more of the prediction to the last token than to the earlier "
                               f"mention{most}.")
            return lead + f": the earlier mention and the last token hold equal shares{most}."
        if focus + last > 0.5:
            return lead + ": the graph traces the prediction to the phrase itself."
        if focus + last < 0.5:
            return lead + ": most of the influence comes from outside the phrase."
        return lead + ": half of the influence comes from the phrase, half from outside it."

    def _intervention_verdict(self) -> str:
        a = self.ablation
        if not self.predicted:
            return f"Nothing can be concluded from it: {self._not_predicted()}."
        if a.confirms:
            control = (f"the control raises it" if a.control_drop < 0 else f"the control removes {a.control_drop:.0%}")
            return (f"This confirms that these features carry the prediction: they remove {a.drop:.0%} of "
                    f"p({self.target!r}), {control}.")
        if a.drop <= 0:
            return (f"This does not confirm the story: the intervention does not lower p({self.target!r}); "
                    f"{_carrier(self.logit_inputs)}.")
        if a.drop < CONFIRMS:
            return (f"This does not confirm the story: the intervention removes only {a.drop:.0%} of "
                    f"p({self.target!r}) (confirming takes {CONFIRMS:.0%}); {_carrier(self.logit_inputs)}.")
        return (f"This does not confirm the story: steering as many other active features at the same places removes "
                f"{a.control_drop:.0%} of p({self.target!r}), more than half of the {a.drop:.0%} these remove, so "
                "the graph did not single these out.")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ablation"] = {**asdict(self.ablation), "drop": round(self.ablation.drop, 4),
                         "control_drop": round(self.ablation.control_drop, 4), "confirms": self.confirmed}
        d["sentences"] = self.sentences()
        return d


def _carrier(logit_inputs: dict[str, float]) -> str:
    """What carries a prediction that survives a feature intervention: the largest kind of the logit's input."""
    kind = max(("token", "error", "feature"), key=lambda k: logit_inputs[k])
    share = f"{logit_inputs[kind]:.0%} of the logit's direct input"
    return {"token": f"{share} comes straight from the token embeddings through attention, which steering "
                     "features does not remove",
            "error": f"{share} comes from the error nodes, what the transcoders miss",
            "feature": f"the largest share of the logit's direct input, {logit_inputs[kind]:.0%}, comes from "
                       "features"}[kind]


def _replacement_verdict(replacement: float) -> str:
    """Who carries the influence by the replacement score (the share that does not pass through error nodes)."""
    if replacement > 0.5:
        return "the transcoders' features explain most of the influence"
    if replacement < 0.5:
        return ("the error nodes (what the transcoders miss) carry most of the influence, so the features "
                "tell only part of the story")
    return "the features and the error nodes carry equal shares of the influence"


def _positions(pos: list[int]) -> str:
    return ", ".join(str(p) for p in pos)
