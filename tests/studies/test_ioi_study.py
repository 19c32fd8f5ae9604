"""The IOI study: its prompts (one token per name, checked; ABBA and BABA), path patching to the logits against
frozen hooks in float64, per-position mean ablation, the pipeline on a tiny model, every verdict against the
numbers that would make it false, and SmolLM2's circuit (slow)."""
import copy
import os
from pathlib import Path

import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.model.hooks import act_name
from circuitlab.studies.ioi import MOST, IOIOptions, ioi_claims, make_prompts, one_token_names, run_ioi
from helpers import random_model
from word_tokenizer import WordTokenizer


def _model(vocab: int, dtype=torch.float32):
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_vocab=vocab, n_ctx=64, norm="rmsnorm",
                      positional="rotary", mlp="swiglu", d_mlp=64)
    return random_model(cfg, scale=2.0).to(dtype)


def test_prompts_are_one_length_with_one_token_names_in_both_orders():
    tok = WordTokenizer()
    p = make_prompts(tok, IOIOptions(prompts=10))
    assert p["tokens"].shape == p["corrupt_tokens"].shape and p["tokens"].shape[0] == 10
    assert p["order"].count("ABBA") == p["order"].count("BABA") == 5
    for ids, io, s, at, order in zip(p["tokens"].tolist(), p["io"], p["s"], p["positions"], p["order"]):
        assert ids[at["IO"]] == io and ids[at["S1"]] == s == ids[at["S2"]] and at["S1"] < at["S2"]
        assert (at["IO"] < at["S1"]) == (order == "ABBA")
    for corrupt, io, s in zip(p["corrupt_tokens"].tolist(), p["io"], p["s"]):
        assert io not in corrupt and s not in corrupt   # the ABC prompts hold three other names
    # a tokenizer that splits a name leaves it out, and says so
    split = WordTokenizer()
    split.encode = lambda text, enc=split.encode: enc(text) + ([0] if text == " Mary" else [])
    assert "Mary" not in one_token_names(split) and "Mary" in one_token_names(tok)


def test_path_patching_to_the_logits_is_the_frozen_run_of_its_definition():
    """Each head's corrupted output with every other head's z and every MLP frozen clean (hooks, float64): the
    same number as the one-readout shortcut; leaving the MLPs free (a mutation) gives another."""
    from circuitlab.analysis.patching import logit_diff
    from circuitlab.analysis.patching.path import path_patching_to_logits

    tok = WordTokenizer()
    model = _model(tok.vocab_size, torch.float64)
    p = make_prompts(tok, IOIOptions(prompts=4))
    clean, corrupt = p["tokens"], p["corrupt_tokens"]
    metric = logit_diff(torch.tensor(p["io"]), torch.tensor(p["s"]))
    fast = path_patching_to_logits(model, clean, corrupt, metric)
    _, c_cache = model.run_with_cache(clean)
    _, x_cache = model.run_with_cache(corrupt)
    L = model.cfg.n_layers

    def frozen(layer, head, freeze_mlps=True):
        def z_hook(act, hook):
            l = int(hook.name.split(".")[1])
            new = c_cache[hook.name].clone()
            if l == layer:
                new[:, :, head] = x_cache[hook.name][:, :, head]
            return new
        hooks = [(act_name("z", l), z_hook) for l in range(L)]
        if freeze_mlps:
            hooks += [(act_name("mlp_out", l), lambda act, hook: c_cache[hook.name]) for l in range(L)]
        with torch.no_grad():
            return float(metric(model.run_with_hooks(clean, fwd_hooks=hooks)))

    for layer, head in [(0, 1), (1, 3), (2, 0)]:
        assert fast.values[layer, head].item() == pytest.approx(frozen(layer, head), abs=1e-9)
    assert abs(fast.values[0, 1].item() - frozen(0, 1, freeze_mlps=False)) > 1e-6
    with torch.no_grad():
        assert fast.clean_value == pytest.approx(float(metric(model(clean))), abs=1e-9)


def test_mean_by_pos_ablation_sets_each_position_to_its_reference_mean():
    from circuitlab.analysis.ablation import run_ablated

    tok = WordTokenizer()
    model = _model(tok.vocab_size, torch.float64)
    p = make_prompts(tok, IOIOptions(prompts=4))
    ref = p["corrupt_tokens"]
    _, cache = model.run_with_cache(ref)
    mean = cache["z", 1].mean(0)   # [pos, head, d_head]

    def naive(act, hook):
        act = act.clone()
        act[:, :, 2] = mean[:, 2]
        return act
    with torch.no_grad():
        want = model.run_with_hooks(p["tokens"], fwd_hooks=[(act_name("z", 1), naive)])
    got = run_ablated(model, p["tokens"], ["L1H2"], "mean_by_pos", ref)
    assert torch.allclose(got, want, atol=1e-10)
    assert not torch.allclose(got, run_ablated(model, p["tokens"], ["L1H2"], "mean", ref), atol=1e-6)
    with pytest.raises(Exception, match="needs 16 positions|needs"):
        run_ablated(model, p["tokens"], ["L1H2"], "mean_by_pos", ref[:, :-1])


