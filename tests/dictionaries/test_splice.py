"""Splicing dictionaries into a model: exact outputs and gradients, SAELens names, feature edits that
change exactly the decoder's image of the edit, transcoders, and one-line errors."""
import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.dictionaries.splice import sae_hook_name, splice
from circuitlab.errors import CircuitlabError
from circuitlab.model.hooks import HookError
from helpers import random_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=50,
                                  dtype="float64") if "dtype" in ModelConfig.__dataclass_fields__ else \
        ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=50)
    return random_model(cfg, scale=1.0).double().eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))


def make_dict(hook: str, d_in: int, d_sae: int = 48, seed: int = 0, **kw) -> SparseDictionary:
    d = SparseDictionary(DictionaryConfig("relu", d_in=d_in, d_sae=d_sae, hook_name=hook, dtype="float64", **kw),
                         seed=seed)
    with torch.no_grad():  # biases off zero so every term of the splice is exercised
        g = torch.Generator().manual_seed(seed + 1)
        d.b_enc.copy_(0.1 * torch.randn(d.b_enc.shape, generator=g, dtype=torch.float64))
        d.b_dec.copy_(0.1 * torch.randn(d.b_dec.shape, generator=g, dtype=torch.float64))
    return d


def test_spliced_logits_are_exact_and_names_come_and_go(model, tokens):
    sae = make_dict("blocks.1.hook_resid_pre", 32)
    plain = model(tokens)
    plain_cached, _ = model.run_with_cache(tokens)  # caching every hook takes the eager attention path
    names = [sae_hook_name(sae, p) for p in ("input", "acts_post", "recons", "error", "output")]
    with splice(model, sae) as spliced:
        assert spliced.name(sae) == "blocks.1.hook_resid_pre.hook_sae_acts_post"
        assert set(names) <= set(model.hook_names())
        assert torch.equal(model(tokens), plain)  # bit for bit, not merely close
        logits, cache = model.run_with_cache(tokens)
        assert torch.equal(logits, plain_cached)
        acts = cache[spliced.name(sae, "acts_post")]
        assert acts.shape == (3, 12, 48) and bool((acts >= 0).all()) and bool((acts > 0).any())
        x = cache["blocks.1.hook_resid_pre"]
        torch.testing.assert_close(cache[spliced.name(sae, "recons")] + cache[spliced.name(sae, "error")], x)
        torch.testing.assert_close(cache[spliced.name(sae, "recons")], sae(x)[0])
    assert not set(names) & set(model.hook_names())
    assert all(not hp.fwd_fns and not hp.bwd_fns for hp in model.hook_points().values())
    assert torch.equal(model(tokens), plain)


def test_without_error_term_the_model_runs_on_the_reconstruction(model, tokens):
    sae = make_dict("blocks.1.hook_resid_pre", 32)
    with splice(model, sae, error_term=False):
        spliced = model(tokens)
    by_hand = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: sae(x)[0])])
    torch.testing.assert_close(spliced, by_hand)
    assert not torch.allclose(spliced, model(tokens))


