"""Our weights in a TransformerLens 3.x HookedTransformer, for checking numbers against the reference.

TransformerLens is a dev-only dependency (tests, benchmarks). The weights go in through plain
load_state_dict, so nothing is folded or centred (TL does that only in from_pretrained).
"""
from __future__ import annotations


def to_transformer_lens(model, use_attn_result: bool = False):
    """model: a circuitlab Transformer (attention-only or GPT-2 style, learned positions) ->
    a HookedTransformer computing the same function."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = model.cfg
    ref = HookedTransformer(HookedTransformerConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.head_dim, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, attn_only=cfg.attn_only, d_mlp=None if cfg.attn_only else cfg.mlp_dim,
        act_fn=None if cfg.attn_only else cfg.mlp, eps=cfg.norm_eps, use_attn_result=use_attn_result,
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
    missing = set(new) - set(state)
    if missing:
        raise KeyError(f"TransformerLens has no parameters named {sorted(missing)}")
    state.update({k: v.detach().clone() for k, v in new.items()})
    ref.load_state_dict(state, strict=True)
    return ref
