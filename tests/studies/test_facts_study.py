"""The facts study: its facts (one-token answers, checked), the pipeline on a tiny model, every verdict against the
numbers that would make it false, and on SmolLM2: the facts it knows (fast), and causal tracing whose restored
probabilities lie between the corrupted and the clean ones (slow)."""
import copy

import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.studies import facts as facts_study
from circuitlab.analysis.patching.causal_tracing import CATEGORIES
from circuitlab.studies.facts import FactsOptions, facts_claims, one_token_facts, recall, run_facts
from circuitlab.studies.facts_data import FACTS
from helpers import random_model
from word_tokenizer import WordTokenizer as FactsTokenizer

def test_at_least_thirty_facts_and_a_split_answer_is_left_out():
    tok = FactsTokenizer()
    kept, dropped = one_token_facts(tok)
    assert len(FACTS) >= 30 and len(kept) == len(FACTS) and not dropped
    tok.encode = lambda text, enc=tok.encode: enc(text) + ([0] if text == " Paris" else [])
    kept, dropped = one_token_facts(tok)
    assert all(f["answer"] != "Paris" for f in kept) and dropped[0] == "Paris (2 tokens)"
    for f in kept:   # every subject is words of its prompt
        assert f["subject"] in f["prompt"]


def test_the_pipeline_on_a_tiny_model(monkeypatch, tmp_path):
    """A random model knows no fact: the study says so, its claims undecided; told it knows them all, it traces them and writes every
    kind's average by token group, the per-fact numbers, the claims, the markdown and the figures."""
    tok = FactsTokenizer()
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=tok.vocab_size, n_ctx=64,
                      norm="rmsnorm", positional="rotary", mlp="swiglu", d_mlp=64)
    model = random_model(cfg, scale=2.0)
    monkeypatch.setattr(facts_study, "recall", lambda m, t, facts: [{**f, "known": False, "prob": 0.0, "top": "x"}
                                                                    for f in facts])
    nothing = run_facts(model, tok, FactsOptions(facts=2), progress=False)
    assert nothing.numbers["traced"] == 0 and all(c.holds is None for c in nothing.claims)
    assert "gets none of the" in nothing.claims[0].verdict and facts_study.facts_figures(nothing) == {}
    monkeypatch.setattr(facts_study, "recall", lambda m, t, facts: [{**f, "known": True, "prob": 0.5, "top": "x"}
                                                                    for f in recall(m, t, facts)])
    result = run_facts(model, tok, FactsOptions(facts=3, noise_samples=2), progress=False)
    n = result.numbers
    assert n["traced"] == 3 and len(n["facts"]) == 3 and n["known"] == len(FACTS)
    for kind in ("hidden", "mlp", "attn", "hidden_no_mlp"):
        grid = n["average"]["values"][kind]
        assert len(grid) == cfg.n_layers and len(grid[0]) == len(n["average"]["categories"])
    for row in n["facts"]:   # restoring the last layer's state at the last token gives the clean run back
        assert row["hidden_last"] == pytest.approx(row["clean"], abs=1e-6)
    assert len(result.claims) == 5
    figs = facts_study.facts_figures(result)
    assert set(figs) == {"tracing", "severed_mlp"} and len(figs["tracing"].panels) == 3
    assert any("The facts traced" in line for line in facts_study.facts_markdown(result))


def _numbers(L=30):
    """Numbers as run_facts writes them, made up so that every claim holds."""
    cats = list(CATEGORIES)
    zero = [[0.0] * len(cats) for _ in range(L)]

    def grid(cells):
        g = copy.deepcopy(zero)
        for (layer, cat), v in cells.items():
            g[layer][cats.index(cat)] = v
        return g

    hidden = grid({(8, "last subject token"): 0.3, (25, "last token"): 0.5})
    severed = grid({(8, "last subject token"): 0.05, (25, "last token"): 0.5})
    avg = {"categories": cats, "total_effect": 0.6,
           "values": {"hidden": hidden, "mlp": grid({(10, "last subject token"): 0.2}),
                      "attn": grid({(22, "last token"): 0.3}), "hidden_no_mlp": severed},
           "peaks": {"mlp": {"layer": 10, "category": "last subject token", "effect": 0.2, "share": 0.33},
                     "attn": {"layer": 22, "category": "last token", "effect": 0.3, "share": 0.5}}}
    return {"traced": 40, "clean_mean": 0.62, "corrupted_mean": 0.02, "average": avg}


def test_every_verdict_turns_with_its_numbers():
    n = _numbers()
    assert [c.holds for c in facts_claims(n, 30)] == [True] * 5
    bad = copy.deepcopy(n)
    bad["corrupted_mean"] = 0.5   # the corruption leaves most of the recall
    assert facts_claims(bad, 30)[0].holds is False
    bad = copy.deepcopy(n)
    bad["average"]["peaks"]["mlp"]["category"] = "last token"   # the MLPs peak elsewhere
    assert facts_claims(bad, 30)[1].holds is False
    bad = copy.deepcopy(n)
    bad["average"]["peaks"]["mlp"]["layer"] = 27   # too late
    assert facts_claims(bad, 30)[1].holds is False
    bad = copy.deepcopy(n)
    bad["average"]["peaks"]["attn"]["layer"] = 5   # before the MLPs
    assert facts_claims(bad, 30)[2].holds is False
    bad = copy.deepcopy(n)
    bad["average"]["values"]["hidden"][8][2] = 0.05   # no early site at the last subject token
    assert facts_claims(bad, 30)[3].holds is False
    bad = copy.deepcopy(n)
    bad["average"]["values"]["hidden_no_mlp"] = copy.deepcopy(bad["average"]["values"]["hidden"])   # severing: no change
    said = facts_claims(bad, 30)[4]
    assert said.holds is False and "100%" in said.verdict
    bad["average"]["values"]["hidden"] = [[0.0] * 6 for _ in range(30)]   # nothing to take away
    assert facts_claims(bad, 30)[4].holds is None


def test_smollm2_knows_at_least_thirty_of_the_facts(smollm2):
    """Fast on the real model: every answer but few is one token in SmolLM2's tokenizer, and it gets >= 30 right."""
    model, tok = smollm2
    single, _ = one_token_facts(tok)
    known = [f for f in recall(model, tok, single) if f["known"]]
    assert len(single) >= len(FACTS) - 3 and len(known) >= 30
    assert any(f["answer"] == "Paris" for f in known)


@pytest.mark.slow
def test_smollm2_restored_probabilities_lie_between_corrupted_and_clean(smollm2):
    """Causal tracing of SmolLM2's facts: corrupting the subject lowers the answer's probability; restoring the last
    layer's state at the last token gives it back exactly; and each kind's average restoration, at every layer and
    token group, lies between the corrupted and the clean probability."""
    model, tok = smollm2
    result = run_facts(model, tok, FactsOptions(facts=4, noise_samples=1), progress=False)
    n = result.numbers
    for row in n["facts"]:
        assert row["corrupted"] < row["clean"]
        assert row["hidden_last"] == pytest.approx(row["clean"], abs=1e-5)
    ate = n["average"]["total_effect"]
    assert ate == pytest.approx(n["clean_mean"] - n["corrupted_mean"], abs=1e-6) and ate > 0
    for kind, grid in n["average"]["values"].items():
        cells = torch.tensor([[float("nan") if v is None else v for v in row] for row in grid])
        cells = cells[~cells.isnan()]
        assert float(cells.min()) >= -0.05 * ate and float(cells.max()) <= ate * 1.05, kind
