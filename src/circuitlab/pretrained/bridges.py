"""Bridges to the other libraries researchers use: TransformerLens and nnsight.

    from circuitlab.pretrained import to_transformer_lens, to_nnsight
    tl_model = to_transformer_lens(model)        # a HookedTransformer: same weights, same logits (≤ 1e-4)
    nn_model = to_nnsight(model)                 # nnsight.NNsight over the model itself (not a copy)

TransformerLens (3.x) gets our weights through plain ``load_state_dict``: nothing is folded or
centred (TransformerLens does that only in ``from_pretrained``), so the two models compute the same
function and hook names match. Every architecture circuitlab builds has a TransformerLens
counterpart except SwiGLU with biases (TransformerLens's gated MLP adds its input bias after the
gate, a different function); the mapping of the others is:

- V-only heads (``use_attn_out=False``) → ``W_O`` = identity per head (d_head == d_model);
- unscaled scores (``scale_scores=False``) → ``use_attn_scale=False``;
- no positions (``positional="none"``) → learned positions of zero;
- missing biases → zero biases; GQA → ``n_key_value_heads``; rotary scaling ``linear`` →
  ``rotary_scaling_factor``, ``llama3`` → NTK-by-parts.

nnsight wraps any ``torch.nn.Module``; each circuitlab hook point is a module, so
``nn_model.blocks[1].attn.hook_z.output`` is the activation our cache calls
``blocks.1.attn.hook_z``. Some hook points run only when something is attached to them (the
attention scores and pattern, the norms' scale, ``hook_result``: without them the model takes its
fused fast path); open ``every_hook_point(model)`` around the trace to keep every hook point running.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

TL_CONFIG_SEED = 0  # the seed HookedTransformerConfig is given (the weights are ours: it draws none we keep)


class BridgeError(CircuitlabError):
    """The model has a feature the other library cannot express, or the library is missing."""


_ACT_FN = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu", "swiglu": "silu"}


def transformer_lens_major() -> int | None:
    """The installed TransformerLens's major version (3, 4, ...), or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformer-lens").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def to_transformer_lens(model: Transformer, use_attn_result: bool = False, device: str | torch.device | None = None,
                        tokenizer=None):
    """model in the TransformerLens the user has: on 3.x a ``HookedTransformer`` (below); on 4.x, which has
    no HookedTransformer, a ``TransformerBridge`` over the model exported to Hugging Face
    (``to_transformer_bridge``; ``use_attn_result`` is then not available). Same logits and hook values.
    """
    major = transformer_lens_major()
    if major is None:
        raise BridgeError("to_transformer_lens needs TransformerLens: pip install transformer-lens")
    if major >= 4:
        if use_attn_result:
            raise BridgeError("TransformerLens 4's TransformerBridge has no use_attn_result; read hook_z and W_O, "
                              "or use circuitlab's own cache (hook_result)")
        return to_transformer_bridge(model, tokenizer=tokenizer, device=device)
    return to_hooked_transformer(model, use_attn_result, device)


