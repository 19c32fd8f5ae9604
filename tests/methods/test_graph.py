"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Split out of the flat test_graphs module, issue 38.)"""
import pytest

from circuitlab.errors import CircuitlabError
from circuitlab.graphs import logit_difference
from circuitlab.graphs.planted import planted_path_model

from graphs.test_attribution import random_transcoder, setup  # noqa: F401 (shared with it)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_foil_equal_to_the_target_is_refused_before_any_work(setup, tmp_path, monkeypatch):
    """logit[X] - logit[X] is zero: no graph explains it (the CLI case is in test_output_policy)."""
    from circuitlab.data.tokenizers import CharTokenizer
    import circuitlab.methods.graph as experiment

    model, tc, tokens, graph = setup
    with pytest.raises(CircuitlabError, match="is the target"):
        logit_difference(None, 3, 3, 50)
    monkeypatch.setattr(experiment, "attribute", lambda *a, **k: pytest.fail("attributed a refused graph"))
    tok = CharTokenizer.from_texts(["abcdefghijklmnopqrstuvwxyz"])
    with pytest.raises(CircuitlabError, match="the foil 'a' is the target"):
        experiment.graph_experiment(model, tc, "abc", tok, out=tmp_path / "g", target="a", foil="a", progress=False)
    assert not (tmp_path / "g").exists()


def test_an_interrupted_write_leaves_no_graph_folder(tmp_path, monkeypatch):
    import circuitlab.methods.graph as experiment
    from circuitlab.graphs.planted import PlantedTokenizer

    def interrupted(run):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "_markdown", interrupted)
    p = planted_path_model()
    with pytest.raises(KeyboardInterrupt):
        experiment.graph_experiment(p.model, p.transcoders, "xAxBxyx", PlantedTokenizer(), out=tmp_path / "g",
                                    progress=False)
    assert not (tmp_path / "g" / "results.json").exists() and not (tmp_path / "g" / "graph").exists()
