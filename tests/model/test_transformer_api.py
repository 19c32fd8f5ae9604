"""The model's own arithmetic (embed_tokens, readout, split-input attention) and its frozen mode, in float64
against the plain forward pass and against the definition (affine in the residual stream)."""
import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer

SMALL = dict(d_vocab=40, n_ctx=16)
ARCHS = {
    "attn-only": ModelConfig.from_preset("attn-only-2l", **SMALL),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", n_layers=2, **SMALL),
    "llama-gqa": ModelConfig.from_preset("llama-tiny", n_layers=2, **SMALL),
    "neox": ModelConfig.from_preset("gpt2-tiny", n_layers=2, positional="rotary", rotary_dim=16,
                                     parallel_attn_mlp=True, **SMALL),
    "v-only": ModelConfig(n_layers=2, d_model=8, n_heads=2, d_head=8, use_attn_out=False, attn_only=True,
                          norm="none", scale_scores=False, **SMALL),
    # the newer families' switches: sandwich norms, q/k norms, soft-caps, windows, embedding scale, GeGLU
    "gemma2-like": ModelConfig.from_preset("llama-tiny", n_layers=2, block_norms="sandwich", qk_norm="head",
                                           embed_scale=4.0, attn_softcap=1.5, logit_softcap=3.0, mlp="geglu",
                                           sliding_window=3, sliding_layers=[0], **SMALL),
    "olmo2-like": ModelConfig.from_preset("llama-tiny", n_layers=2, block_norms="post", qk_norm="full", **SMALL),
}
PRE_NORM = [a for a in ARCHS if ARCHS[a].block_norms == "pre"]


