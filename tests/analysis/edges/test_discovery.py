"""Circuit discovery on a trained model: the demo's 2-layer attention-only recipe, shortened to its segments-only
phase (induction heads form by step ~350), then the induction circuit found by EAP-IG and checked against the
heads that the previous-token and induction scores name."""
import pytest

from circuitlab.analysis.heads import classify_heads
from circuitlab.analysis.edges import find_circuit, induction_rows
from circuitlab.names import head_name


def check_induction_circuit(model):
    """The circuits of the built-in induction task (EAP-IG) on a 2-layer attention-only model with induction heads:
    faithful, small, and made of the heads the behavioural scores name."""
    scores = classify_heads(model).scores
    previous = head_name(0, int(scores["previous_token"][0].argmax()))  # layer 0's best previous-token head
    induction = [head_name(1, h) for h in range(model.cfg.n_heads) if scores["induction"][1, h] >= 0.3]
    assert induction, scores["induction"]

    # the whole circuit: nothing repeats in the corrupted rows
    result = find_circuit(model, induction_rows(model.cfg.d_vocab), "logit-diff", "eap-ig", progress=False)
    circuit, n = result.circuit, result.scores.graph.n_edges
    assert result.circuit_faithfulness >= 0.9, result.summary()
    assert circuit.n_edges <= 0.3 * n, result.summary()  # a small part of the 81 edges
    for head in induction:  # each induction head: its key from the previous-token head (K-composition), its query
        assert circuit.contains(previous, f"{head}.k"), (head, circuit.edge_list())  # and value from the input
        assert circuit.contains("input", f"{head}.q") and circuit.contains("input", f"{head}.v"), head
        assert circuit.contains(head, "logits")
    assert circuit.contains("input", f"{previous}.v")  # the previous-token head reads the tokens

    # only the first copy corrupted: the circuit is the K-composition path alone
    first = find_circuit(model, induction_rows(model.cfg.d_vocab, corruption="first-copy"), "logit-diff", "eap-ig",
                         progress=False)
    assert first.circuit_faithfulness >= 0.9, first.summary()
    assert {r.rsplit(".", 1)[-1] for _, r in first.circuit.edge_list()} <= {"k", "v", "logits"}  # no query edge
    assert all(first.circuit.contains(previous, f"{h}.k") for h in induction)
    return result, first


@pytest.mark.slow
def test_demo_model_induction_circuit_has_k_composition(tmp_path):
    """The demo recipe's first 500 steps (random segments only): 267 s on the shared 2-core machine at a load
    average of ~5, 31 min at ~12 (idle not measured). Numbers measured on the full demo: docs/circuits.md."""
    from circuitlab.training import RunConfig, train
    from circuitlab.training.config_files import resolve_config

    cfg = RunConfig.load(resolve_config("demo"), ["train.seed=0", "train.steps=500", "train.ckpt_every=500"])
    assert cfg.data.segment_only_steps >= 500  # random segments only: the phase where induction forms
    check_induction_circuit(train(cfg, tmp_path / "2l", progress=False).model.eval())