def to_transformer_bridge(model: Transformer, tokenizer=None, device: str | torch.device | None = None):
    """A TransformerLens ``TransformerBridge`` (TransformerLens 4, also in 3.9) over ``model`` exported to a
    Hugging Face model (export_hf, then transformers in eager attention): the same logits and, under
    TransformerLens's names (ours), the same hook values (masked attention scores are the dtype's minimum
    there, -inf here).

    tokenizer: a transformers tokenizer for the bridge's string methods; without one, a placeholder
    whose token i is "t{i}" (pass token ids). A model the export cannot hold, or a family TransformerLens
    has no adapter for, is a BridgeError in one line.
    """
    import tempfile

    try:
        import transformers
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        raise BridgeError("to_transformer_bridge needs TransformerLens >= 3.9 (its model_bridge): "
                          "pip install 'transformer-lens>=4'") from None
    from circuitlab.errors import CircuitlabError
    from circuitlab.pretrained.export import export_hf

    param = next(model.parameters())
    device = param.device if device is None else torch.device(device)
    with tempfile.TemporaryDirectory(prefix="circuitlab-bridge-") as tmp:
        try:
            folder = export_hf(model, f"{tmp}/model")
        except CircuitlabError as e:
            raise BridgeError(f"TransformerLens 4 bridges Hugging Face models, and {e}") from None
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=param.dtype,
                                                               attn_implementation="eager").eval()
        tok = tokenizer if tokenizer is not None else _placeholder_tokenizer(model.cfg.d_vocab)
        try:
            with _quiet():
                bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf, tokenizer=tok,
                                                             device=str(device), dtype=param.dtype)
        except Exception as e:  # noqa: BLE001 - TransformerLens's own refusal (no adapter for this family)
            first = str(e).splitlines()[0] if str(e) else ""
            raise BridgeError(f"TransformerLens's TransformerBridge cannot take this model "
                              f"({hf.config.model_type}): {type(e).__name__}: {first[:200]}") from None
    return bridge.eval()