def test_feature_ablation_and_steering_move_the_stream_by_the_decoder_row(model, tokens):
    sae = make_dict("blocks.1.hook_resid_pre", 32)
    with splice(model, sae) as spliced:
        _, cache = model.run_with_cache(tokens, names_filter=spliced.name(sae))
        acts = cache[spliced.name(sae)]
        f = int(acts.sum(dim=(0, 1)).argmax())

        def ablate(a, hook):
            a = a.clone()
            a[..., f] = 0
            return a

        def steer(a, hook):
            a = a.clone()
            a[:, 4, f] += 3.0
            return a

        ablated = model.run_with_hooks(tokens, fwd_hooks=[(spliced.name(sae), ablate)])
        steered = model.run_with_hooks(tokens, fwd_hooks=[(spliced.name(sae), steer)])
    # The same edits made by hand on the unspliced residual stream.
    expected_ablated = model.run_with_hooks(tokens, fwd_hooks=[
        ("blocks.1.hook_resid_pre", lambda x, hook: x - acts[..., f, None] * sae.W_dec[f])])
    torch.testing.assert_close(ablated, expected_ablated)

    def add(x, hook):
        x = x.clone()
        x[:, 4] += 3.0 * sae.W_dec[f]
        return x

    torch.testing.assert_close(steered, model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", add)]))
    assert torch.equal(steered[:, :4], model(tokens)[:, :4])  # causal: earlier positions untouched


def test_error_ablation_leaves_the_reconstruction(model, tokens):
    sae = make_dict("blocks.0.hook_resid_post", 32)
    with splice(model, sae) as spliced:
        no_error = model.run_with_hooks(tokens, fwd_hooks=[(spliced.name(sae, "error"), lambda e, hook: 0 * e)])
    with splice(model, sae, error_term=False):
        recon_only = model(tokens)
    torch.testing.assert_close(no_error, recon_only)


def test_gradients_are_exact_upstream_and_decoder_image_at_the_features(model, tokens):
    sae = make_dict("blocks.1.hook_resid_pre", 32)
    upstream = "blocks.0.hook_resid_mid"
    _, plain = model.run_with_cache(tokens, names_filter=[upstream, "blocks.1.hook_resid_pre"], incl_bwd=True)
    with splice(model, sae) as spliced:
        _, cache = model.run_with_cache(tokens, names_filter=[upstream, spliced.name(sae, "acts_post"),
                                                              spliced.name(sae, "output")], incl_bwd=True)
    torch.testing.assert_close(cache.grads[upstream], plain.grads[upstream])
    g_out = cache.grads[spliced.name(sae, "output")]
    torch.testing.assert_close(g_out, plain.grads["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(cache.grads[spliced.name(sae, "acts_post")], g_out @ sae.W_dec.T)


def test_transcoder_reads_the_mlp_input_and_replaces_its_output(model, tokens):
    tc = make_dict("blocks.0.ln2.hook_normalized", 32, out_hook_name="blocks.0.hook_mlp_out", skip=True)
    with torch.no_grad():
        tc.W_skip.copy_(0.05 * torch.randn(32, 32, dtype=torch.float64))
    plain, _ = model.run_with_cache(tokens)
    with splice(model, tc) as spliced:
        assert spliced.name(tc) == "blocks.0.ln2.hook_normalized.hook_sae_acts_post"
        logits, cache = model.run_with_cache(tokens)
        assert torch.equal(logits, plain)
        mlp_out, x_in = cache["blocks.0.hook_mlp_out"], cache["blocks.0.ln2.hook_normalized"]
        torch.testing.assert_close(cache[spliced.name(tc, "recons")], tc(x_in)[0])
        torch.testing.assert_close(cache[spliced.name(tc, "error")], mlp_out - tc(x_in)[0])
    with splice(model, tc, error_term=False):
        replaced = model(tokens)
    by_hand = {}
    expected = model.run_with_hooks(tokens, fwd_hooks=[
        ("blocks.0.ln2.hook_normalized", lambda x, hook: by_hand.update(x=x)),
        ("blocks.0.hook_mlp_out", lambda y, hook: tc(by_hand["x"])[0])])
    torch.testing.assert_close(replaced, expected)


def test_head_outputs_are_joined_and_split_back(model, tokens):
    sae = make_dict("blocks.1.attn.hook_z", 32)  # 4 heads x d_head 8
    plain = model(tokens)
    with splice(model, sae) as spliced:
        logits, cache = model.run_with_cache(tokens, names_filter=[spliced.name(sae, "input"), "blocks.1.attn.hook_z"])
    assert torch.equal(logits, plain)
    torch.testing.assert_close(cache[spliced.name(sae, "input")], cache["z", 1].flatten(-2))


def test_two_dictionaries_at_once_and_bad_input(model, tokens):
    a, b = make_dict("blocks.0.hook_resid_pre", 32), make_dict("blocks.1.hook_mlp_out", 32, seed=3)
    plain = model(tokens)
    with splice(model, [a, b]) as spliced:
        assert torch.equal(model(tokens), plain)
        assert len(spliced.hook_names()) == 10
    with pytest.raises(HookError, match="closest"):
        with splice(model, make_dict("blocks.1.hook_resid_prex", 32)):
            pass
    with pytest.raises(CircuitlabError, match="already spliced"):
        with splice(model, [a, make_dict("blocks.0.hook_resid_pre", 32)]):
            pass
    with pytest.raises(CircuitlabError, match="expects width 24"):
        with splice(model, make_dict("blocks.0.hook_resid_pre", 24)):
            model(tokens)
    # Nothing is left behind by the failures.
    assert all(not hp.fwd_fns for hp in model.hook_points().values())
    assert not any("hook_sae" in n for n in model.hook_names())
