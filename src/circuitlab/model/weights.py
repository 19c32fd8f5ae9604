"""Per-head weight views of the fused weights, in the framework paper's orientation (x @ W).

Shapes: W_E [d_vocab, d_model]; W_pos [n_ctx, d_model]; W_U [d_model, d_vocab];
W_Q, W_K, W_V [layer, head, d_model, d_head] (GQA: k/v heads repeated to query heads);
W_O [layer, head, d_head, d_model]; W_QK [layer, head, d_model, d_model] = W_Q W_Kᵀ;
W_OV [layer, head, d_model, d_model] = W_V W_O; W_in [layer, d_model, d_mlp];
W_out [layer, d_mlp, d_model]. The views are differentiable tensors, not copies kept in sync; they are in the
model's compute dtype (copies upcast from half-precision storage, the parameters themselves otherwise).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.config import ModelConfig
    from circuitlab.model.components import MLP, BlockList, Norm
    from circuitlab.model.storage import Linear


class WeightViews:
    """Mixin for Transformer: per-head views computed from the stored (fused) parameters."""

    if TYPE_CHECKING:  # what the mixin reads of the Transformer it is mixed into
        cfg: ModelConfig
        embed: nn.Embedding
        pos_embed: nn.Embedding
        blocks: BlockList
        ln_final: Norm | nn.Identity
        unembed: Linear

        @property
        def compute_dtype(self) -> torch.dtype: ...

    def _computed(self, t: torch.Tensor) -> torch.Tensor:
        """A stored tensor in the compute dtype (itself when stored in it)."""
        return t if t.dtype == self.compute_dtype else t.to(self.compute_dtype)

    # ------------------------------------------------------------------ embeddings
    @property
    def W_E(self) -> torch.Tensor:
        return self._computed(self.embed.weight)

    @property
    def W_pos(self) -> torch.Tensor:
        if self.cfg.positional != "learned":
            raise CircuitlabError(f"W_pos: this model has {self.cfg.positional!r} positions, not learned ones")
        return self._computed(self.pos_embed.weight)

    @property
    def W_U(self) -> torch.Tensor:
        return self._computed(self.unembed.weight).T

    def unembed_directions(self, directions: torch.Tensor) -> torch.Tensor:
        """Residual-stream directions [..., d_model] read as logit changes [..., d_vocab] per unit length:
        through the final norm's gain (centred first for LayerNorm) and W_U. The norm's per-token scale
        is left out: it is positive, so it changes no ranking (divide by ln_final.hook_scale for exact DLA)."""
        if self.cfg.norm == "layernorm":
            directions = directions - directions.mean(dim=-1, keepdim=True)
        if not isinstance(self.ln_final, nn.Identity):  # cfg.norm "none" makes the final norm an Identity
            directions = directions * self._computed(self.ln_final.w)
        return directions @ self.W_U

    @property
    def b_U(self) -> torch.Tensor:
        b = self.unembed.bias
        if b is None:
            return torch.zeros(self.cfg.d_vocab, device=self.embed.weight.device, dtype=self.compute_dtype)
        return self._computed(b)

    # ------------------------------------------------------------------ attention
    def _qkv_split(self, part: str, bias: bool = False) -> torch.Tensor:
        H, K, D = self.cfg.n_heads, self.cfg.kv_heads, self.cfg.head_dim
        start, n = {"q": (0, H), "k": (H, K), "v": (H + K, K)}[part]
        per_layer = []
        for block in self.blocks:
            lin = block.attn.qkv
            if bias:
                b = lin.bias if lin.bias is not None else torch.zeros(lin.out_features, device=lin.weight.device)
                w = b[start * D:(start + n) * D].view(n, D)
            else:
                w = lin.weight[start * D:(start + n) * D].view(n, D, -1).transpose(1, 2)  # [n, d_model, D]
            if n != H:
                w = w.repeat_interleave(H // n, dim=0)
            per_layer.append(w)
        return self._computed(torch.stack(per_layer)) if per_layer else torch.empty(0)

    @property
    def W_Q(self) -> torch.Tensor:
        return self._qkv_split("q")

    @property
    def W_K(self) -> torch.Tensor:
        return self._qkv_split("k")

    @property
    def W_V(self) -> torch.Tensor:
        return self._qkv_split("v")

    @property
    def b_Q(self) -> torch.Tensor:
        return self._qkv_split("q", bias=True)

    @property
    def b_K(self) -> torch.Tensor:
        return self._qkv_split("k", bias=True)

    @property
    def b_V(self) -> torch.Tensor:
        return self._qkv_split("v", bias=True)

    @property
    def W_O(self) -> torch.Tensor:
        H, D = self.cfg.n_heads, self.cfg.head_dim
        per_layer = []
        for block in self.blocks:
            out = block.attn.out
            if out is None:  # V-only heads write z straight into the residual stream
                per_layer.append(torch.eye(D, device=self.embed.weight.device).expand(H, D, D))
            else:
                per_layer.append(self._computed(out.weight).T.reshape(H, D, -1))
        return torch.stack(per_layer) if per_layer else torch.empty(0)

    @property
    def b_O(self) -> torch.Tensor:
        """[layer, d_model]"""
        d = self.cfg.d_model
        return torch.stack([
            self._computed(b.attn.out.bias) if b.attn.out is not None and b.attn.out.bias is not None
            else torch.zeros(d, device=self.embed.weight.device) for b in self.blocks
        ]) if len(self.blocks) else torch.empty(0)

    @property
    def W_QK(self) -> torch.Tensor:
        return self.W_Q @ self.W_K.transpose(-1, -2)

    @property
    def W_OV(self) -> torch.Tensor:
        return self.W_V @ self.W_O

    # ------------------------------------------------------------------ MLP
    def _mlp_stack(self, fn: Callable[[MLP], torch.Tensor]) -> torch.Tensor:
        if not self.cfg.has_mlp:
            raise CircuitlabError("this model is attention-only: it has no MLP weights")
        return torch.stack([self._computed(fn(b.mlp)) for b in self.blocks])

    @property
    def W_in(self) -> torch.Tensor:
        """[layer, d_model, d_mlp]; for a gated MLP (SwiGLU / GeGLU) the up projection (the gate is W_gate)."""
        d = self.cfg.mlp_dim
        return self._mlp_stack(lambda m: m.fc_in.weight[-d:].T)

    @property
    def W_gate(self) -> torch.Tensor:
        if self.cfg.mlp not in ("swiglu", "geglu"):
            raise CircuitlabError("W_gate exists only for gated (SwiGLU / GeGLU) MLPs")
        d = self.cfg.mlp_dim
        return self._mlp_stack(lambda m: m.fc_in.weight[:d].T)

    @property
    def W_out(self) -> torch.Tensor:
        return self._mlp_stack(lambda m: m.fc_out.weight.T)

    @property
    def b_in(self) -> torch.Tensor:
        d = self.cfg.mlp_dim
        return self._mlp_stack(lambda m: m.fc_in.bias[-d:] if m.fc_in.bias is not None
                               else torch.zeros(d, device=m.fc_in.weight.device))

    @property
    def b_out(self) -> torch.Tensor:
        return self._mlp_stack(lambda m: m.fc_out.bias if m.fc_out.bias is not None
                               else torch.zeros(self.cfg.d_model, device=m.fc_out.weight.device))
