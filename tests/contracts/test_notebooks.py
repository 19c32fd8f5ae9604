"""The tutorial notebooks: stored without outputs, their first cells run (fast), and each runs top to
bottom in a real kernel with its key numbers checked (slow: `make test-slow`)."""
import json
import os
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def load(name: str):
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def code_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_six_tutorials_exist_and_are_stored_without_outputs():
    assert NAMES == ["01_induction_heads_from_scratch.ipynb", "02_transformer_by_hand.ipynb",
                     "03_attention_heads_are_additive.ipynb", "04_toolbox_on_one_model.ipynb",
                     "05_attribution_graphs_of_a_trained_model.ipynb", "06_studies_of_a_real_model.ipynb"]
    for name in NAMES:
        nb = load(name)
        nbformat.validate(nb)
        ids = [cell.get("id") for cell in json.loads((NOTEBOOKS / name).read_text())["cells"]]  # as stored
        assert None not in ids and len(set(ids)) == len(ids), f"{name}: every cell needs its own id"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs not stripped"
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


@pytest.mark.parametrize("name", NAMES)
def test_first_cells_run(name, monkeypatch, tmp_path):
    """The set-up cells (imports, configs, the first cheap steps) in this process: a fast smoke run that
    fails when an import or an API the notebook uses has moved. Stops before any training."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    ran = 0
    for source in code_cells(load(name)):
        if "train(" in source or "train_addition_model(" in source or ran == 3:
            break
        exec(compile(source, f"{name}:cell{ran}", "exec"), namespace)  # noqa: S102 - our own notebook
        ran += 1
    assert ran >= 1 and "results" in namespace


def execute(name: str, tmp_path) -> dict:
    """Run a notebook in a fresh kernel (cwd tmp_path); returns the RESULTS dict its last cell prints."""
    from nbclient import NotebookClient

    nb = load(name)
    env_path = os.environ.get("PYTHONPATH", "")
    src = str(NOTEBOOKS.parent / "src")
    os.environ["PYTHONPATH"] = src + (os.pathsep + env_path if env_path else "")  # the kernel imports this tree
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                       ).execute()
    finally:
        os.environ["PYTHONPATH"] = env_path
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    line = next(line for line in text.splitlines() if line.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


@pytest.mark.slow
def test_induction_heads_notebook(tmp_path):
    r = execute("01_induction_heads_from_scratch.ipynb", tmp_path)
    assert r["induction_score_2l"] > 0.5 > r["induction_score_1l"]
    assert r["phase_change_step"] is not None
    assert r["copying_induction_head"] > 0.5 and r["patching_recovery_induction_heads"] > 0.5
    assert r["mean_induction_score_over_periods"] > 0.4 and r["min_induction_score_over_periods"] > 0.4


@pytest.mark.slow
def test_transformer_by_hand_notebook(tmp_path):
    r = execute("02_transformer_by_hand.ipynb", tmp_path)
    assert r["post_adder_17_25"] == 42 and r["post_adder_correct"] == 10_000
    assert r["carry_adder_99999_1"] == 100_000 and r["carry_12+12_accuracy"] == 1.0
    assert r["trained_adder_accuracy"] > 0.9


@pytest.mark.slow
def test_attention_heads_are_additive_notebook(tmp_path):
    r = execute("03_attention_heads_are_additive.ipynb", tmp_path)
    assert r["concat_vs_sum"] < 1e-10 and r["sum_vs_model"] < 1e-10
    assert r["dla_L1H0"] > 0.5 and r["ablation_L1H0"] > 0.3 and r["ablation_prediction_error"] < 1e-4


@pytest.mark.slow
def test_toolbox_notebook(tmp_path):
    r = execute("04_toolbox_on_one_model.ipynb", tmp_path)
    assert r["folding_logprob_diff"] < 1e-4 and r["dla_sum_error"] < 1e-3 and r["ig_completeness_error"] < 0.01
    assert 0 < r["lens_final_prob_last"] <= 1 and r["probe_prev_token_selectivity"] > 0.05
    assert r["shap_efficiency_gap"] < 1e-3       # the Shapley values add up to the change from every token deleted
    assert r["shap_r2_delete"] > r["shap_r2_mean"]  # deleted characters leave text; mean embeddings do not
    assert r["graph_loading_remainder"] < 1e-4 and r["graph_replacement"] > 0.5   # the graph of the same prediction
    assert r["graph_shap_delete_in_common"] >= 2 and r["graph_top_head_reads_top_token"]
    assert r["eap_gap"] > 0.5 and r["edges_for_80pct"] is not None
    assert r["tuned_lens_kl_below_logit_lens"]
    assert r["sae_explained_variance"] > 0.5 and r["sae_ce_loss_recovered"] > 0.5
    p, loss = r["steer_p_char"], r["steer_loss"]       # coefs 0, 2, 4, 8 along one feature
    assert all(a < b for a, b in zip(p, p[1:])) and p[-1] > 1.5 * p[0], p
    assert loss[-1] > loss[0]                           # steering has a cost, and the cell reports it


@pytest.mark.slow
def test_attribution_graphs_notebook(tmp_path):
    r = execute("05_attribution_graphs_of_a_trained_model.ipynb", tmp_path)
    assert r["ce_loss_recovered"] > 0.8
    assert r["name_p"] > 0.3 and r["name_p_alone"] < 0.5 * r["name_p"]          # copied from the earlier mention
    assert r["name_replacement"] > 0.5 and r["name_completeness"] > 0.7
    assert r["name_focus_share"] > r["name_last_share"]      # the earlier mentions, more than the last token
    assert r["name_p_replacement"] < r["name_p"]          # the graph's raisers steered down lower it where it is exact
    assert r["once_p"] > 0.9 and r["once_replacement"] > 0.5 and r["once_confirms"]   # the memorised phrase: confirmed


@pytest.mark.slow
def test_studies_of_a_real_model_notebook(tmp_path):
    """The induction and IOI studies on SmolLM2 from Python: what the methods guarantee, not what the model does
    (the second copy's loss below the first's is what in-context copying means; shares are of one logit difference)."""
    r = execute("06_studies_of_a_real_model.ipynb", tmp_path)
    assert r["induction_loss_drop"] > 0 and len(r["induction_claims_hold"]) >= 3
    assert 0 <= r["ioi_accuracy"] <= 1 and r["ioi_circuit_share"] is not None
