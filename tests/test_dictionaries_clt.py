"""Cross-layer transcoders: the sparse training step against the dense one (float64), the splice's exact
logits, the field's folder layouts bit for bit, and bad input refused in one line."""
import json
from unittest import mock

import pytest
import torch

from circuitlab.dictionaries import clt_train
from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
from circuitlab.dictionaries.clt_train import CLTCoefficients, clt_training_step
from circuitlab.dictionaries.resample import resample_dead
from circuitlab.dictionaries.sparse_ops import DecodeKept
from circuitlab.errors import CircuitlabError, ConfigError

L, D, N = 3, 10, 24


def _clt(arch: str, tied: bool = False, skip: bool = False, dtype: str = "float64", seed: int = 1) -> CrossLayerTranscoder:
    cfg = CLTConfig(arch, n_layers=L, d_model=D, d_sae=N, k=3 if arch in ("topk", "batchtopk") else None,
                    tied=tied, skip=skip, dtype=dtype)
    clt = CrossLayerTranscoder(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # away from the initialisation: biases, skips, thresholds near the data
        for p in list(clt.b_enc) + list(clt.b_dec):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 - (0.3 if p.shape[0] == N else 0))
        for p in getattr(clt, "W_skip", []):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
        for p in getattr(clt, "threshold", []):
            p.fill_(0.4)
    return clt


def _step(clt, xs, ys, dead, sparse):
    saved = {k: v.clone() for k, v in clt.state_dict().items()}
    clt.zero_grad(set_to_none=True)
    coef = CLTCoefficients(sparsity=0.3, aux=0.5, bandwidth=0.2, threshold_decay=0.5, tanh_scale=2.0, preact=0.1)
    out = clt_training_step(clt, xs, ys, coef, dead, sparse=sparse)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in clt.named_parameters() if p.grad is not None}
    clt.load_state_dict(saved)
    return out, grads


def _data(seed=3, rows=40):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, L, D, generator=g, dtype=torch.float64), torch.randn(rows, L, D, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("tied,skip", [(False, False), (True, True)], ids=["untied", "tied-skip"])
@pytest.mark.parametrize("arch", ["topk", "batchtopk", "jumprelu", "relu"])
def test_sparse_step_is_the_dense_step(arch, tied, skip):
    clt = _clt(arch, tied, skip)
    xs, ys = _data()
    dead = torch.zeros(L * N, dtype=torch.bool)
    dead[::5] = True  # AuxK for the TopK family
    dense, dense_grads = _step(clt, xs, ys, dead, sparse=False)
    sparse, sparse_grads = _step(clt, xs, ys, dead, sparse=True)
    assert 0 < sparse.l0 < N and (arch not in ("topk", "batchtopk") or float(sparse.aux) > 0)
    assert arch in ("topk", "batchtopk") or float(sparse.sparsity) > 0
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=0, atol=1e-10)
    assert torch.equal(sparse.fires, dense.fires)
    assert sparse_grads.keys() == dense_grads.keys() and {"W_enc.0", "W_dec.2", "b_dec.1"} <= set(sparse_grads)
    assert (arch == "jumprelu") == ("threshold.0" in sparse_grads)
    for name in dense_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], rtol=0, atol=1e-9, msg=name)


def test_a_wrong_sparse_decoder_gradient_is_caught():
    """The comparison above can fail: a sparse decoder gradient that drops one kept pair differs from the dense one."""
    clt = _clt("topk")
    xs, ys = _data()
    _, dense_grads = _step(clt, xs, ys, None, sparse=False)
    real = DecodeKept.backward

    def dropping_one(ctx, grad):
        d_values, d_W, _ = real(ctx, grad)
        d_values = d_values.clone()
        d_values[0] = 0.0
        return d_values, d_W, None

    with mock.patch.object(DecodeKept, "backward", staticmethod(dropping_one)):
        _, sparse_grads = _step(clt, xs, ys, None, sparse=True)
    assert max(float((sparse_grads[n] - dense_grads[n]).abs().max()) for n in dense_grads) > 1e-6


