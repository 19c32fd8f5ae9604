"""A graph's story tested: by intervention (ablate), and, for a prediction copied from earlier positions,
the head that carried it and why (head_from_mentions).

    ablation = ablate(model, transcoders, tokens, target, graph, nodes, tokenizer)   # nodes: feature node indices
    ablation.confirms          # the steered features removed p(target); as many others at their places did not

The intervention steers the chosen features to STEER x their activation (each one's contribution reversed)
in the replacement model and in the real model (attention free), beside a control that steers as many
other active features at the same layers and positions the same way (and, for reference, the chosen ones
zeroed). methods/graph.py's explain() chooses the features the graph says raise the target most.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.graphs.attribution_graph import Graph, Pruned
from circuitlab.graphs.heads import head_loadings, strongest_heads
from circuitlab.graphs.qk import QKAttribution, qk_attribution
from circuitlab.graphs.replacement import Intervention, ReplacementModel
from circuitlab.graphs.transcoders import Transcoders

if TYPE_CHECKING:
    from circuitlab.model import Transformer

N_ABLATED = 10         # features steered by each graph's intervention (those the graph says raise the logit most)
STEER = -1.0           # ...to this multiple of their activation: each one's contribution reversed
CONFIRMS = 0.5         # the intervention confirms the story when it removes at least this share of p(target)...
CONTROL_AT_MOST = 0.5  # ...and the control removes at most this share of what the intervention removed
PREDICTED = 0.05       # below this p(target) the model does not predict the target: no story about it can be tested

Place = tuple[int, int, int]   # (layer, pos, feature), a row of Graph.features


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


def ablate(model: Transformer, tc: Transcoders, tokens: torch.Tensor, target: int, graph: Graph, nodes: list[int],
           tokenizer: Any, scale: float = STEER) -> Ablation:
    """Steer the feature nodes `nodes` of graph (tokens [pos]) to scale x their activation at their positions:
    p(target) in the replacement model and the real model (attention free); the same with as many other active
    features at the same (layer, position) pairs (seeded: a control at the very places the graph points to);
    and the chosen features zeroed in the real model."""
    rm = ReplacementModel(model, tc, tokens)

    def edit(rows: Sequence[Place], value: float | None = None, scale: float | None = None) -> list[Intervention]:
        return [Intervention(layer=l, feature=f, pos=p, value=value, scale=scale) for l, p, f in rows]

    def p_of(logits: torch.Tensor) -> float:   # logits [1, pos, d_vocab]
        return float(logits[0, -1].softmax(-1)[target])

    chosen: list[Place] = [_place(graph.features[i].tolist()) for i in nodes]
    taken, places = set(chosen), {(c[0], c[1]) for c in chosen}
    others = [r for r in map(_place, graph.active_features.tolist()) if r not in taken and (r[0], r[1]) in places]
    control = random.Random(0).sample(others, min(len(chosen), len(others)))
    base = rm.run()
    replaced = rm.run(edit(chosen, scale=scale))
    real = rm.run(edit(chosen, scale=scale), mode="model", freeze_attention=False)
    ctrl = rm.run(edit(control, scale=scale), mode="model", freeze_attention=False)
    zeroed = rm.run(edit(chosen, value=0.0), mode="model", freeze_attention=False)
    return Ablation([_label(r) for r in chosen], round(p_of(base.logits), 4), round(p_of(replaced.logits), 4),
                    round(p_of(real.logits), 4), round(p_of(ctrl.logits), 4), [_label(r) for r in control],
                    tokenizer.decode([int(real.logits[0, -1].argmax())]), scale, round(p_of(zeroed.logits), 4))


def _place(row: list[int]) -> Place:
    return (row[0], row[1], row[2])


def _label(r: Place) -> str:
    return f"L{r[0]} F{r[2]} @{r[1]}"


def head_from_mentions(model: Transformer, tc: Transcoders, tokenizer: Any, graph: Graph, pruned: Pruned,
                       mentions: Sequence[int], tokens: torch.Tensor
                       ) -> tuple[dict[str, Any] | None, list[QKAttribution]]:
    """The head that carries the most influence from the earlier mentions (positions) to the last position
    (head loadings of the pruned graph, set on graph.loadings and so kept in its files) and its QK attribution
    there (tokens [pos]): which query and key parts made it attend to the earlier mention. (None, []) when no
    pruned edge crosses from a mention."""
    graph.loadings = head_loadings(model, tc, graph, pruned)
    last = graph.n_pos - 1
    found = [h for h in strongest_heads(graph, 50) if h["query_pos"] == last and h["key_pos"] in mentions]
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
