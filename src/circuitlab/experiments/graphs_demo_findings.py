"""One graph of the graphs demo, explained and tested: the prompts whose next token has a known mechanism,
explain() (the graph, its numbers, the intervention that tests its story) and the finding in words.

    spec = name_prompt(model, tokenizer, n_names=12)        # or phrase_prompt(tokenizer, slug, text)
    finding = explain(model, transcoders, tokenizer, spec, out=Path("runs/graphs/graphs"))
    finding.sentences()                                     # each verdict from the numbers it states

The intervention: the features the graph says raise the predicted token's logit most (Graph.logit_effects:
signed, through later features) are steered to -1x their activation, in the replacement model and in the real
model (attention free), beside a control that steers as many other active features at the same layers and
positions the same way (and, for reference, the same features zeroed). experiments/graphs_demo.py runs it.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.errors import InputError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

N_ABLATED = 10         # features steered by each graph's intervention (those the graph says raise the logit most)
STEER = -1.0           # ...to this multiple of their activation: each one's contribution reversed
CONFIRMS = 0.5         # the intervention confirms the story when it removes at least this share of p(target)...
CONTROL_AT_MOST = 0.5  # ...and the control removes at most this share of what the intervention removed
PREDICTED = 0.05       # below this p(target) the model does not predict the target: no story about it can be tested
NAME_TEMPLATE = ("Once upon a time, there was a little girl named {name}. {name} liked to play in the park "
                 "every day. One day, {name}")
PHRASES = (("once-upon-a-time", "Once upon a time"),
           ("best-friends", "Once upon a time, there was a boy named Tom. Tom had a friend named Bo. "
                            "From that day on, Tom and Bo were best friends"))


@dataclass
class Ablation:
    """One intervention: features steered to `scale` x their activation at their positions and p(target)
    before and after, in the replacement model and in the real model (attention free), with a control of as
    many other active features at the same layers and positions; p_zeroed: the same features zeroed instead."""

    features: list[str]
    p_before: float
    p_replacement: float
    p_model: float
    p_control: float
    control: list[str] = field(default_factory=list)
    top_after: str = ""           # the real model's top prediction after the intervention
    scale: float = STEER
    p_zeroed: float | None = None

    @property
    def drop(self) -> float:
        """Share of p(target) the intervention removes in the real model."""
        return 1 - self.p_model / self.p_before if self.p_before > 0 else 0.0

    @property
    def control_drop(self) -> float:
        return 1 - self.p_control / self.p_before if self.p_before > 0 else 0.0

    @property
    def confirms(self) -> bool:
        return self.drop >= CONFIRMS and self.control_drop <= CONTROL_AT_MOST * self.drop


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
        concluded from them (tests/experiments/test_graphs_demo.py turns every number against its verdict)."""
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


# ---------------------------------------------------------------------------- prompts


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


def name_prompt(model: Transformer, tokenizer, n_names: int, seed: int = 0) -> PromptSpec:
    from circuitlab.data.stories import make_name

    rng = random.Random(f"graphs-demo-names:{seed}")
    best, best_p = None, -1.0
    tried = 0
    while tried < n_names and tried < 1000:
        name = make_name(rng)
        while len(name) < 6:  # three syllables: several tokens
            name = make_name(rng)
        tried += 1
        spec = _name_spec(tokenizer, name)
        if spec is None or len(spec.tokens) + 1 > model.cfg.n_ctx:
            continue
        # the name the model completes FROM THE STORY: p with the earlier mentions minus p from the last
        # sentence alone (a name whose first piece predicts the rest by itself would tell no copying story)
        p = _probability(model, spec.tokens, spec.target)
        if spec.without_context is not None:
            p -= _probability(model, spec.without_context, spec.target)
        if p > best_p:
            best, best_p = spec, p
    if best is None:
        raise InputError("no made-up name splits into several tokens the same way at every mention")
    return best


def _doc_start(tokenizer) -> list[int]:
    """The token a document starts after in training (EOS ends every story), or none."""
    eos = getattr(tokenizer, "eos_id", None)
    return [] if eos is None else [eos]


def _name_spec(tokenizer, name: str) -> PromptSpec | None:
    """The name template cut before the last mention's final token; None when the name is one token at the
    end or is split differently at its mentions."""
    text = NAME_TEMPLATE.format(name=name)
    ids = tokenizer.encode(text)
    head = tokenizer.encode(text[:-len(name) - 1])
    if ids[:len(head)] != head:
        return None
    piece = ids[len(head):]               # the last mention's tokens
    if len(piece) < 2 or tokenizer.decode(piece).strip() != name:
        return None
    earlier = [i for i in range(len(head) - len(piece) + 1) if ids[i:i + len(piece)] == piece]
    if len(earlier) < 2:
        return None
    start = _doc_start(tokenizer)
    focus = [len(start) + i + j for i in earlier for j in range(len(piece))]
    alone = tokenizer.encode("One day," + text[-len(name) - 1:])
    return PromptSpec("name", "name", start + ids[:-1], ids[-1], f"the earlier mentions of {name!r}", focus,
                      start + alone[:-1] if alone[-len(piece):] == piece else None)


def phrase_prompt(tokenizer, slug: str, text: str) -> PromptSpec:
    ids = tokenizer.encode(text)
    phrase = text.rsplit(". ", 1)[-1]      # the phrase: the last sentence
    start = len(tokenizer.encode(text[:-len(phrase)])) if phrase != text else 0
    words = tokenizer.decode(ids[start:-2])
    doc = _doc_start(tokenizer)
    return PromptSpec(slug, "phrase", doc + ids[:-1], ids[-1], f"the phrase's earlier words {words.strip()!r}",
                      [len(doc) + i for i in range(start, len(ids) - 2)])   # the phrase before its last prompt token