@pytest.mark.parametrize("arch", ["jumprelu", "relu"])
def test_the_training_loss_is_the_definition(arch):
    """Dense step in float64 against the formula written out: Σ_layers MSE + λ Σ tanh(c a ‖W_dec‖) (JumpReLU) or
    λ Σ a ‖W_dec‖ (ReLU: L1) + λ_p Σ ReLU(θ − pre) ‖W_dec‖ (ReLU: θ = 0); θ gets no gradient from the last term."""
    clt = _clt(arch)
    xs, ys = _data()
    coef = CLTCoefficients(sparsity=0.3, aux=0.0, bandwidth=0.2, tanh_scale=2.0, preact=0.1)
    out = clt_training_step(clt, xs, ys, coef, None, sparse=False)
    with torch.no_grad():
        y_hat, acts = clt(xs)
        norms = clt.decoder_norms()                                       # [L, N]
        pre = torch.stack([clt.pre_acts(xs[:, l], l) for l in range(L)], 1)
        theta = torch.stack(list(clt.threshold)) if arch == "jumprelu" else torch.zeros(L, N, dtype=xs.dtype)
        penalty = torch.tanh(2.0 * acts * norms) if arch == "jumprelu" else acts * norms
        want = ((y_hat - ys) ** 2).sum((1, 2)).mean() + 0.3 * penalty.sum() / 40 + 0.1 * ((theta - pre).relu() * norms).sum() / 40
    torch.testing.assert_close(out.loss.detach(), want, rtol=1e-12, atol=1e-12)
    if arch == "jumprelu":  # θ's gradient is the sparsity term's alone (straight-through)
        clt.zero_grad(set_to_none=True)
        out.loss.backward()
        with_preact = clt.threshold[0].grad.clone()
        clt.zero_grad(set_to_none=True)
        clt_training_step(clt, xs, ys, CLTCoefficients(**{**vars(coef), "preact": 0.0}), None, sparse=False).loss.backward()
        torch.testing.assert_close(with_preact, clt.threshold[0].grad, rtol=0, atol=0)
    # the output at layer t is Σ_{s ≤ t} W_dec^{s→t} a^s + b^t
    t = 2
    manual = clt.b_dec[t] + sum(acts[:, s] @ clt.decoder(s, t) for s in range(t + 1))
    torch.testing.assert_close(y_hat[:, t], manual)


# ---------------------------------------------------------------------------- formats

@pytest.mark.parametrize("layout,arch,tied,skip", [
    ("circuitlab", "topk", False, True), ("circuitlab", "batchtopk", True, False),
    ("circuit-tracer", "jumprelu", False, True), ("circuit-tracer", "relu", True, False),
    ("sparsify", "topk", False, True), ("sparsify", "topk", True, False)])
def test_round_trip_is_bitwise(tmp_path, layout, arch, tied, skip):
    clt = _clt(arch, tied, skip, dtype="float32").for_inference()
    clt.cfg.base_model = {"name": "m", "config_sha": "abc", "weights_sha": "def", "d_model": D, "n_layers": L}
    clt.save(tmp_path / "c", layout=layout)
    back = CrossLayerTranscoder.load(tmp_path / "c")
    assert back.cfg == clt.cfg
    a, b = clt.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_circuit_tracer_files_have_its_layout(tmp_path):
    clt = _clt("jumprelu", skip=True, dtype="float32")
    clt.save(tmp_path / "ct", layout="circuit-tracer")
    from safetensors.torch import load_file
    import yaml
    for i in range(L):
        enc = load_file(str(tmp_path / "ct" / f"W_enc_{i}.safetensors"))
        assert {k: tuple(v.shape) for k, v in enc.items()} == {f"W_enc_{i}": (N, D), f"b_enc_{i}": (N,), f"b_dec_{i}": (D,),
                                                               f"threshold_{i}": (N,), f"W_skip_{i}": (D, D)}
        assert torch.equal(enc[f"W_enc_{i}"], clt.W_enc[i].detach().T)
        assert torch.equal(enc[f"W_skip_{i}"], clt.W_skip[i].detach())  # no transpose
        dec = load_file(str(tmp_path / "ct" / f"W_dec_{i}.safetensors"))
        assert tuple(dec[f"W_dec_{i}"].shape) == (N, L - i, D)
    meta = yaml.safe_load((tmp_path / "ct" / "config.yaml").read_text())
    assert meta["model_kind"] == "cross_layer_transcoder" and meta["feature_output_hook"] == "hook_mlp_out"
    # a foreign folder (no circuitlab key) loads from its tensors alone, and decodes the same
    meta.pop("circuitlab")
    (tmp_path / "ct" / "config.yaml").write_text(yaml.safe_dump(meta))
    back = CrossLayerTranscoder.load(tmp_path / "ct")
    xs = _data()[0].float()
    torch.testing.assert_close(back(xs)[0], clt(xs)[0], rtol=0, atol=0)


