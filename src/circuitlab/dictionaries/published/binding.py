"""A published dictionary checked against a model and bound to it: its base model, its hooks (the reading points
that need the model, mlp.hook_in and mlp.hook_out, resolved), its widths. See the package docstring."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from circuitlab.names import layer_of
from circuitlab.dictionaries.published.names import LN2_NORMALIZED, MLP_IN, MLP_OUT, hook_width
from circuitlab.dictionaries.sae import SparseDictionary, check_base_model
from circuitlab.errors import CircuitlabError, did_you_mean

if TYPE_CHECKING:
    from circuitlab.model import Transformer

def _name_key(name: str) -> str:
    return name.strip().rstrip("/").split("/")[-1].lower()


def check_published_base(sae: SparseDictionary, model: Transformer, where: str = "the dictionary") -> None:
    """A published dictionary names its base model (e.g. google/gemma-2-2b) and width: refuse another model."""
    rec = sae.cfg.base_model or {}
    if rec.get("config_sha"):  # ours: check_base_model compares the exact identity
        return
    d_model, name = rec.get("d_model"), rec.get("name")
    ours = str(getattr(model.cfg, "name", "") or "")
    if name and ours and _name_key(name) != _name_key(ours):
        raise CircuitlabError(f"{where} was made for {name}, not for this model ({ours}); load it with that model")
    if d_model and int(d_model) != model.cfg.d_model:
        raise CircuitlabError(f"{where} was made for {name or 'a model'} with d_model {d_model}, but this model "
                              f"has d_model {model.cfg.d_model}")


@torch.no_grad()
def bind(sae: SparseDictionary, model: Transformer, where: str | None = None) -> SparseDictionary:
    """Check sae against model (base model, hooks, widths) and resolve the reading points that need the
    model (see the module docstring). Returns sae itself when nothing changes, else a bound copy."""
    where = where or f"the dictionary for {sae.cfg.hook_name}"
    check_published_base(sae, model, where)
    cfg, layer = sae.cfg, layer_of(sae.cfg.hook_name)
    blocks = getattr(model, "blocks", [])
    out = sae
    # TransformerLens's ln2.hook_normalized in a LayerNorm block is the MLP's input (after the gain and bias)
    tl_ln = (cfg.hook_name.endswith(LN2_NORMALIZED) and cfg.metadata.get("tl_hook_names") and layer is not None
             and layer < len(blocks) and getattr(getattr(blocks[layer], "ln2", None), "kind", None) == "layernorm")
    if (cfg.hook_name.endswith(MLP_IN) or tl_ln) and layer is not None and layer < len(blocks):
        norm = getattr(blocks[layer], "ln2", None)
        if not cfg.is_transcoder:
            raise CircuitlabError(f"{where} reconstructs the MLP input after ln2's gain, which circuitlab has no "
                                  "hook for; only transcoders reading it can be bound")
        if norm is None:
            raise CircuitlabError(f"{where} reads the MLP input after ln2, but block {layer} has no ln2")
        w = getattr(norm, "w", None)
        hook = f"blocks.{layer}.ln2.hook_normalized" if w is not None else f"blocks.{layer}.hook_resid_mid"
        meta = {k: v for k, v in {**cfg.metadata, "read_as": cfg.hook_name}.items() if k != "tl_hook_names"}
        out = sae._copy_with(cfg.replace(hook_name=hook, metadata=meta))
        if w is not None:  # (x̂·w + b) @ W = x̂ @ (diag(w) W) + b @ W, the same for the skip
            b = getattr(norm, "b", None)
            w = w.to(out.W_enc.dtype)
            if b is not None:
                out.b_enc.add_(b.to(out.W_enc.dtype) @ out.W_enc)
                if cfg.skip:
                    out.b_dec.add_(b.to(out.W_enc.dtype) @ out.W_skip)
            out.W_enc.mul_(w[:, None])
            if cfg.skip:
                out.W_skip.mul_(w[:, None])
    if (out.cfg.out_hook_name or "").endswith(MLP_OUT):
        # The MLP's output before a post-MLP norm: blocks.i.mlp.hook_out, a hook only in blocks that have that
        # norm (Gemma's ln2_post, OLMo-2's); in a pre-norm block the same output is hook_mlp_out.
        i = layer_of(out.cfg.out_hook_name)
        if i is not None and f"blocks.{i}.{MLP_OUT}" not in model.hook_points():
            out = out._copy_with(out.cfg.replace(out_hook_name=f"blocks.{i}.hook_mlp_out"))
    check_base_model(out, model, where)
    names = set(model.hook_names())
    for hook, width, what in ((out.cfg.hook_name, out.cfg.d_in, "reads"), (out.cfg.out_hook_name, out.cfg.d_out, "writes")):
        if hook is None:
            continue
        if hook not in names:
            raise CircuitlabError(f"{where} {what} {hook!r}, which this model has no hook for"
                                  f"{did_you_mean(hook, sorted(names), n=3, cutoff=0.3)}")
        have = hook_width(model, hook)
        if have is not None and have != width:
            raise CircuitlabError(f"{where} {what} width {width} at {hook}, but this model's activation there has "
                                  f"width {have}: it was made for another model")
    return out
