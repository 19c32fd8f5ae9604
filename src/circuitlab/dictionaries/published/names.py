"""Published hook names as ours (TransformerLens's), and back: Hugging Face module points, circuit-tracer's
per-layer names, TransformerLens's aliases; a hook's layer and width. See the package docstring."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

GEMMA_SCOPE, GEMMA_SCOPE_2, LLAMA_SCOPE = "params.npz", "params.safetensors", "hyperparams.json"
LLAMA_SCOPE_WEIGHTS, CT_CONFIG = "checkpoints/final.safetensors", "config.yaml"
MLP_IN, MLP_OUT = "mlp.hook_in", "mlp.hook_out"  # reading points that need a model to become hooks of ours
LN2_NORMALIZED = "ln2.hook_normalized"
# circuit-tracer names hooks as TransformerLens does, whose LayerNorm hook_normalized is after the gain and bias
# (ours, and TransformerLens's RMSNorm's, before): a set we write marks that its names are ours.
CT_OUR_NAMES = ("hook_names", "circuitlab")


# Hugging Face module paths after "model.layers.{i}." -> our hook under blocks.{i}.
_HF_HOOKS = {"output": "hook_resid_post", "": "hook_resid_post", "self_attn.o_proj.input": "attn.hook_z",
             "pre_feedforward_layernorm.output": MLP_IN, "mlp.input": MLP_IN, "mlp.output": MLP_OUT,
             "post_feedforward_layernorm.output": "hook_mlp_out", "mlp.down_proj.input": "mlp.hook_post"}
_TL_ALIASES = {"hook_mlp_in": "hook_resid_mid"}  # TransformerLens's hook_mlp_in is the residual before ln2


def our_hook(name: str, layer: int | None = None) -> str:
    """A published hook name as ours: "model.layers.3.output" -> "blocks.3.hook_resid_post";
    a per-layer name with its layer ("ln2.hook_normalized", 3) -> "blocks.3.ln2.hook_normalized"."""
    m = re.fullmatch(r"(?:model\.)?(?:language_model\.)?layers\.(\d+)(?:\.(.*))?", name)
    if m:
        rest = m.group(2) or ""
        if rest not in _HF_HOOKS:
            raise CircuitlabError(f"no circuitlab hook for the Hugging Face module point {name!r}; "
                                  f"known: model.layers.N.{{{', '.join(k for k in _HF_HOOKS if k)}}}")
        return f"blocks.{m.group(1)}.{_HF_HOOKS[rest]}"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if m:
        i, rest = int(m.group(1)), m.group(2)
    elif layer is None or name.startswith(("hook_embed", "hook_pos_embed", "ln_final")):
        return name
    else:
        i, rest = layer, name
    return f"blocks.{i}.{_TL_ALIASES.get(rest, rest)}"


def hf_name(hook: str) -> str:
    """Ours -> the Hugging Face module point Gemma Scope 2 names (for saving)."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    back = {"hook_resid_post": "output", "attn.hook_z": "self_attn.o_proj.input", "mlp.hook_post": "mlp.down_proj.input",
            MLP_IN: "pre_feedforward_layernorm.output", MLP_OUT: "mlp.output",
            "hook_mlp_out": "post_feedforward_layernorm.output"}  # Gemma's MLP output is after its post-norm
    if not m or m.group(2) not in back:
        raise CircuitlabError(f"Gemma Scope 2 files name Hugging Face module points; {hook!r} has none "
                              f"(use one of blocks.N.{{{', '.join(sorted(back.values()))}}})")
    return f"model.layers.{m.group(1)}.{back[m.group(2)]}"


def hook_width(model: Transformer, hook: str) -> int | None:
    """The width of a hook's activation (trailing axes joined) from the model's config; None if unknown."""
    c = model.cfg
    d_head = getattr(c, "d_head", None) or c.d_model // c.n_heads
    site = hook.split(".", 2)[2] if hook.startswith("blocks.") else hook
    widths = {"mlp.hook_pre": c.d_mlp, "mlp.hook_post": c.d_mlp, "attn.hook_z": c.n_heads * d_head}
    if site in widths:
        return widths[site]
    if site.startswith(("hook_resid", "hook_attn_out", "hook_mlp_out", "hook_embed")) or site.endswith("hook_normalized"):
        return c.d_model
    return None