def _placeholder_tokenizer(d_vocab: int):
    """A word-level tokenizer whose token i is "t{i}": enough for a bridge driven by token ids."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(d_vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0")


def to_hooked_transformer(model: Transformer, use_attn_result: bool = False, device: str | torch.device | None = None):
    """A TransformerLens 3.x ``HookedTransformer`` computing the same function as ``model``.

    model: a circuitlab Transformer of any architecture circuitlab builds except gated MLPs with
    non-zero input biases, and post-only block norms without whole-projection q/k norms (a BridgeError
    says so). The weights are copied (the two models do not share storage);
    dtype and device follow the model unless ``device`` is given. ``use_attn_result`` is passed on
    to TransformerLens (it computes ``hook_result`` [batch, pos, head, d_model] on every call).
    Logits agree within 1e-4 in float32 (tested on every preset).
    """
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        raise BridgeError("a HookedTransformer needs TransformerLens 3.x (4.x removed it: use to_transformer_bridge): "
                          "pip install 'transformer-lens>=3,<4'") from None
    cfg = model.cfg
    gated_bias = cfg.has_mlp and cfg.mlp in ("swiglu", "geglu") and cfg.bias
    if gated_bias and any(bool((block.mlp.fc_in.bias != 0).any()) for block in model.blocks):
        raise BridgeError("TransformerLens cannot express a gated (SwiGLU / GeGLU) MLP with biases (its gated MLP adds the bias "
                          "after the gate); use bias=False for a model you want to bring to TransformerLens")
    param = next(model.parameters())
    device = param.device if device is None else torch.device(device)
    options: dict[str, Any] = dict(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.head_dim, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, attn_only=cfg.attn_only, eps=cfg.norm_eps, use_attn_result=use_attn_result,
        normalization_type={"layernorm": "LN", "rmsnorm": "RMS", "none": None}[cfg.norm],
        use_attn_scale=cfg.scale_scores, parallel_attn_mlp=cfg.parallel_attn_mlp,
        dtype=param.dtype, device=str(device), seed=TL_CONFIG_SEED, default_prepend_bos=False)
    if cfg.has_mlp:
        options.update(d_mlp=cfg.mlp_dim, act_fn=_ACT_FN.get(cfg.mlp), gated_mlp=cfg.mlp == "swiglu")
    if cfg.kv_heads != cfg.n_heads:
        options["n_key_value_heads"] = cfg.kv_heads
    if cfg.positional == "rotary":
        options.update(positional_embedding_type="rotary", rotary_dim=cfg.rot_dim, rotary_base=cfg.rotary_base,
                       rotary_adjacent_pairs=cfg.rotary_interleaved)  # rotate-half (NeoX, LLaMA) or pairs (GPT-J)
        options.update(_rope_scaling_options(cfg.rope_scaling))
    else:
        options["positional_embedding_type"] = "standard"
    options.update(_newer_switches(cfg))
    with _quiet():
        ref = HookedTransformer(HookedTransformerConfig(**options))
    ref.load_state_dict(_tl_state(model, ref.state_dict()), strict=True)
    return ref.eval()


def _newer_switches(cfg) -> dict[str, Any]:
    """TransformerLens's options for the newer families' switches (Gemma-2/3, Qwen3, OLMo-2, Phi-3, GPT-J)."""
    out: dict[str, Any] = {}
    if cfg.has_mlp and cfg.mlp == "geglu":
        out.update(act_fn="gelu_pytorch_tanh", gated_mlp=True)
    if cfg.block_norms == "sandwich":
        out["use_normalization_before_and_after"] = True
    if (cfg.block_norms == "post") != (cfg.qk_norm == "full"):
        # TransformerLens has post-only norms and whole-projection q/k norms only together, as OLMo-2
        raise BridgeError("TransformerLens has post-only block norms only with q/k norms over the whole projection "
                          "(OLMo-2); this model has one without the other")
    if cfg.block_norms == "post":
        out["original_architecture"] = "Olmo2ForCausalLM"  # its ln1 / ln2 are our ln1_post / ln2_post
    if cfg.qk_norm == "head":
        out["use_qk_norm"] = True
    if cfg.attn_scale is not None:
        out["attn_scale"] = float(cfg.attn_scale)
    if cfg.attn_softcap is not None:
        out["attn_scores_soft_cap"] = float(cfg.attn_softcap)
    if cfg.logit_softcap is not None:
        out["output_logits_soft_cap"] = float(cfg.logit_softcap)
    if cfg.sliding_window is not None:
        out.update(use_local_attn=True, window_size=cfg.sliding_window,
                   attn_types=["local" if cfg.is_sliding(i) else "global" for i in range(cfg.n_layers)])
    if cfg.local_rotary_base is not None:
        out["rotary_base_local"] = cfg.local_rotary_base
    return out


def _rope_scaling_options(scaling: dict | None) -> dict[str, Any]:
    if scaling is None:
        return {}
    if scaling["type"] == "linear":
        return {"rotary_scaling_factor": float(scaling["factor"])}
    if scaling["type"] == "longrope":
        raise BridgeError("TransformerLens 3.x has no LongRoPE rotary scaling (Phi-3's long-context checkpoints); "
                          "with TransformerLens 4, to_transformer_lens bridges the exported model instead")
    return {"use_NTK_by_parts_rope": True, "NTK_by_parts_factor": float(scaling["factor"]),
            "NTK_by_parts_low_freq_factor": float(scaling["low_freq_factor"]),
            "NTK_by_parts_high_freq_factor": float(scaling["high_freq_factor"]),
            "NTK_original_ctx_len": int(scaling["original_max_position_embeddings"])}


def _tl_state(model: Transformer, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TransformerLens's state dict (its buffers kept) with our weights in TransformerLens's layout."""
    cfg = model.cfg
    H, K, D = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    W_E = model.W_E
    if cfg.embed_scale != 1.0:  # TransformerLens scales Gemma's W_E itself (as HF does, in the weights' dtype)
        W_E = W_E * torch.tensor(cfg.embed_scale, dtype=W_E.dtype)
    new: dict[str, torch.Tensor] = {"embed.W_E": W_E, "unembed.W_U": model.W_U, "unembed.b_U": model.b_U}
    if cfg.positional == "learned":
        new["pos_embed.W_pos"] = model.W_pos
    elif cfg.positional == "none":
        new["pos_embed.W_pos"] = torch.zeros_like(state["pos_embed.W_pos"])
    gqa = K != H
    for l, block in enumerate(model.blocks):
        p = f"blocks.{l}."
        new[p + "attn.W_Q"], new[p + "attn.b_Q"] = model.W_Q[l], model.b_Q[l]
        new[p + "attn.W_O"], new[p + "attn.b_O"] = model.W_O[l], model.b_O[l]
        qkv = block.attn.qkv
        bias = qkv.bias if qkv.bias is not None else torch.zeros(qkv.out_features, device=qkv.weight.device)
        for name, start in (("K", H), ("V", H + K)):  # the stored kv heads, unrepeated, for TL's GQA
            rows = slice(start * D, (start + K) * D)
            w, b = qkv.weight[rows].view(K, D, -1).transpose(1, 2), bias[rows].view(K, D)
            if not gqa:
                new[p + f"attn.W_{name}"], new[p + f"attn.b_{name}"] = w, b
            else:
                new[p + f"attn._W_{name}"], new[p + f"attn._b_{name}"] = w, b
        if cfg.block_norms == "post":  # TransformerLens's OLMo-2 calls its post-norms ln1 and ln2
            norms = [("ln1", block.ln1_post)] + ([("ln2", block.ln2_post)] if cfg.has_mlp else [])
        else:
            norms = [("ln1", block.ln1)] + ([("ln2", block.ln2)] if cfg.has_mlp else [])
            if cfg.block_norms == "sandwich":
                norms += [("ln1_post", block.ln1_post)] + ([("ln2_post", block.ln2_post)] if cfg.has_mlp else [])
        if cfg.qk_norm != "none":
            norms += [("attn.q_norm", block.attn.q_norm), ("attn.k_norm", block.attn.k_norm)]
        for name, norm in norms:
            new.update(_norm_state(cfg, p + name, norm))
        if cfg.has_mlp:
            new.update({p + "mlp.W_in": model.W_in[l], p + "mlp.W_out": model.W_out[l],
                        p + "mlp.b_in": model.b_in[l], p + "mlp.b_out": model.b_out[l]})
            if cfg.mlp in ("swiglu", "geglu"):
                new[p + "mlp.W_gate"] = model.W_gate[l]
    new.update(_norm_state(cfg, "ln_final", model.ln_final))
    unknown = set(new) - set(state)
    if unknown:  # a TransformerLens version with other parameter names
        raise BridgeError(f"this TransformerLens has no parameters named {', '.join(sorted(unknown))}; "
                          "to_transformer_lens supports TransformerLens 3.x")
    for key, value in new.items():
        if state[key].shape != value.shape:
            raise BridgeError(f"TransformerLens expects {key} of shape {tuple(state[key].shape)}, "
                              f"circuitlab gives {tuple(value.shape)}")
        state[key] = value.detach().clone().to(state[key])
    return state


