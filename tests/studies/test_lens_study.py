"""The lens study: its data (real text held out by document, or a file's last tenth), the pipeline on a tiny model,
every verdict against the numbers that would make it false, and on SmolLM2 the tuned lens's held-out KL below the
logit lens's at every depth (fast: the least-squares start and one step; slow: the study's training)."""
import copy

import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.data import build_tokenizer
from circuitlab.studies import lens as lens_study
from circuitlab.studies.lens import LensStudyOptions, lens_claims, lens_data, run_lens
from helpers import random_model


def _tiny():
    tok = build_tokenizer("byte")
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=tok.vocab_size, n_ctx=64, norm="rmsnorm",
                      positional="rotary", mlp="swiglu", d_mlp=32)
    return random_model(cfg, scale=1.0), tok


def test_the_data_is_held_out_real_text_or_a_files_last_tenth(tmp_path):
    _, tok = _tiny()
    train, held = lens_data(tok, LensStudyOptions(train_sequences=6, step_sequences=2, held_out_sequences=4), 16)
    assert len(train) == 3 and train[0].shape == (2, 16) and len(held) == 1 and held[0].shape == (4, 16)
    from circuitlab.data.realtext import pyref_documents
    assert tok.decode(held[0][0].tolist()) in "\n".join(pyref_documents("val"))   # the held-out topics
    text = tmp_path / "mine.txt"
    text.write_text("a" * 900 + "b" * 100)
    train, held = lens_data(tok, LensStudyOptions(text=str(text), train_sequences=4, held_out_sequences=4), 16)
    assert set(tok.decode(held[0].flatten().tolist())) == {"b"} and "b" not in tok.decode(train[0].flatten().tolist())
    from circuitlab.errors import CircuitlabError
    with pytest.raises(CircuitlabError, match="held-out text holds 100 tokens"):
        lens_data(tok, LensStudyOptions(text=str(text), train_sequences=4, held_out_sequences=8), 16)


def test_the_pipeline_on_a_tiny_model():
    model, tok = _tiny()
    opts = LensStudyOptions(train_sequences=4, held_out_sequences=4, lens_seq_len=16, lens_steps=3)
    result = run_lens(model, tok, opts, progress=False)
    n = result.numbers
    assert n["labels"] == ["embed", "L0"] and len(n["logit"]["kl"]) == len(n["tuned"]["top1"]) == 2
    assert all(0 <= x <= 1 for x in n["logit"]["top1"] + n["tuned"]["top1"])
    assert result.setup["train_tokens"] == 64 and result.setup["held_out_tokens"] == 64 and len(result.claims) == 3
    assert set(lens_study.lens_figures(result)) == {"lenses"}
    assert any(line.startswith("| L0 |") for line in lens_study.lens_markdown(result))


def _numbers():
    labels = ["embed"] + [f"L{l}" for l in range(5)]
    return {"labels": labels, "logit": {"kl": [9.0, 8.0, 6.0, 3.0, 2.0, 1.0], "top1": [0.0, 0.1, 0.2, 0.4, 0.6, 0.8]},
            "tuned": {"kl": [2.0, 1.5, 1.0, 0.8, 0.5, 0.2], "top1": [0.2, 0.3, 0.4, 0.6, 0.7, 0.9]}}


def test_every_verdict_turns_with_its_numbers():
    n = _numbers()
    assert [c.holds for c in lens_claims(n)] == [True, True, True]
    bad = copy.deepcopy(n)
    bad["logit"]["kl"] = [1.0, 1.0, 2.0, 3.0, 2.0, 1.0]   # the logit lens does not approach the final distribution
    assert lens_claims(bad)[0].holds is False
    bad = copy.deepcopy(n)
    bad["tuned"]["kl"][4] = 2.5   # worse than the logit lens at one layer
    said = lens_claims(bad)[1]
    assert said.holds is False and "not at L3" in said.verdict
    bad = copy.deepcopy(n)
    bad["tuned"]["top1"] = [0.0] * 6
    assert lens_claims(bad)[2].holds is False
    bad = copy.deepcopy(n)
    bad["logit"]["kl"][:2] = [0.0, 0.0]
    assert lens_claims(bad)[0].holds is None


def test_smollm2_least_squares_lens_is_below_the_logit_lens_on_held_out_text(smollm2):
    """Fast on the real model: the least-squares start and one Adam step on 1,024 tokens of the Language Reference
    already read every layer of SmolLM2 closer to its final distribution than the logit lens, on held-out topics."""
    from circuitlab.analysis.lens.tuned import held_out_agreement, train_tuned_lens

    model, tok = smollm2
    train, held = lens_data(tok, LensStudyOptions(train_sequences=32, step_sequences=4, held_out_sequences=2), 32)
    lens = train_tuned_lens(model, train, steps=1, lr=1e-3, init="lstsq")
    found = held_out_agreement(model, held[0][:2], {"logit": None, "tuned": lens})
    logit, tuned = found["logit"]["kl"][:-1], found["tuned"]["kl"][:-1]
    assert (tuned < logit).all(), (tuned, logit)
    assert found["logit"]["kl"][-1] == found["tuned"]["kl"][-1] == 0 and found["tuned"]["top1"][-1] == 1


@pytest.mark.slow
def test_smollm2_lens_study_tuned_lens_beats_the_logit_lens(smollm2):
    model, tok = smollm2
    opts = LensStudyOptions(train_sequences=32, held_out_sequences=4, lens_steps=10)
    result = run_lens(model, tok, opts, progress=False)
    n = result.numbers
    assert all(b < a for a, b in zip(n["logit"]["kl"], n["tuned"]["kl"])), n
    assert sum(n["tuned"]["top1"]) > sum(n["logit"]["top1"])
    assert result.claims[1].holds is True
