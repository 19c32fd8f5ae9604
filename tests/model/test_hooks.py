"""Core Transformer: config validation, hooks, cache, fast/eager agreement, per-head views.

(Split out of the flat test_model module, issue 38.)"""
import pytest
import torch

from circuitlab import CircuitlabError, Transformer
from circuitlab.model.hooks import HookError

from model.test_transformer import SMALL, ARCHS, tokens  # noqa: F401 (shared with it)

torch.manual_seed(0)


# ---------------------------------------------------------------- hooks
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_hook_fires_once_with_documented_shape(arch):
    cfg = ARCHS[arch]
    model = Transformer(cfg)
    B, T = 2, 7
    counts = {}

    def count(x, hook):
        counts[hook.name] = counts.get(hook.name, 0) + 1

    model.run_with_hooks(tokens(B, T), fwd_hooks=[(lambda n: True, count)])
    assert counts == {name: 1 for name in model.hook_names()}
    _, cache = model.run_with_cache(tokens(B, T))
    H, K, D, M = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model
    expected = {"hook_q": (B, T, H, D), "hook_k": (B, T, K, D), "hook_v": (B, T, K, D), "hook_z": (B, T, H, D),
                "hook_pattern": (B, H, T, T), "hook_attn_scores": (B, H, T, T), "hook_result": (B, T, H, M),
                "hook_resid_pre": (B, T, M), "hook_resid_post": (B, T, M), "hook_attn_out": (B, T, M),
                "hook_embed": (B, T, M), "hook_scale": (B, T, 1), "hook_post": (B, T, cfg.mlp_dim)}
    for name, act in cache.items():
        short = name.split(".")[-1]
        if short in expected:
            assert tuple(act.shape) == expected[short], name
    assert cache["pattern", 0].shape == (B, H, T, T)
    torch.testing.assert_close(cache["pattern", 0].sum(-1), torch.ones(B, H, T))


def test_hook_replacement_changes_output():
    model = Transformer(ARCHS["gpt2"])
    t = tokens()
    clean = model(t)
    patched = model.run_with_hooks(t, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x * 0)])
    assert not torch.allclose(clean, patched)
    # zeroing one head's pattern changes the output too, and only via that hook
    def kill_head(p, hook):
        p = p.clone()
        p[:, 1] = 0
        return p
    patched = model.run_with_hooks(t, fwd_hooks=[("blocks.1.attn.hook_pattern", kill_head)])
    assert not torch.allclose(clean, patched)
    torch.testing.assert_close(model(t), clean)


def test_hooks_removed_after_exception():
    model = Transformer(ARCHS["llama"])
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[(lambda n: True, lambda x, hook: None)],
                         bwd_hooks=[("hook_embed", lambda g, hook: None)]):
            points = model.hook_points().values()
            assert all(len(hp.fwd_fns) == 1 for hp in points)  # every hook point got the forward hook
            assert model.hook_points()["hook_embed"].bwd_fns and all(hp.active for hp in points)
            raise RuntimeError("boom")
    assert not any(hp.active for hp in model.hook_points().values())


def test_unknown_hook_name_lists_closest():
    model = Transformer(ARCHS["gpt2"])
    with pytest.raises(HookError, match="blocks.0.attn.hook_pattern"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: None)])
    with pytest.raises(CircuitlabError, match="not in the cache"):
        _, cache = model.run_with_cache(tokens(), names_filter=["blocks.0.hook_resid_post"])
        cache["pattern", 0]


def test_backward_hooks_give_gradients():
    model = Transformer(ARCHS["gpt2"])
    t = tokens()
    _, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("resid_post"), incl_bwd=True)
    assert set(cache.grads) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    # the gradient wrt the final residual equals autograd's on a leaf copy
    resid = cache["resid_post", 1].clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model.unembed(model.ln_final(resid))[:, :-1].flatten(0, 1),
                                             t[:, 1:].flatten())
    loss.backward()
    torch.testing.assert_close(cache.grads["blocks.1.hook_resid_post"], resid.grad)


def test_gradient_cache_leaves_parameters_alone_and_works_frozen():
    """incl_bwd takes activation gradients with autograd.grad: no parameter .grad is filled, frozen
    weights work, and the values equal backward hooks' on a trainable copy."""
    model = Transformer(ARCHS["llama"])
    t = tokens()
    names = ["hook_embed", "blocks.0.attn.hook_z", "blocks.1.hook_resid_mid"]
    reference: dict[str, torch.Tensor] = {}
    with model.hooks(bwd_hooks=[(n, lambda g, hook: reference.__setitem__(hook.name, g)) for n in names]):
        logits = model(t)
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), t[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.requires_grad_(False)
    _, cache = model.run_with_cache(t, names_filter=names, incl_bwd=True)
    assert all(p.grad is None for p in model.parameters())
    for n in names:
        torch.testing.assert_close(cache.grads[n], reference[n])
        assert not cache[n].requires_grad
    with pytest.raises(CircuitlabError, match="gradient"):
        model.run_with_cache(t, incl_bwd=True, loss_fn=lambda logits: 1.0)