def _norm_state(cfg, prefix: str, norm) -> dict[str, torch.Tensor]:
    if cfg.norm == "none":
        return {}
    out = {prefix + ".w": norm.w}
    if cfg.norm == "layernorm":
        out[prefix + ".b"] = norm.b if norm.b is not None else torch.zeros_like(norm.w)
    return out


@contextlib.contextmanager
def _quiet():
    """TransformerLens logs a line per model it builds from a config; keep the user's output clean."""
    import logging

    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _noop(x: torch.Tensor, hook) -> None:
    return None


def every_hook_point(model: Transformer):
    """Context manager: every hook point of ``model`` runs while it is open, including those the fast
    path skips (attention scores and pattern, the norms' scale, ``hook_result``), so a tracer that
    reads module outputs (nnsight) sees them. The function computed is unchanged."""
    return model.hooks(fwd_hooks=[(lambda name: True, _noop)])


def to_nnsight(model: Transformer):
    """``nnsight.NNsight(model)``: nnsight's tracing over the circuitlab model itself (not a copy).

    Inside ``with nn_model.trace(tokens):``, ``nn_model.blocks[l].hook_resid_post.output`` is the
    activation our cache names ``blocks.{l}.hook_resid_post`` (``.save()`` it to read it after the
    block; assign to it to patch; nnsight 0.8 wants the modules in the order the forward pass runs them). To read the hook points that run only when hooked (attention
    pattern and scores, norm scale, ``hook_result``), open ``every_hook_point(model)`` around the trace.
    """
    try:
        from nnsight import NNsight
    except ImportError:
        raise BridgeError("to_nnsight needs nnsight: pip install 'nnsight>=0.5'") from None
    return NNsight(model)
