"""Edge graph, EAP / EAP-IG / exact edge patching, circuits and faithfulness, checked against definitions
(patching an edge by hand with hooks, float64) and against circuits known by construction (forge).

(Split out of the flat test_edges module, issue 38.)"""
import pytest

from circuitlab import CircuitlabError
from circuitlab.analysis.edges import EdgeGraph

from analysis.edges.test_scoring import SMALL, CONFIGS  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_graph_counts_and_names():
    g = EdgeGraph.of(CONFIGS["attn-only"])
    # 9 writers; readers: 2 layers x 12 (q, k, v of 4 heads) + logits = 25; edges: layer 0 reads the input
    # (12), layer 1 reads input + 4 heads (12 x 5), logits read all 9 writers
    assert (len(g.sources), len(g.readers), g.n_edges) == (9, 25, 12 + 60 + 9)
    assert g.edges[0] == ("input", "L0H0.q") and g.edges[-1] == ("L1H3", "logits")
    gpt = EdgeGraph.of(CONFIGS["gpt2"])
    assert gpt.allowed[gpt.sources.index("L0H2"), gpt.readers.index("MLP0.in")]  # a head feeds its layer's MLP
    par = EdgeGraph.of(CONFIGS["parallel"])
    assert not par.allowed[par.sources.index("L0H2"), par.readers.index("MLP0.in")]  # not when parallel
    gqa = EdgeGraph.of(CONFIGS["llama-gqa"])
    assert "L1KV1.k" in gqa.readers and "L1H1.k" not in gqa.readers  # keys and values per kv head
    with pytest.raises(CircuitlabError, match="comes later"):
        gpt.edge_index("L1H0", "L0H0.q")
