"""Fold norm gains and biases into the weights that follow them, and center what writes to the residual.

    folded = fold_layer_norm(model)   # a new Transformer; `model` is untouched

After folding, every per-head weight view (model.W_Q, W_OV, ...) already contains the norm's gain,
so the circuits and composition scores in qk_ov.py describe what the model computes, up to
the norm's per-token 1/scale.

What happens, in order (each step keeps the output unchanged, except centering W_U which shifts
every logit at a position by the same amount, so probabilities and loss stay the same):

1. Norm folding. A norm followed by a linear map, (x̂ * w + b) @ W + c with x̂ the normalised
   input, equals x̂ @ (diag(w) W) + (b @ W + c). The gain w moves into W, the bias b into c, and the
   norm is left with w = 1, b = 0. For LayerNorm, x̂ has zero mean, so W's component along the
   all-ones direction of d_model is unused and is removed ("centering the reading weights").
   ln1 folds into the attention's Q/K/V, ln2 into the MLP input, ln_final into the unembedding.
2. Value-bias folding. Attention patterns sum to 1, so a head's value bias b_V adds the constant
   b_V @ W_O to the output at every position; it moves into the layer's b_O (so head results carry
   only token-dependent terms).
3. Centering writing weights (LayerNorm only). W_E, W_pos, W_O, b_O, W_out, b_out lose their mean
   over d_model. Exact because every reader of the residual stream is a LayerNorm, which subtracts
   that mean anyway. Not valid for RMSNorm or no norm, which do not center.
4. Centering the unembedding. W_U and b_U lose their mean over the vocabulary: the logits at each
   position all shift by one constant, and softmax is shift-invariant.

Tied embeddings are untied in the copy (folding ln_final changes W_U but must not change W_E), and
the copy's config says tied_embeddings=False. An embedding scale (Gemma's √d_model) moves into W_E
(embed_scale becomes 1), so W_E is what the residual stream receives.

Architecture: norms after a sublayer (block_norms "sandwich" / "post") stay as they are (only norms
that read the residual stream fold: ln1, ln2, ln_final; q/k norms stay too: their gain acts after
normalising, before rotary, which mixes pairs of dims). Centering writing weights needs pre-norm
blocks (cfg.is_pre_norm: every reader of the residual stream a LayerNorm); centering the unembedding
needs a linear read-out (cfg.linear_readout: a logit soft-cap is not shift-invariant). Those steps are
skipped by default and refused when asked for on other models (circuitlab.model.assumptions).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from circuitlab.errors import CircuitlabError
from circuitlab.model.components import Attention, Norm
from circuitlab.model.assumptions import require, unmet

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def weights_model(model: Transformer):
    """The model whose weights say what it computes: fold_layer_norm(model) when it has norms, else the
    model itself (no copy). Weight-based analyses (circuits, composition, OV alignment) read this."""
    return fold_layer_norm(model) if model.cfg.norm != "none" else model


def fold_layer_norm(model: Transformer, center_writing: bool | None = None, center_unembed: bool | None = None,
                    fold_value_biases: bool = True):
    """A copy of model with norms folded (and weights centered); logits [batch, pos, d_vocab] unchanged,
    up to a per-position constant when center_unembed.

    center_writing: None (default) centers the writing weights when the model uses LayerNorm in pre-norm
    blocks and skips it otherwise; True on another model raises a CircuitlabError.
    center_unembed: None (default) centers W_U unless a logit soft-cap follows it; True then raises.
    """
    cfg = model.cfg
    if center_writing is None:
        center_writing = cfg.norm == "layernorm" and not unmet(cfg, "pre_norm")
    elif center_writing and cfg.norm != "layernorm":
        raise CircuitlabError(
            f"center_writing needs LayerNorm (it relies on the norm removing the mean); this model uses {cfg.norm!r}"
        )
    elif center_writing:
        require(cfg, "center_writing", "pre_norm")
    if center_unembed is None:
        center_unembed = not unmet(cfg, "linear_readout")
    elif center_unembed:
        require(cfg, "center_unembed", "linear_readout")
    folded = copy.deepcopy(model)
    storage, compute = model.storage_dtype, model.compute_dtype
    if storage != compute:  # half-precision storage: fold in the compute dtype, then hold the result as before
        folded.set_dtypes(compute)
    with torch.no_grad():
        if folded.cfg.tied_embeddings:
            folded.unembed.weight = nn.Parameter(folded.embed.weight.detach().clone())
            folded.cfg.tied_embeddings = False  # the copy owns its cfg (deepcopy), so this touches only it
        if cfg.embed_scale != 1.0:  # the same products as the forward's x * scale, in the dtype computed in
            folded.embed.weight *= torch.tensor(cfg.embed_scale, dtype=folded.embed.weight.dtype)
            folded.cfg.embed_scale = 1.0
        if cfg.norm != "none":
            for block in folded.blocks:  # a block without a pre-norm (block_norms "post") has Identity there
                if not isinstance(block.ln1, nn.Identity):
                    _fold_norm(block.ln1, block.attn.qkv)
                if cfg.has_mlp and not isinstance(block.ln2, nn.Identity):
                    _fold_norm(block.ln2, block.mlp.fc_in)
            if isinstance(folded.ln_final, Norm):  # always, with cfg.norm set
                _fold_norm(folded.ln_final, folded.unembed)
        if fold_value_biases:
            for block in folded.blocks:
                _fold_value_bias(block.attn)
        if center_writing:
            _center_writing(folded)
        if center_unembed:
            W: torch.Tensor = folded.unembed.weight  # [d_vocab, d_model]
            W -= W.mean(dim=0, keepdim=True)
            if folded.unembed.bias is not None:
                folded.unembed.bias.sub_(folded.unembed.bias.mean())
    return folded.set_dtypes(storage, compute) if storage != compute else folded


def _fold_norm(norm: Norm, linear: nn.Linear) -> None:
    """Move norm's gain and bias into the linear map that reads it (weight [out, d_model])."""
    W: torch.Tensor = linear.weight
    if norm.b is not None:  # norms have a bias only when cfg.bias, so the linear has one too
        linear.bias.add_(W @ norm.b)
        norm.b.zero_()
    W *= norm.w[None, :]
    if norm.kind == "layernorm":
        W -= W.mean(dim=1, keepdim=True)
    norm.w.fill_(1.0)