def model_of(name: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ARCHS[name]).double().eval()
    model.reset_parameters(seed)
    with torch.no_grad():  # non-trivial norm gains and biases, so their handling is tested
        for n, p in model.named_parameters():
            if n.endswith((".w", ".b", ".bias")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def toks(batch=2, pos=7, seed=1):
    return torch.randint(0, SMALL["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_embed_then_blocks_then_readout_is_forward(arch, one_thread):
    model, t = model_of(arch), toks()
    _, cache = model.run_with_cache(t)
    x = model.embed_tokens(t)
    assert torch.equal(x, cache["resid_pre", 0])
    for block in model.blocks:
        x = block(x)
    torch.testing.assert_close(model.readout(x), model(t), rtol=0, atol=1e-12)
    # token embeddings are hook_embed's value; resid_from_embeds adds positions at an offset
    assert torch.equal(model.token_embeddings(t), cache["hook_embed"])
    assert torch.equal(model.embed_tokens(t[:, 3:], offset=3), cache["resid_pre", 0][:, 3:])


@pytest.mark.parametrize("arch", PRE_NORM)
def test_split_attention_with_equal_inputs_is_attn_out(arch, one_thread):
    model, t = model_of(arch), toks()
    cfg = model.cfg
    _, cache = model.run_with_cache(t)
    for l, block in enumerate(model.blocks):
        x = cache["resid_pre", l]
        q_in = x[:, :, None].expand(-1, -1, cfg.n_heads, -1)
        kv_in = x[:, :, None].expand(-1, -1, cfg.kv_heads, -1)
        heads = block.split_attention(q_in, kv_in, kv_in)  # [batch, pos, head, d_model]
        b_O = model.b_O[l]
        torch.testing.assert_close(heads.sum(-2) + b_O, cache["attn_out", l], rtol=0, atol=1e-12)


def test_split_attention_inputs_act_per_head_and_role(one_thread):
    """Changing head h's query input changes only head h's output; with leading copy dims each copy is
    its own run; against a definition written here (scores, mask, softmax) in float64."""
    model, t = model_of("gpt2"), toks(batch=1, pos=5)
    block, cfg = model.blocks[0], model.cfg
    H, D = cfg.n_heads, cfg.head_dim
    x = model.embed_tokens(t)
    g = torch.Generator().manual_seed(3)
    q_in, k_in, v_in = (x[:, :, None] + torch.randn(1, 5, H, cfg.d_model, generator=g, dtype=x.dtype)
                        for _ in range(3))
    heads = block.split_attention(q_in, k_in, v_in)
    ln = block.ln1
    for h in range(H):
        q = ln(q_in[0, :, h]) @ model.W_Q[0, h] + model.b_Q[0, h]
        k = ln(k_in[0, :, h]) @ model.W_K[0, h] + model.b_K[0, h]
        v = ln(v_in[0, :, h]) @ model.W_V[0, h] + model.b_V[0, h]
        scores = (q @ k.T) / D ** 0.5
        scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        want = scores.softmax(-1) @ v @ model.W_O[0, h]
        torch.testing.assert_close(heads[0, :, h], want, rtol=0, atol=1e-12)
    copies = torch.stack([q_in, q_in.flip(2)])  # [copies, batch, pos, head, d_model]
    both = block.split_attention(copies, torch.stack([k_in, k_in]), torch.stack([v_in, v_in]))
    torch.testing.assert_close(both[0], heads, rtol=0, atol=1e-12)
    torch.testing.assert_close(both[1], block.split_attention(q_in.flip(2), k_in, v_in), rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_frozen_mode_on_its_own_input_is_the_forward(arch, one_thread):
    model, t = model_of(arch), toks()
    want = model(t)
    with model.frozen(t):
        assert model.is_frozen
        torch.testing.assert_close(model(t), want, rtol=0, atol=1e-12)
        # a stacked batch of copies, and the first positions only, use the matching reference parts
        torch.testing.assert_close(model(t.repeat(3, 1)), want.repeat(3, 1, 1), rtol=0, atol=1e-12)
        torch.testing.assert_close(model(t[:, :4]), want[:, :4], rtol=0, atol=1e-12)
    assert not model.is_frozen
    torch.testing.assert_close(model(t), want, rtol=0, atol=0)


def _with_added(model, t, layer, direction, alpha, extra_hooks=()):
    def add(x, hook):
        return x + alpha * direction

    return model.run_with_hooks(t, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", add), *extra_hooks])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_frozen_logits_are_affine_in_an_added_residual_direction(arch, one_thread):
    """f(a) = f(0) + a (f(1) - f(0)) for any a, in float64, with MLP outputs held at the reference's (as a
    replacement model hooks them); a mutation (the live model) is not affine."""
    model, t = model_of(arch), toks()
    direction = torch.randn(t.shape[0], t.shape[1], model.cfg.d_model, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(5))
    _, ref = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_mlp_out") or "hook_scale" in n
                                  or n.endswith("hook_pattern"))
    hold = [(n, lambda x, hook: ref[hook.name]) for n in ref.keys() if n.endswith("hook_mlp_out")]
    with model.frozen(ref):
        f0, f1, f3 = (_with_added(model, t, 0, direction, a, hold) for a in (0.0, 1.0, -3.0))
    if model.cfg.logit_softcap is not None:  # the cap is the one non-linear step left: undo it
        f0, f1, f3 = (model.cfg.logit_softcap * torch.atanh(f / model.cfg.logit_softcap) for f in (f0, f1, f3))
    torch.testing.assert_close(f3, f0 - 3 * (f1 - f0), rtol=0, atol=1e-9)
    assert (f1 - f0).abs().max() > 1e-3  # the direction does reach the logits
    live = [_with_added(model, t, 0, direction, a, hold) for a in (0.0, 1.0, -3.0)]
    if model.cfg.norm != "none" or model.cfg.n_layers:  # softmax and norms make the live model non-affine
        assert (live[2] - (live[0] - 3 * (live[1] - live[0]))).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["gpt2", "llama-gqa"])
def test_frozen_attention_projects_values_alone(arch, one_thread):
    """Under a frozen pattern queries and keys are dead: they are not computed (hook_q / hook_k do not fire)
    and a backward pass never reaches the q/k rows of the fused projection, split inputs included."""
    model, t = model_of(arch), toks()
    seen = []
    spy = [(f"blocks.0.attn.hook_{n}", lambda x, hook: seen.append(hook.name)) for n in "qkv"]
    with model.frozen(t):
        logits = model.run_with_hooks(t, fwd_hooks=spy)
        x = model.embed_tokens(t)
        heads = x[:, :, None].expand(-1, -1, model.cfg.n_heads, -1)
        kv = x[:, :, None].expand(-1, -1, model.cfg.kv_heads, -1)
        (logits.sum() + model.blocks[0].split_attention(heads, kv, kv).sum()).backward()
    assert seen == ["blocks.0.attn.hook_v"]
    grad = model.blocks[0].attn.qkv.weight.grad
    v_start = (model.cfg.n_heads + model.cfg.kv_heads) * model.cfg.head_dim
    assert grad is not None and float(grad[v_start:].abs().max()) > 0
    assert grad[:v_start].abs().max() == 0
    model.zero_grad(set_to_none=True)


def test_frozen_gradients_are_the_jacobian_of_the_linear_map(one_thread):
    """Under autograd the frozen model's gradient with respect to the residual stream is constant (the
    frozen pattern and scales are detached): the same at the reference and at a far-away point."""
    model, t = model_of("attn-only"), toks(batch=1)
    x0 = model.embed_tokens(t)

    def grad_at(x):
        x = x.clone().requires_grad_(True)
        out = model.readout(model.blocks[1](model.blocks[0](x)))[0, -1, 3]
        return torch.autograd.grad(out, x)[0]

    with model.frozen(t):
        g0, g1 = grad_at(x0), grad_at(x0 + 5 * torch.randn_like(x0))
    torch.testing.assert_close(g0, g1, rtol=0, atol=1e-12)


def test_frozen_mode_refuses_what_it_cannot_do(one_thread):
    model, t = model_of("gpt2"), toks()
    _, partial = model.run_with_cache(t, names_filter="blocks.0.attn.hook_pattern")
    with pytest.raises(CircuitlabError, match="lacks"):
        with model.frozen(partial):
            pass
    with model.frozen(t):
        with pytest.raises(CircuitlabError, match="already in frozen mode"):
            with model.frozen(t):
                pass
        with pytest.raises(CircuitlabError, match="positions"):
            model(toks(pos=9))
        with pytest.raises(CircuitlabError, match="batch"):
            model(toks(batch=3))
    assert not model.is_frozen  # restored after the errors raised inside
    assert set(model.frozen_hook_names()) == {
        *(f"blocks.{l}.{n}.hook_scale" for l in range(2) for n in ("ln1", "ln2")), "ln_final.hook_scale",
        *(f"blocks.{l}.attn.hook_pattern" for l in range(2))}
