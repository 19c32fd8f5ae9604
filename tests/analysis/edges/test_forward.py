"""Edge graph, EAP / EAP-IG / exact edge patching, circuits and faithfulness, checked against definitions
(patching an edge by hand with hooks, float64) and against circuits known by construction (forge).

(Split out of the flat test_edges module, issue 38.)"""
import pytest
import torch

from circuitlab.analysis.edges import EdgeGraph, graph_forward

from analysis.edges.test_scoring import SMALL, CONFIGS, model_of, prompts  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_graph_forward_is_the_model(name):
    model = model_of(name)
    clean, _ = prompts()
    with torch.no_grad():
        assert torch.allclose(graph_forward(model, EdgeGraph.of(model), clean).logits[0], model(clean), atol=1e-10)
