"""The tuned lens: recovers an exact linear map, beats the logit lens on trained and imported models,
saves and loads beside the model, and reads out like the logit lens."""
import json

import pytest
import torch
from pretrained.test_importer import make_hf
from tiny_trained import induction_model, repeated_batch

from circuitlab import CircuitlabError
from circuitlab.analysis.lens import logit_lens
from circuitlab.analysis.lens.tuned import (TunedLens, compare_lenses, mean_kl_to_final, story_batches,
                                            train_tuned_lens)
from circuitlab.data import CharTokenizer
from circuitlab.forge import Forge, ResidualLayout
from circuitlab.pretrained import load_pretrained

pytestmark = pytest.mark.usefixtures("one_thread")


def test_translators_recover_an_exact_linear_map():
    # Sequences of one token: each V-only head attends to its own position, so layer l maps the residual
    # x to x (I + M_l) exactly. The final residual is x_embed (I + M0)(I + M1) = x_L0 (I + M1): the
    # translators that make the lens exact are those matrices (identifiable: W_U has full row rank).
    d, vocab = 4, 12
    g = torch.Generator().manual_seed(0)
    M0, M1 = 0.5 * torch.randn(d, d, generator=g), 0.5 * torch.randn(d, d, generator=g)
    f = Forge(ResidualLayout({"x": d}), n_layers=2, n_heads=1, d_head=d, use_attn_out=False, d_vocab=vocab, n_ctx=1)
    for t in range(vocab):
        f.embed(t, x=torch.randn(d, generator=g))
        f.unembed(t, x=torch.randn(d, generator=g))
    f.head(0).v("x", M0, into="x")
    f.head(1).v("x", M1, into="x")
    tokens = torch.arange(vocab)[:, None]
    lens = train_tuned_lens(f.model, tokens, steps=1000, lr=0.1)
    eye = torch.eye(d)
    assert torch.allclose(lens.weight[0].detach(), (eye + M0) @ (eye + M1), atol=2e-2)
    assert torch.allclose(lens.weight[1].detach(), eye + M1, atol=2e-2)
    assert lens.bias.detach().abs().max() < 2e-2
    assert mean_kl_to_final(f.model, tokens, lens)[:-1].max() < 1e-4 < mean_kl_to_final(f.model, tokens)[:-1].min()


def _check_beats_logit_lens(model, train, held):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lens = train_tuned_lens(model, train, steps=150)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    tuned, logit = mean_kl_to_final(model, held, lens), mean_kl_to_final(model, held)
    assert (tuned[:-1] < logit[:-1]).all(), (tuned, logit)
    assert tuned[-1] == logit[-1] == 0
    return lens


def test_tuned_lens_beats_the_logit_lens_on_a_trained_model(tmp_path):
    model = induction_model()
    gen = torch.Generator().manual_seed(0)
    lens = _check_beats_logit_lens(model, [repeated_batch(32, gen) for _ in range(4)], repeated_batch(64, gen))
    lens.save(tmp_path / "lens")
    again = TunedLens.load(tmp_path / "lens", model)
    assert torch.equal(again.weight, lens.weight) and again.train_info["steps"] == 150
    seq = repeated_batch(1, gen)[0]
    both = compare_lenses(model, seq, again, tokenizer=CharTokenizer("abcdefghijklmnopqrstuvw"))
    plain = logit_lens(model, seq)
    assert torch.equal(both.logit.top_tokens, plain.top_tokens)
    assert both.tuned.labels == ["embed", "L0", "L1"] and both.tuned.top_strs is not None
    assert torch.equal(both.tuned.top_tokens[-1], both.logit.top_tokens[-1])  # the last point is the output
    d = json.loads(json.dumps(both.to_dict()))
    assert d["tuned"]["name"] == "tuned lens" and len(d["mean_kl"]["tuned"]) == 3
    assert "tuned lens KL" in both.table() and "<pre>" in both._repr_html_()


@pytest.mark.parametrize("case", ["gpt2-tied", pytest.param("llama-gqa3", marks=pytest.mark.slow)])
def test_tuned_lens_beats_the_logit_lens_on_an_imported_model(tmp_path, case):
    make_hf(case, tmp_path)
    model, _ = load_pretrained(tmp_path, tokenizer=False)
    gen = torch.Generator().manual_seed(0)
    _check_beats_logit_lens(model, [torch.randint(0, 97, (16, 24), generator=gen) for _ in range(4)],
                            torch.randint(0, 97, (32, 24), generator=gen))


def test_built_in_data_and_bad_inputs(tmp_path):
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,!?'\"\n")
    batches = story_batches(tok, n_batches=2, batch_size=3, seq_len=10)
    assert len(batches) == 2 and batches[0].shape == (3, 10) and int(batches[0].max()) <= tok.eos_id
    model = induction_model()
    with pytest.raises(CircuitlabError, match="steps must be"):
        train_tuned_lens(model, batches, steps=0)
    with pytest.raises(CircuitlabError, match="no token batches"):
        train_tuned_lens(model, [], steps=1)
    with pytest.raises(CircuitlabError, match="holds no tuned lens"):
        TunedLens.load(tmp_path)
    wrong = TunedLens(["embed", "L0", "L1", "L2"], 32)
    with pytest.raises(CircuitlabError, match="trained for 3 layers"):
        compare_lenses(model, repeated_batch(1, torch.Generator())[0], wrong)