def test_the_study_runs_end_to_end_on_a_tiny_model(one_thread):
    tok = WordTokenizer()
    found = run_ioi(_model(tok.vocab_size), tok, IOIOptions(prompts=6, circuit_size=3), progress=False)
    n = found.numbers
    assert len(found.claims) == 6 and len(found.setup["prompts"]) == 6
    assert len(n["total_effect"]) == 3 and len(n["direct"]["values"][0]) == 4
    assert set(n["attention"]) == set(n["circuit"])
    for a in n["attention"].values():
        assert 0 <= a["IO"] <= 1 and a["IO"] + a["S1"] + a["S2"] <= 1 + 1e-6
    si = n["s_inhibition"]
    if si is not None:   # senders of earlier layers whose path into the name mover's query lowers the difference
        layer = int(si["receiver"][1:].split("H")[0])
        assert all(int(x["head"][1:].split("H")[0]) < layer and x["effect"] < 0 for x in si["senders"])
    f = n["faithfulness"]
    assert f["heads_ablated_outside"] == 12 - len(n["circuit"])
    assert f["circuit_share"] == pytest.approx(f["circuit_logit_diff"] / n["logit_diff"], abs=1e-3)


def _numbers():
    return {"logit_diff": 3.0, "accuracy": 1.0,
            "direct": {"lowers": [{"head": "L9H1", "effect": -1.2}], "raises": [{"head": "L10H7", "effect": 0.6}]},
            "attention": {"L9H1": {"IO": 0.6, "S1": 0.1, "S2": 0.1}},
            "circuit": ["L9H1", "L10H7", "L7H3"],
            "s_inhibition": {"receiver": "L9H1", "clean_value": 3.0,
                             "senders": [{"head": "L7H3", "effect": -0.6}, {"head": "L8H6", "effect": -0.3}]},
            "faithfulness": {"circuit_logit_diff": 2.4, "complement_logit_diff": 0.3, "circuit_share": 0.8,
                             "complement_share": 0.1, "heads_ablated_outside": 267}}


def test_each_verdict_follows_its_numbers_and_turns_with_them():
    claims = ioi_claims(_numbers())
    assert [c.holds for c in claims] == [True, True, True, True, True, True]
    assert "IO's logit above S's on 100% of the prompts" in claims[0].verdict
    assert "lowers the logit difference by 1.20 (40% of 3.00)" in claims[1].verdict
    assert "attends IO 0.60, S1 0.10, S2 0.10: more to IO than to either S" in claims[1].verdict
    assert "raises the logit difference by 0.60 (20% of 3.00)" in claims[2].verdict
    assert "corrupting L7H3's path into L9H1's query lowers the logit difference by 0.60 (20% of 3.00); next: L8H6 " \
        "-0.30." in claims[3].verdict
    assert "80% of 3.00" in claims[4].verdict and "10% of 3.00: the rest does not keep most" in claims[5].verdict

    def turned(**edits):
        n = copy.deepcopy(_numbers())
        for path, value in edits.items():
            *keys, last = path.split("__")
            d = n
            for k in keys:
                d = d[k]
            d[last] = value
        return ioi_claims(n)
    assert turned(accuracy=0.8)[0].holds is False
    assert turned(attention__L9H1={"IO": 0.1, "S1": 0.5, "S2": 0.2})[1].holds is False
    # a weaker name mover that does attend IO carries the claim; the verdict names the strongest too
    second = copy.deepcopy(_numbers())
    second["direct"]["lowers"].append({"head": "L8H0", "effect": -0.9})
    second["attention"].update(L9H1={"IO": 0.05, "S1": 0.04, "S2": 0.65}, L8H0={"IO": 0.66, "S1": 0.1, "S2": 0.1})
    text = ioi_claims(second)[1]
    assert text.holds is True and "L8H0's direct path lowers the logit difference by 0.90 (30% of 3.00)" in \
        text.verdict and "The strongest direct path, L9H1 (1.20), attends IO 0.05, S1 0.04, S2 0.65." in text.verdict
    second["direct"]["lowers"][1]["effect"] = -0.2   # below 10%: no longer a name mover
    assert ioi_claims(second)[1].holds is False
    assert turned(direct__lowers=[{"head": "L9H1", "effect": -0.2}])[1].holds is False
    assert turned(direct__raises=[{"head": "L10H7", "effect": 0.1}])[2].holds is False
    assert turned(s_inhibition__senders=[{"head": "L7H3", "effect": -0.1}])[3].holds is False
    assert turned(s_inhibition__senders=[])[3].holds is False
    assert turned(s_inhibition=None)[3].holds is None
    assert turned(faithfulness__circuit_share=MOST - 0.01)[4].holds is False
    assert turned(faithfulness__complement_share=MOST)[5].holds is False
    assert "so the circuit is not needed" in turned(faithfulness__complement_share=0.7)[5].verdict
    # no preference for IO: nothing else can be said
    none = turned(logit_diff=-0.5)
    assert none[0].holds is False and all(c.holds is None for c in none[1:])




@pytest.mark.slow
def test_smollm2s_ioi_circuit_keeps_most_of_the_logit_difference_and_its_complement_does_not(smollm2):
    model, tok = smollm2  # the built-in real model, imported once per session (tests/conftest.py)
    found = run_ioi(model, tok, IOIOptions(prompts=8), progress=False)
    f = found.numbers["faithfulness"]
    assert found.numbers["logit_diff"] > 0
    assert f["circuit_share"] >= MOST > f["complement_share"]
