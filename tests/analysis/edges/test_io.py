"""Edge graph, EAP / EAP-IG / exact edge patching, circuits and faithfulness, checked against definitions
(patching an edge by hand with hooks, float64) and against circuits known by construction (forge).

(Split out of the flat test_edges module, issue 38.)"""
import json

import pytest
import torch

from circuitlab.analysis.edges import edge_scores, select_circuit
from circuitlab.analysis.edges.io import load_circuit, load_mib, load_scores, save_circuit, save_mib, save_scores
from circuitlab.analysis.patching import kl_to_clean

from analysis.edges.test_scoring import SMALL, CONFIGS, model_of, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_scores_and_circuits_round_trip(tmp_path):
    model = model_of("gpt2")
    clean, corrupt = prompts()
    scores = edge_scores(model, clean, corrupt, kl_to_clean(model(clean)), method="eap-ig", progress=False)
    save_scores(scores, tmp_path / "s.json")
    back = load_scores(tmp_path / "s.json")
    assert back.graph.edges == scores.graph.edges and torch.allclose(back.scores, scores.scores, atol=1e-8)
    circuit = select_circuit(scores, n=12)
    save_circuit(circuit, tmp_path / "c.json")
    assert torch.equal(load_circuit(tmp_path / "c.json").edges, circuit.edges)
    save_mib(scores, tmp_path / "mib.json", circuit)
    data = json.loads((tmp_path / "mib.json").read_text())
    assert data["edges"]["input->a0.h1<k>"]["score"] == pytest.approx(scores.score("input", "L0H1.k"))
    assert data["edges"]["m0->logits"]["in_graph"] == circuit.contains("MLP0", "logits")
    mib_scores, flags = load_mib(tmp_path / "mib.json", scores.graph)
    assert torch.allclose(mib_scores, scores.scores) and torch.equal(flags, circuit.edges)