def _killed_at_step(monkeypatch, step):
    """The training's read-outs (two a step: the final one, then the translated points) raise at step `step`
    (1-based), as if the process were killed there."""
    from circuitlab.analysis.lens import tuned

    calls = {"n": 0}

    def read(model, resid, real=tuned._lens_log_probs):
        calls["n"] += 1
        if calls["n"] == 2 * step - 1:
            raise KeyboardInterrupt
        return real(model, resid)
    monkeypatch.setattr(tuned, "_lens_log_probs", read)


def test_training_resumes_where_it_stopped(tmp_path, monkeypatch):
    model = induction_model()
    gen = torch.Generator().manual_seed(1)
    batches = [repeated_batch(8, gen) for _ in range(3)]
    whole = train_tuned_lens(model, batches, steps=10)
    state = tmp_path / "state.safetensors"
    with pytest.raises(KeyboardInterrupt), monkeypatch.context() as m:
        _killed_at_step(m, 7)
        train_tuned_lens(model, batches, steps=10, state_file=state, save_every=4)
    assert state.is_file()  # written after step 4; steps 5 and 6 are lost and redone
    resumed = train_tuned_lens(model, batches, steps=10, state_file=state, save_every=4)
    assert torch.allclose(resumed.weight, whole.weight, atol=1e-6) and torch.allclose(resumed.bias, whole.bias, atol=1e-6)
    assert resumed.train_info["first_loss"] == pytest.approx(whole.train_info["first_loss"])
    with pytest.raises(CircuitlabError, match=r"with other settings: steps \(10 -> 20\)"):
        train_tuned_lens(model, batches, steps=20, state_file=state)


def test_each_batch_runs_the_model_once_and_the_lens_is_todays(monkeypatch):
    """The residual stream of each distinct batch is computed once and reused at its later steps: the lens is bit
    for bit the one a forward pass a step gives (today's training), on a trained model and an imported one."""
    from circuitlab.analysis.lens import tuned

    gen = torch.Generator().manual_seed(3)
    batches = [repeated_batch(4, gen) for _ in range(3)]
    model = induction_model()
    runs = {"n": 0}

    def counted(model, tokens, real=tuned._residual_stream):
        runs["n"] += 1
        return real(model, tokens)
    monkeypatch.setattr(tuned, "_residual_stream", counted)
    cached = train_tuned_lens(model, batches, steps=8)
    assert runs["n"] == len(batches)   # one forward pass per distinct batch, not one per step

    class Recomputed(tuned.ResidualCache):   # today's: every step runs the model again
        def __init__(self, model, batches):
            super().__init__(model, batches)
            self.keep = False
    monkeypatch.setattr(tuned, "ResidualCache", Recomputed)
    runs["n"] = 0
    today = train_tuned_lens(model, batches, steps=8)
    assert runs["n"] == 8
    assert torch.equal(cached.weight, today.weight) and torch.equal(cached.bias, today.bias)
    assert cached.train_info == today.train_info


def test_the_least_squares_start_is_the_least_squares_map():
    """init="lstsq": each translator is the least-squares affine map from its point to the last residual at unit
    RMS (float64 lstsq on the same tokens as the reference), and a bad init is refused in one line."""
    from circuitlab.analysis.lens.tuned import ResidualCache, _model_info, _residual_stream, fit_lstsq

    model = induction_model()
    gen = torch.Generator().manual_seed(4)
    batches = [repeated_batch(16, gen) for _ in range(2)]
    lens = TunedLens(["embed"] + [f"L{l}" for l in range(model.cfg.n_layers)], model.cfg.d_model, _model_info(model))
    fit_lstsq(lens, ResidualCache(model, batches), len(batches), ridge=0.0)
    resid = torch.cat([_residual_stream(model, b)[1] for b in batches], dim=1).double()   # [point, batch, pos, d]
    d = model.cfg.d_model
    h = resid[-1].reshape(-1, d)
    target = h / h.pow(2).mean(-1, keepdim=True).sqrt()
    for i in range(len(lens.labels) - 1):
        x = resid[i].reshape(-1, d)
        ref = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1), target).solution
        ref = ref * x.pow(2).mean(-1).sqrt().mean()   # scaled to the point's mean RMS
        assert torch.allclose(lens.weight[i].double(), ref[:d], atol=1e-4)
        assert torch.allclose(lens.bias[i].double(), ref[d], atol=1e-4)
    fit_lstsq(lens, ResidualCache(model, batches), len(batches))   # the default ridge: what training starts from
    started = train_tuned_lens(model, batches, steps=1, lr=1e-12, init="lstsq")   # one step of a vanishing lr
    assert torch.allclose(started.weight, lens.weight, atol=1e-5) and started.train_info["init"] == "lstsq"
    with pytest.raises(CircuitlabError, match="init must be one of identity, lstsq"):
        train_tuned_lens(model, batches, steps=1, init="zeros")