def test_sparsify_sums_biases_and_fills_a_short_reach(tmp_path):
    clt = _clt("topk", dtype="float32")
    clt.save(tmp_path / "sp", layout="sparsify")
    assert sorted(p.name for p in (tmp_path / "sp").iterdir()) == [f"blocks.{i}.mlp" for i in range(L)]
    from safetensors.torch import load_file, save_file
    f = tmp_path / "sp" / "blocks.0.mlp"
    t = load_file(str(f / "sae.safetensors"))
    meta = json.loads((f / "cfg.json").read_text())
    assert meta["n_targets"] == L and tuple(t["W_decs.1"].shape) == (N, D) and tuple(t["encoder.weight"].shape) == (N, D)
    # a foreign sparsify CLT: layer 0 writes only 2 layers ahead, with a bias into layer 1
    for sub in (tmp_path / "sp").iterdir():
        m = json.loads((sub / "cfg.json").read_text())
        m.pop("circuitlab")
        (sub / "cfg.json").write_text(json.dumps(m))
    extra = torch.full((D,), 0.25)
    t["b_decs.1"] = extra
    del t["W_decs.2"], t["b_decs.2"], t["post_encs.2"]
    meta.pop("circuitlab")
    meta["n_targets"] = 2
    save_file(t, str(f / "sae.safetensors"))
    (f / "cfg.json").write_text(json.dumps(meta))
    back = CrossLayerTranscoder.load(tmp_path / "sp")
    assert torch.equal(back.decoder(0, 2), torch.zeros(N, D))
    torch.testing.assert_close(back.b_dec[1], clt.b_dec[1].detach() + extra)


def test_layouts_refuse_what_they_cannot_hold(tmp_path):
    with pytest.raises(CircuitlabError, match="circuit-tracer's CLTs are ReLU or JumpReLU"):
        _clt("topk", dtype="float32").save(tmp_path / "x", layout="circuit-tracer")
    with pytest.raises(CircuitlabError, match="sparsify's CLTs are TopK"):
        _clt("jumprelu", dtype="float32").save(tmp_path / "x", layout="sparsify")
    assert not (tmp_path / "x").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(CircuitlabError, match="holds no CLT"):
        CrossLayerTranscoder.load(tmp_path / "empty")


def test_a_bad_decoder_shape_is_refused_in_one_line(tmp_path):
    clt = _clt("jumprelu", dtype="float32")
    clt.save(tmp_path / "ct", layout="circuit-tracer")
    from safetensors.torch import save_file
    save_file({"W_dec_1": torch.zeros(N, L, D)}, str(tmp_path / "ct" / "W_dec_1.safetensors"))
    with pytest.raises(CircuitlabError, match=r"W_dec_1 has shape \(24, 3, 10\), expected \(24, 2, 10\)") as e:
        CrossLayerTranscoder.load(tmp_path / "ct")
    assert "\n" not in str(e.value)


def test_config_refuses_k_above_d_sae():
    with pytest.raises(ConfigError, match="k=30 is larger than d_sae=24"):
        CLTConfig("topk", n_layers=2, d_model=4, d_sae=24, k=30)


# ---------------------------------------------------------------------------- spliced into a model

@pytest.fixture(scope="module")
def model():
    from circuitlab import ModelConfig
    from helpers import random_model

    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=L, d_model=D * 2, n_heads=4, d_mlp=48, n_ctx=16, d_vocab=50)
    return random_model(cfg, scale=1.0).eval()


def _model_clt(model, arch="jumprelu", skip=True, dtype="float32"):
    from circuitlab.dictionaries import base_model_id

    cfg = CLTConfig(arch, n_layers=L, d_model=model.cfg.d_model, d_sae=N, k=3 if arch == "topk" else None, skip=skip,
                    dtype=dtype, base_model=base_model_id(model, "tiny"))
    clt = CrossLayerTranscoder(cfg, seed=4)
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        for p in list(clt.b_enc) + list(clt.b_dec) + list(getattr(clt, "W_skip", [])):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for p in getattr(clt, "threshold", []):
            p.fill_(0.2)
    return clt


