"""Transformer building blocks: norms, rotary positions, attention (MHA/GQA/V-only), MLP, block.

Weights are stored fused for speed (one QKV projection). When no hook needs the attention
scores or pattern, attention runs through scaled_dot_product_attention; otherwise through
the eager path that builds them. Both compute the same function.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from circuitlab.config import ModelConfig
from circuitlab.model.hooks import HookPoint


class Norm(nn.Module):
    """LayerNorm (centre, scale by 1/std, affine) or RMSNorm (scale by 1/rms, gain only).

    hook_scale [batch, pos, 1] is the factor the input is divided by; hook_normalized
    [batch, pos, d_model] is the output before the gain/bias.
    """

    def __init__(self, cfg: ModelConfig, length: int | None = None) -> None:
        super().__init__()
        self.kind = cfg.norm
        self.eps = cfg.norm_eps
        length = cfg.d_model if length is None else length  # q/k norms: d_head or all heads' width
        self.w = nn.Parameter(torch.ones(length))
        self.b = nn.Parameter(torch.zeros(length)) if cfg.norm == "layernorm" and cfg.bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.active or self.hook_normalized.active):
            if self.kind == "layernorm":
                return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
            return F.rms_norm(x, (x.shape[-1],), self.w, self.eps)
        if self.kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale) * self.w
        return x + self.b if self.b is not None else x


def make_norm(cfg: ModelConfig) -> nn.Module:
    return Norm(cfg) if cfg.norm != "none" else nn.Identity()


def rotary_frequencies(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Angular frequency of each rotated pair [rot_dim / 2] (float64), after cfg.rope_scaling; `local`: the
    sliding-window layers' frequencies (cfg.local_rotary_base, unscaled; Gemma-3)."""
    d = cfg.rot_dim
    base = cfg.local_rotary_base if local else cfg.rotary_base
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = None if local else cfg.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["type"] == "linear":  # positions divided by factor
        return inv_freq / factor
    # llama3: wavelengths longer than the original context / low_freq_factor are slowed by `factor`,
    # those shorter than original / high_freq_factor kept, and the band between interpolated.
    original = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class Rotary(nn.Module):
    """Rotary position embedding on the first rot_dim dims of each head: rotate-half layout (LLaMA/NeoX), or
    adjacent pairs when cfg.rotary_interleaved (GPT-J).

    One instance serves every layer of a kind (the Transformer passes it to each Attention): its cos/sin
    tables are [n_ctx, rot_dim] each, which for long-context checkpoints is too much to repeat per layer.
    `local` builds the table of the sliding-window layers (cfg.local_rotary_base, unscaled; Gemma-3).
    """

    def __init__(self, cfg: ModelConfig, local: bool = False) -> None:
        super().__init__()
        self.rot_dim = cfg.rot_dim
        self.local = local
        self.interleaved = cfg.rotary_interleaved
        inv_freq = rotary_frequencies(cfg, local)
        angles = torch.outer(torch.arange(cfg.n_ctx, dtype=torch.float64), inv_freq)  # [n_ctx, rot_dim/2]
        angles = angles.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x [batch, pos, head, d_head] -> same, rotated by absolute position offset + i."""
        T = x.shape[1]
        cos = self.cos[offset:offset + T, None, :].to(x.dtype)
        sin = self.sin[offset:offset + T, None, :].to(x.dtype)
        x_rot, x_pass = x[..., : self.rot_dim], x[..., self.rot_dim:]
        if self.interleaved:  # pairs (x0, x1), (x2, x3), ... -> (-x1, x0), (-x3, x2), ...
            rotated = torch.stack([-x_rot[..., 1::2], x_rot[..., ::2]], dim=-1).flatten(-2)
        else:
            half = self.rot_dim // 2
            rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
        return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


class Attention(nn.Module):
    """Causal multi-head attention with optional grouped-query (n_kv_heads < n_heads) and V-only heads.

    Fused weights: qkv.weight [(n_heads + 2*n_kv_heads) * d_head, d_model] (q heads, then k, then v);
    out.weight [d_model, n_heads * d_head] (absent for V-only heads).
    Per cfg: q/k norms (q_norm, k_norm: Norm modules, after hook_q/hook_k and before rotary), a sliding
    window (this layer's, cfg.is_sliding(layer)), scores times cfg.score_scale then soft-capped
    (cfg.attn_softcap) before the mask; hook_attn_scores sees the capped, masked scores.
    """

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None, layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv) * self.d_head, bias=cfg.bias)
        self.out = nn.Linear(self.n_heads * self.d_head, cfg.d_model, bias=cfg.bias) if cfg.use_attn_out else None
        if cfg.positional == "rotary":
            self.rotary = rotary if rotary is not None else Rotary(cfg)  # shared across layers when given
        else:
            self.rotary = None
        self.scale = cfg.score_scale
        self.softcap = cfg.attn_softcap
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else None
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if cfg.qk_norm != "none":  # per head (length d_head) or over all heads' concatenation (OLMo-2)
            full = cfg.qk_norm == "full"
            self.q_norm = Norm(cfg, self.n_heads * self.d_head if full else self.d_head)
            self.k_norm = Norm(cfg, self.n_kv * self.d_head if full else self.d_head)
        if self.rotary is not None:
            self.hook_rot_q, self.hook_rot_k = HookPoint(), HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos], after the causal mask
        self.hook_pattern = HookPoint()      # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()            # [batch, pos, head, d_head]
        self.hook_result = HookPoint()       # [batch, pos, head, d_model]; computed only when hooked

    def forward(self, x: torch.Tensor, kv_cache: "LayerKV | None" = None) -> torch.Tensor:
        """x [batch, pos, d_model] -> attention output [batch, pos, d_model]."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv, self.d_head
        q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=-1)
        q = self.hook_q(q.view(B, T, H, D))
        k = self.hook_k(k.view(B, T, K, D))
        v = self.hook_v(v.view(B, T, K, D))
        if self.cfg.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.cfg.qk_norm == "full":
            q, k = self.q_norm(q.flatten(2)).view(B, T, H, D), self.k_norm(k.flatten(2)).view(B, T, K, D)
        offset = kv_cache.length if kv_cache is not None else 0
        if self.rotary is not None:
            q = self.hook_rot_q(self.rotary(q, offset))
            k = self.hook_rot_k(self.rotary(k, offset))
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
        S = k.shape[2]
        # SDPA's fused kernels have no soft-cap: soft-capped attention always takes the eager path.
        if self.hook_attn_scores.active or self.hook_pattern.active or self.softcap is not None:
            z = self._eager(q, k, v, offset)
        else:
            # An explicit mask when new queries follow cached keys (bottom-right aligned) or for a sliding window.
            plain = offset == 0 and self.window is None
            mask = None if plain else _causal_mask(T, S, offset, x.device, self.window)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=plain,
                                               scale=self.scale, enable_gqa=K != H)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        if self.hook_result.active:
            if self.out is None:
                result = z
            else:
                w_o = self.out.weight.T.reshape(H, D, -1)  # [head, d_head, d_model]
                result = torch.einsum("bphd,hdm->bphm", z, w_o)
            out = self.hook_result(result).sum(dim=2)
            return out + self.out.bias if self.out is not None and self.out.bias is not None else out
        if self.out is None:
            return z.sum(dim=2)
        return self.out(z.reshape(B, T, H * D))

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
        """Scores and pattern made explicit (hookable). q [b, H, T, D]; k, v [b, K, S, D] -> z [b, H, T, D]."""
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        T, S = q.shape[2], k.shape[2]
        # In place on the fresh product: the same numbers as (q @ k^T) * scale, two [b, H, T, S] copies fewer.
        scores = (q @ k.transpose(-1, -2)).mul_(self.scale)
        if self.softcap is not None:  # c * tanh(s / c), in Gemma-2's order of operations
            scores = scores.div_(self.softcap).tanh_().mul_(self.softcap)
        scores.masked_fill_(~_causal_mask(T, S, offset, q.device, self.window), float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        return pattern @ v


def _causal_mask(T: int, S: int, offset: int, device: torch.device, window: int | None = None) -> torch.Tensor:
    """[T, S] bool, True where query i (absolute offset + i) may attend key j: j <= i, and i - j < window."""
    query = torch.arange(T, device=device)[:, None] + offset
    key = torch.arange(S, device=device)[None, :]
    mask = key <= query
    return mask & (key > query - window) if window is not None else mask


class LayerKV:
    """Cached keys and values of one layer for incremental decoding ([batch, pos, kv_head, d_head])."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        return self.k, self.v


class MLP(nn.Module):
    """GELU/ReLU MLP, or a gated one: SwiGLU (SiLU gate) / GeGLU (tanh-GELU gate, Gemma); fc_in holds gate
    then up, [2 * d_mlp, d_model].

    hook_pre [batch, pos, d_mlp]: pre-activation (the gate when gated); hook_pre_linear: the gated MLP's
    up projection; hook_post [batch, pos, d_mlp]: the neuron activations fed to fc_out.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.mlp
        self.d_mlp = cfg.mlp_dim
        self.gated = self.kind in ("swiglu", "geglu")
        width = 2 * self.d_mlp if self.gated else self.d_mlp
        self.fc_in = nn.Linear(cfg.d_model, width, bias=cfg.bias)
        self.fc_out = nn.Linear(self.d_mlp, cfg.d_model, bias=cfg.bias)
        self.hook_pre = HookPoint()
        if self.gated:
            self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)
        if self.gated:
            gate, up = h.split(self.d_mlp, dim=-1)
            gate = self.hook_pre(gate)
            gate = F.silu(gate) if self.kind == "swiglu" else F.gelu(gate, approximate="tanh")
            h = gate * self.hook_pre_linear(up)
        elif self.kind == "gelu":
            h = F.gelu(self.hook_pre(h))
        elif self.kind == "gelu_new":
            h = F.gelu(self.hook_pre(h), approximate="tanh")
        else:
            h = F.relu(self.hook_pre(h))
        return self.fc_out(self.hook_post(h))


