"""Activation patching against TransformerLens 3.9's transformer_lens.patching on the same random weights."""
import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.patching import logit_diff, patching_sweep

pytest.importorskip("transformer_lens")
import transformer_lens.patching as tl_patching  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: torch's intra-op threads cost more than they save here, and stall badly when another
    process holds a core (9x slower on a busy 2-core machine), so these tests run on one, then restore it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CONFIGS = {
    "attn-only": ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=4, d_vocab=40, n_ctx=16),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", d_model=32, n_heads=4, d_mlp=64, d_vocab=40, n_ctx=16),
}
# our target -> TransformerLens function with the same [layer, ...] layout
TL_FUNCTIONS = {
    "head_out_by_pos": tl_patching.get_act_patch_attn_head_out_by_pos,
    "resid_pre": tl_patching.get_act_patch_resid_pre,
    "attn_out": tl_patching.get_act_patch_attn_out,
    "head_out": tl_patching.get_act_patch_attn_head_out_all_pos,
    "pattern_by_pos": tl_patching.get_act_patch_attn_head_pattern_by_pos,
}


def random_model(name: str) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(CONFIGS[name])
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith((".w", ".b", ".bias")):
                p.copy_((1.0 if pname.endswith(".w") else 0.0) + 0.3 * torch.randn_like(p))
            else:
                p.mul_(12.0)  # sharp attention, so that patches move the metric well beyond the tolerance
    return model


def to_transformer_lens(model: Transformer) -> HookedTransformer:
    """The same weights in a HookedTransformer. Built from a config and filled with load_state_dict,
    so nothing is folded or centred (that happens only in from_pretrained / process_weights_)."""
    cfg = model.cfg
    ref = HookedTransformer(HookedTransformerConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.head_dim, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, attn_only=cfg.attn_only, d_mlp=None if cfg.attn_only else cfg.mlp_dim,
        act_fn=None if cfg.attn_only else cfg.mlp, eps=cfg.norm_eps,
        normalization_type="LN" if cfg.norm == "layernorm" else None, positional_embedding_type="standard",
        device="cpu", seed=0))
    state = ref.state_dict()
    new = {"embed.W_E": model.W_E, "pos_embed.W_pos": model.W_pos, "unembed.W_U": model.W_U, "unembed.b_U": model.b_U}
    for l, block in enumerate(model.blocks):
        p = f"blocks.{l}."
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            new[p + "attn." + name] = getattr(model, name)[l]
        if cfg.norm == "layernorm":
            new.update({p + "ln1.w": block.ln1.w, p + "ln1.b": block.ln1.b,
                        p + "ln2.w": block.ln2.w, p + "ln2.b": block.ln2.b})
        if cfg.has_mlp:
            new.update({p + "mlp.W_in": model.W_in[l], p + "mlp.b_in": model.b_in[l],
                        p + "mlp.W_out": model.W_out[l], p + "mlp.b_out": model.b_out[l]})
    if cfg.norm == "layernorm":
        new.update({"ln_final.w": model.ln_final.w, "ln_final.b": model.ln_final.b})
    assert set(new) <= set(state), set(new) - set(state)
    state.update({k: v.detach().clone() for k, v in new.items()})
    ref.load_state_dict(state, strict=True)
    return ref


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    model = random_model(request.param)
    return model, to_transformer_lens(model)


def test_weights_loaded_unchanged(pair):
    model, ref = pair
    tokens = torch.randint(0, 40, (2, 6))
    # No folding or centring happened: the raw weights are ours, and so are the logits.
    torch.testing.assert_close(ref.blocks[0].attn.W_Q.detach(), model.W_Q[0].detach())
    if model.cfg.norm == "layernorm":
        torch.testing.assert_close(ref.blocks[0].ln1.w.detach(), model.blocks[0].ln1.w.detach())
    with torch.no_grad():
        torch.testing.assert_close(ref(tokens), model(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target", list(TL_FUNCTIONS))
def test_same_numbers_as_transformer_lens(pair, target):
    model, ref = pair
    gen = torch.Generator().manual_seed(3)
    clean, corrupt = torch.randint(0, 40, (2, 6), generator=gen), torch.randint(0, 40, (2, 6), generator=gen)
    metric = logit_diff([3, 4], [5, 6])
    ours = patching_sweep(model, clean, corrupt, metric, [target], progress=False)[target].values
    _, clean_cache = ref.run_with_cache(clean)
    theirs = TL_FUNCTIONS[target](ref, corrupt, clean_cache, metric)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.detach().double(), atol=1e-5, rtol=0)
    assert ours.std() > 0.01  # the patches do something, so agreement to 1e-5 is not trivial