def test_spliced_logits_are_the_models_bit_for_bit(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    clt = _model_clt(model)
    clean, _ = model.run_with_cache(tokens)  # hooked norms take their eager path: compare like with like
    with splice(model, clt) as s:
        logits, cache = model.run_with_cache(tokens)
        acts = cache[s.name(clt, "acts_post", layer=1)]
        assert tuple(acts.shape) == (3, 12, N) and bool((acts > 0).any())
        assert torch.equal(cache[s.name(clt, "output", layer=2)], cache["blocks.2.hook_mlp_out"])
    assert torch.equal(logits, clean)
    assert not any("hook_sae" in n for n in model.hook_names())


def test_replacement_is_every_mlp_replaced_at_once(model):
    """error_term=False: each MLP output becomes Σ_{s ≤ t} W_dec^{s→t} a^s + b^t (+ skip) of this very run."""
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    clt = _model_clt(model)
    with torch.no_grad(), splice(model, clt, error_term=False):
        spliced = model(tokens)
    seen = {}

    def read(x, hook):
        seen[int(hook.name.split(".")[1])] = x

    def write(y, hook):
        t = int(hook.name.split(".")[1])
        acts = [clt.encode_layer(seen[s], s) for s in range(t + 1)]
        return clt.b_dec[t] + sum(acts[s] @ clt.decoder(s, t) for s in range(t + 1)) + seen[t] @ clt.W_skip[t]

    with torch.no_grad():
        manual = model.run_with_hooks(tokens, fwd_hooks=[(clt.cfg.in_hook(l), read) for l in range(L)]
                                      + [(clt.cfg.out_hook(l), write) for l in range(L)])
    torch.testing.assert_close(spliced, manual, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(spliced, model(tokens), atol=1e-3)


def test_a_feature_edit_moves_later_layers_by_its_decoders(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    clt = _model_clt(model, skip=False)
    with splice(model, clt) as s:
        _, cache = model.run_with_cache(tokens)
        acts0 = cache[s.name(clt, "acts_post", layer=0)]
        f = int(acts0.flatten(0, 1).sum(0).argmax())

        def zero(a, hook):
            a = a.clone()
            a[..., f] = 0
            return a

        got = {}
        model.run_with_hooks(tokens, fwd_hooks=[(s.name(clt, "acts_post", layer=0), zero),
                                                ("blocks.0.hook_mlp_out", lambda y, hook: got.update(y=y))])
    # layer 0's MLP output moves by exactly −a_f W_dec^{0→0}[f] (later layers also see a changed residual)
    delta = got["y"] - cache["blocks.0.hook_mlp_out"]
    torch.testing.assert_close(delta, -acts0[..., f, None] * clt.decoder(0, 0)[f], rtol=1e-4, atol=1e-5)


def test_spliced_gradients_are_the_models(model):
    from circuitlab.dictionaries.splice import splice

    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    clt = _model_clt(model)

    def grad_of_embed():
        grads = {}

        def keep(x, hook):
            x.retain_grad()
            grads["x"] = x
            return x

        out = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", keep)])
        out[..., 3].sum().backward()
        return grads["x"].grad.clone()

    clean = grad_of_embed()
    with splice(model, clt):
        spliced = grad_of_embed()
    torch.testing.assert_close(spliced, clean, rtol=1e-4, atol=1e-6)


def test_a_clt_for_another_model_is_refused(model):
    from circuitlab.dictionaries.splice import splice

    clt = _model_clt(model)
    other = CrossLayerTranscoder(clt.cfg.replace(n_layers=2))
    with pytest.raises(CircuitlabError, match="has 2 layers but the model has 3"):
        with splice(model, other):
            pass
    narrow = CrossLayerTranscoder(clt.cfg.replace(d_model=D))
    with pytest.raises(CircuitlabError, match="reads width 10 but the model's d_model is 20"):
        with splice(model, narrow):
            pass
    foreign = CrossLayerTranscoder(clt.cfg.replace(base_model={**clt.cfg.base_model, "weights_sha": "0" * 16}))
    with pytest.raises(CircuitlabError, match="was trained on tiny"):
        with splice(model, foreign):
            pass


# ---------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from circuitlab.config import ModelConfig
    from circuitlab.data import build_tokenizer, stories_text
    from circuitlab.model import Transformer
    from circuitlab.training import save_checkpoint

    root = tmp_path_factory.mktemp("clt_cli")
    tok = build_tokenizer("char", [stories_text(50)])
    cfg = ModelConfig.from_preset("gpt2-tiny", d_model=16, n_heads=2, n_layers=3, d_vocab=tok.vocab_size, n_ctx=32)
    torch.manual_seed(0)
    save_checkpoint(root / "model", Transformer(cfg), tok)
    return root


def _cli_config(root, clt: dict, transcoders: dict | None = None, **train):
    import yaml

    per_layer = {"kind": "transcoders", "architecture": "batchtopk", "d_sae": 32, "k": 4, **(transcoders or {})}
    data = {"model": str(root / "model"), "data": {"source": "stories", "n_stories": 200, "tokenizer": "char"},
            "store": {"seq_len": 16, "seqs_per_chunk": 16},
            "dictionaries": [{"kind": "clt", "architecture": "batchtopk", "d_sae": 32, "k": 4, **clt}, per_layer],
            "train": {"steps": 20, "batch_size": 64, "eval_batches": 2, "ckpt_every": 10, **train}}
    path = root / "clt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.usefixtures("one_thread")
def test_sae_train_trains_a_clt_beside_per_layer_transcoders(tiny_checkpoint, capsys):
    from circuitlab.cli import main

    root = tiny_checkpoint
    assert main(["sae", "train", "--config", str(_cli_config(root, {})), "--out", str(root / "run"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "every MLP replaced at once" in printed and "per layer" in printed
    results = json.loads((root / "run" / "results.json").read_text())
    names = [d["name"] for d in results["dictionaries"]]
    assert names == ["clt-batchtopk", "transcoders-0", "transcoders-1", "transcoders-2"]
    m = results["dictionaries"][0]["metrics"]
    assert len(m["layer_explained_variance"]) == 3 and len(m["layer_l0"]) == 3 and "ce_recovered" in m["spliced"]
    assert results["replacements"][0]["dictionaries"] == names[1:]
    clt = CrossLayerTranscoder.load(root / "run" / "dictionaries" / "clt-batchtopk")
    assert clt.cfg.architecture == "jumprelu" and clt.cfg.normalisation["folded"] and clt.cfg.base_model["n_layers"] == 3
    # sae eval takes it too: per layer, and with every MLP replaced
    assert main(["sae", "eval", "--dictionary", str(root / "run" / "dictionaries" / "clt-batchtopk"), "--checkpoint",
                 str(root / "model"), "--batches", "2", "--seq-len", "16", "--json", str(root / "clt-eval.json")]) == 0
    printed = capsys.readouterr().out
    assert "layer 2: explained variance" in printed and "every MLP replaced" in printed
    assert len(json.loads((root / "clt-eval.json").read_text())["layer_l0"]) == 3


@pytest.mark.parametrize("arch,target", [("jumprelu", 0.0), ("topk", 0.0), ("jumprelu", 2.0), ("relu", [1.0, 3.0])])
def test_training_resumes_exactly(tmp_path, arch, target):
    """Also in target-L0 mode (one target, or one per layer), stopped while the per-layer controller steers (its
    state is checkpointed)."""
    from circuitlab.dictionaries.planted import PlantedCrossLayer
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    planted = PlantedCrossLayer(n_layers=2, d=8, n_per_layer=8, rows_per_chunk=256)
    cfg = CLTConfig(arch, n_layers=2, d_model=8, d_sae=12, k=2 if arch == "topk" else None)
    train = DictTrainConfig(steps=12, batch_size=64, dead_after=3, ckpt_every=5, target_l0=target)

    def trainer():
        return DictionaryTrainer([cfg], train, ActivationStore(planted, 64))

    whole = trainer().fit(tmp_path / "whole", progress=False).dictionaries[0]
    trainer().fit(tmp_path / "cut", progress=False, stop_at=7)
    resumed = trainer().fit(tmp_path / "cut", progress=False).dictionaries[0]
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if target:  # one coefficient per layer, saved with the CLT
        held = whole.cfg.metadata["sparsity_coeff"]
        assert len(held) == 2 and held == resumed.cfg.metadata["sparsity_coeff"] and held[0] != held[1]
        assert whole.cfg.metadata["target_l0"] == resumed.cfg.metadata["target_l0"] == ([target] * 2 if target == 2.0 else target)


@pytest.mark.usefixtures("one_thread")
def test_sae_train_takes_a_target_per_layer(tiny_checkpoint):
    """--target-l0 3,2,1: the ReLU CLT is steered and saved with a target per layer, and each ReLU transcoder of
    the per-layer set with its own layer's; a wrong count is refused in one line and writes nothing."""
    from circuitlab.cli import main

    root = tiny_checkpoint
    config = _cli_config(root, {"architecture": "relu"}, transcoders={"architecture": "relu"})
    assert main(["sae", "train", "--config", str(config), "--out", str(root / "steered"), "--no-progress",
                 "--target-l0", "3,2,1"]) == 0
    saved = lambda name: json.loads((root / "steered" / "dictionaries" / name / "config.json").read_text())["metadata"]  # noqa: E731
    assert saved("clt-relu")["target_l0"] == [3.0, 2.0, 1.0] and len(saved("clt-relu")["sparsity_coeff"]) == 3
    assert [saved(f"transcoders-{l}")["target_l0"] for l in range(3)] == [3.0, 2.0, 1.0]


@pytest.mark.parametrize("target,message", [
    ("3,2", "train.target_l0 names 2 L0s but the CLT has 3 layers"),
    ("3,-1,2", "train.target_l0 must be a finite number >= 0, or a non-empty list of finite numbers > 0 (item 1 is -1.0)"),
    ("3,inf,2", "(item 1 is inf)"),
])
@pytest.mark.usefixtures("one_thread")
def test_sae_train_refuses_bad_per_layer_targets_in_one_line(tiny_checkpoint, capsys, target, message):
    from circuitlab.cli import main

    root = tiny_checkpoint
    out = root / "bad-target"
    config = _cli_config(root, {"architecture": "relu"})
    assert main(["sae", "train", "--config", str(config), "--out", str(out), "--no-progress", "--target-l0", target]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("change,message", [
    ({"n_layers": 2}, "the CLT config says n_layers=2 but the model has 3 layers"),
    ({"k": 40}, "k=40 is larger than d_sae=32"),
    ({"d_model": 8}, "the CLT config says d_model=8 but the model's d_model is 16"),
])
@pytest.mark.usefixtures("one_thread")
def test_sae_train_refuses_a_bad_clt_in_one_line_and_writes_nothing(tiny_checkpoint, capsys, change, message):
    from circuitlab.cli import main

    root = tiny_checkpoint
    out = root / "bad"
    assert main(["sae", "train", "--config", str(_cli_config(root, change)), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.usefixtures("one_thread")
def test_bundled_clt_config_trains_on_a_model(tiny_checkpoint):
    """configs/clt-demo.yaml (made for mlp-4l's model), pointed at a tiny 3-layer model."""
    from circuitlab.cli import main

    root = tiny_checkpoint
    sets = [f"model={root / 'model'}", "data.n_stories=200", "data.tokenizer=char", "store.seq_len=16",
            "store.seqs_per_chunk=16", "train.steps=3", "train.batch_size=64", "train.eval_batches=1", "train.ckpt_every=0"]
    assert main(["sae", "train", "--config", "clt-demo", "--out", str(root / "demo"), "--no-progress",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    results = json.loads((root / "demo" / "results.json").read_text())
    assert results["dictionaries"][0]["config"]["n_layers"] == 3 and len(results["dictionaries"]) == 4
    spliced = results["dictionaries"][0]["metrics"]["spliced"]
    assert spliced["ce_zero"] != spliced["ce_clean"]  # every MLP was replaced


@pytest.mark.usefixtures("one_thread")
def test_dashboards_of_a_clt_layer_name_the_layers_its_features_write_to(tiny_checkpoint, capsys):
    from circuitlab.cli import main
    from circuitlab.dictionaries import base_model_id
    from circuitlab.training import load_checkpoint

    root = tiny_checkpoint
    model, _, _ = load_checkpoint(str(root / "model"))
    clt = CrossLayerTranscoder(CLTConfig("jumprelu", n_layers=3, d_model=16, d_sae=8,
                                         base_model=base_model_id(model, "tiny")), seed=0)
    with torch.no_grad():
        for t in clt.threshold:
            t.fill_(0.01)
        clt.W_dec[1][:, 1] *= 0  # layer 1's features write only into layer 1
    clt.save(root / "clt-dash", layout="circuit-tracer")
    args = ["sae", "dashboards", "--dictionary", str(root / "clt-dash"), "--checkpoint", str(root / "model"),
            "--tokens", "256", "--no-progress"]
    assert main(args) == 2 and "choose its layer (--layer 0..2)" in capsys.readouterr().err
    assert main(args + ["--layer", "1"]) == 0
    folder = root / "clt-dash" / "dashboards-layer1"
    writes = json.loads((folder / "clt_writes.json").read_text())
    assert writes["layer"] == 1 and len(writes["write_norms"]) == 8 and len(writes["write_norms"][0]) == 2
    report = (folder / "report.html").read_text()
    assert "Writes into the MLP outputs of layers 1 (" in report and "layers 1 (1.00), 2" not in report
    view = clt.residual_view(1)
    x = torch.randn(5, 16)
    torch.testing.assert_close(view.encode(x), clt.encode_layer(x, 1))
    torch.testing.assert_close(view.W_dec, clt.decoder(1, 1) + clt.decoder(1, 2))


def test_resampling_points_dead_latents_at_the_worst_rows():
    clt = _clt("jumprelu")
    xs, ys = _data(rows=64)
    opt = torch.optim.Adam(clt.parameters())
    clt_training_step(clt, xs, ys, CLTCoefficients(0.1, 0.0, 0.2), None).loss.backward()
    opt.step()
    before = {k: v.clone() for k, v in clt.state_dict().items()}
    dead = torch.zeros(L * N, dtype=torch.bool)
    dead[[3, N + 5]] = True  # latent 3 of layer 0, latent 5 of layer 1
    n = resample_dead(clt, opt, dead, xs, ys, torch.Generator().manual_seed(0), threshold=0.1)
    assert n == 2
    after = clt.state_dict()
    assert not torch.equal(after["W_dec.0"][3], before["W_dec.0"][3]) and not torch.equal(after["W_enc.1"][:, 5], before["W_enc.1"][:, 5])
    assert torch.equal(after["W_dec.0"][4], before["W_dec.0"][4]) and torch.equal(after["W_dec.2"], before["W_dec.2"])
    assert float(after["W_dec.1"][5].norm()) == pytest.approx(1.0) and float(after["threshold.0"][3]) == pytest.approx(0.1)
    assert float(opt.state[clt.W_dec[0]]["exp_avg"][3].abs().sum()) == 0
    with pytest.raises(CircuitlabError, match="not 'split'"):
        resample_dead(clt, opt, dead, xs, ys, torch.Generator(), method="split")


@pytest.mark.parametrize("layout,arch", [("circuit-tracer", "jumprelu"), ("sparsify", "topk"), ("circuitlab", "topk")])
def test_load_transcoders_returns_a_clt(tmp_path, model, layout, arch):
    from circuitlab.dictionaries import load_transcoders

    clt = _model_clt(model, arch=arch)
    clt.save(tmp_path / "c", layout=layout)
    got = load_transcoders(tmp_path / "c", model=model)
    assert isinstance(got, CrossLayerTranscoder) and torch.equal(got.W_dec[1], clt.W_dec[1].detach())
    other = CrossLayerTranscoder(clt.cfg.replace(n_layers=2, base_model={}))
    other.save(tmp_path / "two", layout=layout)
    with pytest.raises(CircuitlabError, match="has 2 layers but the model has 3"):
        load_transcoders(tmp_path / "two", model=model)


def test_a_damaged_clt_folder_is_one_line(tmp_path):
    """Our CLT layout shares the dictionaries' reader: truncated weights, a config.json from another save, a
    config that is not a CLT's, a missing file: each one line naming the folder."""
    folder = _clt("jumprelu").save(tmp_path / "clt")
    weights = folder / "clt.safetensors"
    data, text = weights.read_bytes(), (folder / "config.json").read_text()
    cfg = json.loads(text)
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CircuitlabError, match=f"CLT {folder} is corrupt or truncated"):
        CrossLayerTranscoder.load(folder)
    weights.write_bytes(data)
    (folder / "config.json").write_text(json.dumps({**cfg, "d_sae": 2 * cfg["d_sae"]}))
    with pytest.raises(CircuitlabError, match="config.json does not match clt.safetensors"):
        CrossLayerTranscoder.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "format": "something-else"}))
    with pytest.raises(CircuitlabError, match="has a bad config: its config.json is not a CLT's"):
        CrossLayerTranscoder.load(folder)
    (folder / "config.json").write_text(text)                       # the saved one again: loads
    assert all(torch.equal(a, b) for a, b in zip(CrossLayerTranscoder.load(folder).state_dict().values(),
                                                 _clt("jumprelu").for_inference().state_dict().values()))