class Block(nn.Module):
    """Residual block. Pre-norm (default): resid_mid = resid_pre + attn(ln1(resid_pre)); resid_post =
    resid_mid + mlp(ln2(resid_mid)). cfg.block_norms "sandwich" also normalises each sublayer's output
    (ln1_post, ln2_post; Gemma), "post" only that (no ln1/ln2; OLMo-2). hook_attn_out / hook_mlp_out are
    what is added to the residual stream (after the post-norm, as in TransformerLens)."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None, layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        pre = cfg.block_norms != "post"
        post = cfg.block_norms != "pre"
        # Registration order is forward order, so model.hook_names() reads top to bottom.
        self.hook_resid_pre = HookPoint()
        self.ln1 = make_norm(cfg) if pre else nn.Identity()
        self.attn = Attention(cfg, rotary, layer)
        self.ln1_post = make_norm(cfg) if post else nn.Identity()
        self.hook_attn_out = HookPoint()
        if cfg.has_mlp:
            if not cfg.parallel_attn_mlp:
                self.hook_resid_mid = HookPoint()
            self.ln2 = make_norm(cfg) if pre else nn.Identity()
            self.mlp = MLP(cfg)
            self.ln2_post = make_norm(cfg) if post else nn.Identity()
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: torch.Tensor, kv_cache: LayerKV | None = None) -> torch.Tensor:
        """x [batch, pos, d_model] -> [batch, pos, d_model]."""
        x = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(self.ln1(x), kv_cache)))
        if not self.cfg.has_mlp:
            return self.hook_resid_post(x + attn_out)
        if self.cfg.parallel_attn_mlp:
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(x)))
            return self.hook_resid_post(x + attn_out + mlp_out)
        mid = self.hook_resid_mid(x + attn_out)
        return self.hook_resid_post(mid + self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(mid)))))