def _fold_value_bias(attn: Attention) -> None:
    """b_O += Σ_h b_V[h] @ W_O[h]; b_V = 0. Exact because each pattern row sums to 1."""
    qkv, out = attn.qkv, attn.out
    if qkv.bias is None or out is None:
        return  # no biases (then no b_O either), or V-only heads (no b_O to take it)
    H, K, D = attn.n_heads, attn.n_kv, attn.d_head
    b_v = qkv.bias[(H + K) * D:].view(K, D).repeat_interleave(H // K, dim=0)  # [head, d_head]
    out.bias.add_(out.weight @ b_v.reshape(H * D))
    qkv.bias[(H + K) * D:] = 0.0


def _center_writing(model: Transformer) -> None:
    """Remove the mean over d_model from everything that writes into the residual stream."""
    model.embed.weight -= model.embed.weight.mean(dim=-1, keepdim=True)
    if model.cfg.positional == "learned":
        model.pos_embed.weight -= model.pos_embed.weight.mean(dim=-1, keepdim=True)
    for block in model.blocks:
        attn = block.attn
        if attn.out is not None:
            _center_output(attn.out)
        else:  # V-only heads write v itself (d_head == d_model): center each head's value rows
            H, K, D = attn.n_heads, attn.n_kv, attn.d_head
            w_v: torch.Tensor = attn.qkv.weight[(H + K) * D:].view(K, D, -1)
            w_v -= w_v.mean(dim=1, keepdim=True)
            if attn.qkv.bias is not None:
                b_v = attn.qkv.bias[(H + K) * D:].view(K, D)
                b_v -= b_v.mean(dim=1, keepdim=True)
        if model.cfg.has_mlp:
            _center_output(block.mlp.fc_out)


def _center_output(linear: nn.Linear) -> None:
    linear.weight -= linear.weight.mean(dim=0, keepdim=True)  # weight [d_model, in]
    if linear.bias is not None:
        linear.bias.sub_(linear.bias.mean())
