"""A graph's story tested (graphs/verify.py) against truth: the planted path model (exact transcoders, float64),
where each p(target) an intervention gives is known by construction. Token "A" at position 1 turns on the early
feature (activation 1, writes mid = 2); the one head of layer 1 attends uniformly over the 7 positions and
carries mid / 7 to the last; the late feature reads 4 x that (activation 8/7) and writes "out"; the logit of
"Z" is 5 x out, of "y" 1, of the three other tokens 0. Decoys fire at the same places but reach no logit.
The graphs demo's own graphs are checked in tests/experiments/test_graphs_demo.py."""
import math

import pytest

from circuitlab.graphs import attribute
from circuitlab.graphs.planted import VOCAB, PlantedTokenizer, planted_path_model
from circuitlab.graphs.verify import CONFIRMS, N_ABLATED, STEER, Ablation, ablate, head_from_mentions

pytestmark = pytest.mark.usefixtures("one_thread")

Z = VOCAB.index("Z")


def p_z(logit_z: float) -> float:
    """p("Z") when its logit is logit_z, "y"'s 1 and the other three tokens' 0."""
    return math.exp(logit_z) / (math.exp(logit_z) + math.e + 3)


@pytest.fixture(scope="module")
def planted():
    p = planted_path_model()
    graph = attribute(p.model, p.transcoders, p.tokens, targets=[Z], progress=False, verbose=False)
    return p, graph


def raisers(graph):
    effects = graph.logit_effects()
    return [i for i in effects.argsort(descending=True).tolist() if effects[i] > 0][:N_ABLATED]


def test_steering_the_planted_path_removes_the_prediction_and_the_control_does_not(planted):
    p, graph = planted
    nodes = raisers(graph)
    assert [graph.label(i).rsplit(" ", 1)[0] for i in nodes] == ["L0 F0 @1", "L1 F0 @6"]   # the planted path
    a = ablate(p.model, p.transcoders, p.tokens, Z, graph, nodes, PlantedTokenizer())
    assert a.features == ["L0 F0 @1", "L1 F0 @6"] and a.scale == STEER
    assert a.p_before == round(p_z(5 * 8 / 7), 4)
    # the early feature reversed turns the late one off (its pre-activation -8/7, through the ReLU), and the
    # late one steered to -1 x 0 stays off: "out" is 0 in the replacement model, the real model, and zeroed
    assert a.p_replacement == a.p_model == a.p_zeroed == round(p_z(0.0), 4)
    assert a.top_after == "y"
    # the control: as many other active features at the same (layer, position) places, none of the chosen
    assert len(a.control) == len(a.features) and not set(a.control) & set(a.features)
    places = {(x.split()[0], x.split()[2]) for x in a.features}
    assert {(x.split()[0], x.split()[2]) for x in a.control} <= places
    assert a.p_control == a.p_before                  # decoys reach no logit
    assert a.drop == pytest.approx(1 - p_z(0.0) / p_z(40 / 7), abs=1e-3) and a.drop >= CONFIRMS
    assert a.control_drop == 0.0 and a.confirms
    again = ablate(p.model, p.transcoders, p.tokens, Z, graph, nodes, PlantedTokenizer())
    assert again == a                                 # the control's draw is seeded


def test_steering_scales_the_feature_where_it_stands(planted):
    """The late feature alone to -1x: out = -8/7, the logit of Z -40/7 (its sign reversed, not zeroed)."""
    p, graph = planted
    late = [i for i in raisers(graph) if graph.label(i).startswith("L1 F0 @6")]
    a = ablate(p.model, p.transcoders, p.tokens, Z, graph, late, PlantedTokenizer())
    assert a.p_replacement == a.p_model == round(p_z(-40 / 7), 4)
    assert a.p_zeroed == round(p_z(0.0), 4)
    half = ablate(p.model, p.transcoders, p.tokens, Z, graph, late, PlantedTokenizer(), scale=0.5)
    assert half.scale == 0.5 and half.p_model == round(p_z(20 / 7), 4)


def test_confirms_needs_the_drop_and_a_quiet_control():
    assert Ablation(["a"], 0.8, 0.1, 0.4, 0.8).confirms                       # removes half, the control nothing
    assert not Ablation(["a"], 0.8, 0.1, 0.41, 0.8).confirms                  # removes less than half
    assert not Ablation(["a"], 0.8, 0.1, 0.1, 0.4).confirms                   # the control removes as much
    assert Ablation(["a"], 0.0, 0.0, 0.0, 0.0).drop == 0.0                    # nothing to remove: no drop


def test_the_head_that_carried_the_mention_and_its_qk(planted):
    p, graph = planted
    pruned = graph.prune()
    heads, qk = head_from_mentions(p.model, p.transcoders, PlantedTokenizer(), graph, pruned, [1], p.tokens)
    assert graph.loadings is not None                 # kept with the graph's files
    assert (heads["layer"], heads["head"], heads["query_pos"], heads["key_pos"]) == (1, 0, 6, 1)
    # the early feature's edge to the late one (8/7) is all on the one head of layer 1
    assert heads["edge"] == pytest.approx(8 / 7, abs=1e-9) and heads["loading"] == pytest.approx(8 / 7, abs=1e-9)
    assert len(qk) == 1 and heads["qk"]["layer"] == 1 and heads["qk"]["key_pos"] == 1
    assert heads["qk"]["key"]["prob"] == pytest.approx(1 / 7, abs=1e-9)    # uniform attention
    assert heads["words"].startswith("L1H0 carries the most from the earlier mention: L1H0 carries L0 F0 @1")
    assert "with weight 0.14 (rank 1)" in heads["words"]
    # from "B" at position 3 nothing crosses: the decoy there writes what no head reads
    assert head_from_mentions(p.model, p.transcoders, PlantedTokenizer(), graph, pruned, [3], p.tokens) == (None, [])