@torch.no_grad()
def _probability(model: Transformer, tokens: list[int], target: int) -> float:
    return float(model(torch.tensor([tokens]))[0, -1].softmax(-1)[target])


# ---------------------------------------------------------------------------- one graph


def explain(model: Transformer, tc, tokenizer, spec: PromptSpec, out: Path | None, progress: bool = True,
            dashboard_tokens: int = 0) -> GraphFinding:
    """The graph of spec's target logit, its numbers, and the intervention that tests it; the graph's files
    (graph/, graph.json for Neuronpedia's viewer, graph.svg, report.* with the interactive viewer) in
    out/<slug> when out is given; dashboard_tokens: held-out tokens for the viewer's feature cards."""
    from circuitlab.methods.graph import GraphResult, graph_feature_cards, write_graph_run
    from circuitlab.graphs import attribute
    from circuitlab.graphs.attribution_graph import normalized

    tokens = torch.tensor(spec.tokens)
    prompt = tokenizer.decode(spec.tokens[len(_doc_start(tokenizer)):])   # the text, without the document start
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
        round(_probability(model, spec.without_context, spec.target), 4) if spec.without_context else None)
    qk: list[Any] = []
    if spec.mechanism == "name":
        finding.heads, qk = name_heads(model, tc, tokenizer, graph, pruned, spec, tokens)
    cards = (graph_feature_cards(model, tc, graph, pruned, tokenizer, n_tokens=dashboard_tokens)
             if dashboard_tokens else {})
    if out is not None:
        run = GraphResult(graph, pruned, finding.sentences(), {
            "prompt": prompt, "graph": graph.summary(pruned), "finding": finding.to_dict(),
            "top_paths": [{"strength": x["strength"], "words": x["words"]} for x in paths]}, cards=cards, qk=qk)
        finding.files = str(write_graph_run(run, out / spec.slug, spec.slug, overwrite=True))
    setattr(finding, "view", (graph, pruned, cards))   # for report.html's viewer (not a field: not in results.json)
    return finding


def name_heads(model: Transformer, tc, tokenizer, graph, pruned, spec: PromptSpec, tokens: torch.Tensor
               ) -> tuple[dict[str, Any] | None, list[Any]]:
    """The head that carries the most influence from the name's earlier mentions to the last position (head
    loadings of the pruned graph, kept in its files) and its QK attribution there: which query and key parts
    made it attend to the earlier mention. (None, []) when no pruned edge crosses from a mention."""
    from circuitlab.graphs.heads import head_loadings, strongest_heads
    from circuitlab.graphs.qk import qk_attribution

    graph.loadings = head_loadings(model, tc, graph, pruned)
    last = graph.n_pos - 1
    found = [h for h in strongest_heads(graph, 50) if h["query_pos"] == last and h["key_pos"] in spec.focus_positions]
    if not found:
        return None, []
    h = found[0]
    qk = qk_attribution(model, tc, tokens, h["layer"], h["head"], last, h["key_pos"], tokenizer=tokenizer)
    soft = qk.key_softmax()
    words = (f"L{h['layer']}H{h['head']} carries the most from the earlier mention: {h['words']}. It attends "
             f"from the last position to {qk.key_token} @{h['key_pos']} with weight {soft['prob']:.2f} (rank "
             f"{soft['rank']}); its score there {qk.score:+.3g} comes most from "
             + "; ".join(p["words"] for p in qk.top_pairs(2)) + ".")
    return {"layer": h["layer"], "head": h["head"], "query_pos": last, "key_pos": h["key_pos"],
            "loading": h["loading"], "edge": h["edge"], "qk": qk.to_dict(5), "words": words}, [qk]


def ablate(model: Transformer, tc, tokens: torch.Tensor, target: int, graph, nodes: list[int], tokenizer,
           scale: float = STEER) -> Ablation:
    """Steer the feature nodes `nodes` to scale x their activation at their positions: p(target) in the
    replacement model and the real model (attention free); the same with as many other active features at
    the same (layer, position) pairs (seeded: a control at the very places the graph points to); and the
    chosen features zeroed in the real model."""
    from circuitlab.graphs import Intervention, ReplacementModel

    rm = ReplacementModel(model, tc, tokens)

    def edit(rows: list[tuple[int, int, int]], **how: float) -> list[Intervention]:
        return [Intervention(layer=l, feature=f, pos=p, **how) for l, p, f in rows]

    def p_of(logits: torch.Tensor) -> float:
        return float(logits[0, -1].softmax(-1)[target])

    chosen = [tuple(graph.features[i].tolist()) for i in nodes]
    taken, places = set(chosen), {(c[0], c[1]) for c in chosen}
    others = [tuple(r) for r in graph.active_features.tolist() if tuple(r) not in taken and (r[0], r[1]) in places]
    control = random.Random(0).sample(others, min(len(chosen), len(others)))
    base = rm.run()
    replaced = rm.run(edit(chosen, scale=scale))
    real = rm.run(edit(chosen, scale=scale), mode="model", freeze_attention=False)
    ctrl = rm.run(edit(control, scale=scale), mode="model", freeze_attention=False)
    zeroed = rm.run(edit(chosen, value=0.0), mode="model", freeze_attention=False)
    label = lambda r: f"L{r[0]} F{r[2]} @{r[1]}"  # noqa: E731
    return Ablation([label(r) for r in chosen], round(p_of(base.logits), 4), round(p_of(replaced.logits), 4),
                    round(p_of(real.logits), 4), round(p_of(ctrl.logits), 4), [label(r) for r in control],
                    tokenizer.decode([int(real.logits[0, -1].argmax())]), scale, round(p_of(zeroed.logits), 4))
