# long module: the forward pass's parts (norm, rotary, attention, MLP, block) in one file, read top to bottom as one computation
"""Transformer building blocks: norms, rotary positions, attention (MHA/GQA/V-only), MLP, block.

Weights are stored fused for speed (one QKV projection). When no hook needs the attention
scores or pattern, attention runs through scaled_dot_product_attention; otherwise through
the eager path that builds them. Both compute the same function.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

import torch
import torch.nn.functional as F
from torch import nn

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError
from circuitlab.model.hooks import HookPoint
from circuitlab.model.storage import Linear, stored_linear, upcast


class _Centre(torch.autograd.Function):
    """x - mean(x) over the last dim. Centring is a symmetric projection, so its backward is the same
    centring of the gradient: two passes over it instead of the five autograd records for x - x.mean()
    (the frozen-mode backward of attribution graphs runs through one per norm and layer)."""

    generate_vmap_rule = True  # works under batched gradients (autograd.grad(is_grads_batched=True))

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True)

    @staticmethod
    def setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad - grad.mean(-1, keepdim=True)


class Norm(nn.Module):
    """LayerNorm (centre, scale by 1/std, affine) or RMSNorm (scale by 1/rms, gain only).

    hook_scale [batch, pos, 1] is the factor the input is divided by; hook_normalized
    [batch, pos, d_model] is the output before the gain/bias.

    frozen_scale: set by Transformer.frozen() (None otherwise): the scale [batch, pos, 1] of a
    reference run, detached, used instead of the input's own, so the norm is an affine map of its input.
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
        self.frozen_scale: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., batch, pos, d_model] -> same shape."""
        frozen = self.frozen_scale
        if frozen is None and not (self.hook_scale.active or self.hook_normalized.active):
            if self.kind == "layernorm":
                return F.layer_norm(x, (x.shape[-1],), upcast(self.w, x), upcast(self.b, x), self.eps)
            return F.rms_norm(x, (x.shape[-1],), upcast(self.w, x), self.eps)
        if self.kind == "layernorm":
            x = _Centre.apply(x) if frozen is not None else x - x.mean(-1, keepdim=True)
        scale = self.hook_scale(self.scale_of(x, centred=True))
        if frozen is not None and not self.hook_normalized.active:
            x = x * (self.w / scale)  # a fixed scale: one factor, one pass backward
        else:
            x = self.hook_normalized(x / scale) * self.w
        return x + self.b if self.b is not None else x

    def scale_of(self, x: torch.Tensor, centred: bool = False) -> torch.Tensor:
        """The factor x [..., batch, pos, d] is divided by [..., batch, pos, 1] (the frozen reference's in
        frozen mode). centred: x is already centred (LayerNorm)."""
        if self.frozen_scale is not None:
            return fit_reference(self.frozen_scale, x.shape, "a norm's scale").to(x.dtype)
        if self.kind == "layernorm" and not centred:
            x = x - x.mean(-1, keepdim=True)
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The norm as the linear map it is once its scale is fixed: x [..., d] centred (LayerNorm), divided by
        scale (broadcastable), times the gain; without the bias. norm(x) = linear(x, scale_of(x)) + b, and
        linear is additive: a sum's parts go through it one by one (a head's share of a post-norm's output)."""
        if self.kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        return x / scale * self.w

    @property
    def bias(self) -> torch.Tensor | float:
        """b, or 0 for a norm without one."""
        return self.b if self.b is not None else 0.0


def fit_reference(ref: torch.Tensor, shape: Sequence[int], what: str, pos_dims: tuple[int, ...] = (1,)
                  ) -> torch.Tensor:
    """A frozen reference tensor ref [batch, pos, ...] fitted to a run's activation of `shape` [..., batch',
    pos', ...] (ref.dim() trailing dims): its first pos' positions (attention is causal: they do not depend on
    later ones), the batch repeated when batch' is a multiple of batch (copies stacked along the batch, as
    the patching engine stacks them). Leading dims beyond ref's broadcast. pos_dims: ref's position dims."""
    if len(shape) < ref.dim():
        raise CircuitlabError(f"frozen mode: {what} was recorded as {list(ref.shape)}; this run's activation "
                              f"{list(shape)} has fewer dims")
    shape = shape[len(shape) - ref.dim():]
    for d in pos_dims:
        if shape[d] > ref.shape[d]:
            raise CircuitlabError(f"frozen mode: the reference run has {ref.shape[d]} positions, this run "
                                  f"{shape[d]}; run at most as many positions as the reference")
        if shape[d] < ref.shape[d]:
            ref = ref.narrow(d, 0, shape[d])
    if shape[0] != ref.shape[0]:
        if shape[0] % ref.shape[0]:
            raise CircuitlabError(f"frozen mode: the reference run has batch {ref.shape[0]}, this run "
                                  f"{shape[0]}; use the same batch or a multiple of it (stacked copies)")
        ref = ref.repeat(shape[0] // ref.shape[0], *([1] * (ref.dim() - 1)))
    return ref


def make_norm(cfg: ModelConfig) -> Norm | nn.Identity:
    return Norm(cfg) if cfg.norm != "none" else nn.Identity()


def rotary_frequencies(cfg: ModelConfig, local: bool = False, long: bool = False) -> torch.Tensor:
    """Angular frequency of each rotated pair [rot_dim / 2] (float64), after cfg.rope_scaling; `local`: the
    sliding-window layers' frequencies (cfg.local_rotary_base, unscaled; Gemma-3); `long`: LongRoPE's set for
    sequences longer than its original context (else its short set)."""
    d = cfg.rot_dim
    base = cfg.local_rotary_base if local else cfg.rotary_base
    assert base is not None  # local tables are built only when cfg.local_rotary_base is set
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = None if local else cfg.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling["type"] == "longrope":  # each frequency divided by its own factor
        return inv_freq / torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
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

    # Buffers registered in __init__: [n_ctx, rot_dim] (the _long pair only for LongRoPE past its original context).
    cos: torch.Tensor
    sin: torch.Tensor
    cos_long: torch.Tensor
    sin_long: torch.Tensor

    def __init__(self, cfg: ModelConfig, local: bool = False) -> None:
        super().__init__()
        self.rot_dim = cfg.rot_dim
        self.local = local
        self.interleaved = cfg.rotary_interleaved
        scaling = None if local else cfg.rope_scaling
        longrope = scaling if scaling is not None and scaling["type"] == "longrope" else None
        # LongRoPE (Phi-3): the long set serves sequences longer than the original context, as transformers does
        switch_at: int | None = longrope["original_max_position_embeddings"] if longrope is not None else None
        self.switch_at = switch_at
        gain = longrope["attention_factor"] if longrope is not None else 1.0
        long_too = switch_at is not None and cfg.n_ctx > switch_at
        for suffix, long in [("", False)] + ([("_long", True)] if long_too else []):
            angles = torch.outer(torch.arange(cfg.n_ctx, dtype=torch.float64), rotary_frequencies(cfg, local, long))
            angles = angles.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat([angles, angles], dim=-1)
            self.register_buffer("cos" + suffix, (angles.cos() * gain).float(), persistent=False)
            self.register_buffer("sin" + suffix, (angles.sin() * gain).float(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x [batch, pos, head, d_head] -> same, rotated by absolute position offset + i."""
        T = x.shape[1]
        long = self.switch_at is not None and offset + T > self.switch_at  # LongRoPE's long set
        table_cos, table_sin = (self.cos_long, self.sin_long) if long else (self.cos, self.sin)
        cos = table_cos[offset:offset + T, None, :].to(x.dtype)
        sin = table_sin[offset:offset + T, None, :].to(x.dtype)
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
        self.qkv = Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv) * self.d_head, bias=cfg.bias)
        self.out = Linear(self.n_heads * self.d_head, cfg.d_model, bias=cfg.bias) if cfg.use_attn_out else None
        self.rotary: Rotary | None
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
        # Set by Transformer.frozen() (None otherwise): a reference run's pattern [batch, head, query_pos,
        # key_pos], detached; attention then mixes values with it and computes no scores
        # (V alone is projected: hook_q and hook_k do not fire).
        self.frozen_pattern: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, kv_cache: "LayerKV | None" = None) -> torch.Tensor:
        """x [batch, pos, d_model] -> attention output [batch, pos, d_model]."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv, self.d_head
        if self.frozen_pattern is not None:  # q and k are dead under a frozen pattern: project V alone
            v = stored_linear(x, *self._v_weights())
            z = self._attend(None, None, v.view(B, T, K, D), kv_cache)
        else:
            q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=-1)
            z = self._attend(q.view(B, T, H, D), k.view(B, T, K, D), v.view(B, T, K, D), kv_cache)
        if self.hook_result.active:
            out = self.hook_result(self._per_head(z)).sum(dim=2)
            return out + self.out.bias if self.out is not None and self.out.bias is not None else out
        if self.out is None:
            return z.sum(dim=2)
        return self.out(z.reshape(B, T, H * D))

    def split_forward(self, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor) -> torch.Tensor:
        """Attention with a separate input per head and role (TransformerLens's use_split_qkv_input).

        q_in [..., pos, n_heads, d_model]: each query head's input; k_in, v_in [..., pos, n_kv_heads,
        d_model]: each key / value head's input (already normalised: Block.split_attention applies ln1).
        Leading dims (copies, batch) are flattened into one batch. Returns each head's output z @ W_O,
        without b_O: [..., pos, n_heads, d_model]; with equal inputs their sum + b_O is forward(x).
        Hooks fire as in forward (hook_q .. hook_z, hook_result on [batch, pos, head, d_model]).
        """
        H, K, D = self.n_heads, self.n_kv, self.d_head
        lead, T = q_in.shape[:-3], q_in.shape[-3]
        # [q heads, k heads, v heads; d_head, d_model], in the inputs' dtype (one layer upcast when stored in half)
        W = upcast(self.qkv.weight, q_in).view(H + 2 * K, D, -1)
        b = upcast(self.qkv.bias, q_in).view(H + 2 * K, D) if self.qkv.bias is not None else None

        def project(x: torch.Tensor, rows: slice) -> torch.Tensor:
            t = torch.einsum("...phm,hdm->...phd", x, W[rows])
            return (t + b[rows] if b is not None else t).reshape(-1, T, t.shape[-2], D)

        dead = self.frozen_pattern is not None  # q and k are dead under a frozen pattern
        q = None if dead else project(q_in, slice(0, H))
        k = None if dead else project(k_in, slice(H, H + K))
        z = self._attend(q, k, project(v_in, slice(H + K, H + 2 * K)), None)  # [batch', pos, n_heads, d_head]
        return self.hook_result(self._per_head(z)).reshape(*lead, T, H, -1)

    def qk_of_parts(self, x: torch.Tensor, pos: int, role: str) -> torch.Tensor:
        """Frozen mode: normalised inputs x [n + 1, d_model] at absolute position pos, the last row the constant
        (ln1's bias) -> each row's share of every head's query (role "q": [n + 1, n_heads, d_head]) or key ("k":
        [n + 1, n_kv_heads, d_head]) as _attend computes it: W_Q / W_K, q/k norm with the reference's scale at
        pos, rotary at pos; b_Q / b_K and the q/k norm's bias go to the last row. The rows' sum is the query or
        key the model computed at pos (every step is linear once the scales are frozen)."""
        H, K, D = self.n_heads, self.n_kv, self.d_head
        heads, start = (H, 0) if role == "q" else (K, H * D)
        y = stored_linear(x, self.qkv.weight[start:start + heads * D])      # [n + 1, heads * D], x's dtype
        if self.qkv.bias is not None:
            y = torch.cat([y[:-1], y[-1:] + upcast(self.qkv.bias[start:start + heads * D], x)])
        if self.cfg.qk_norm != "none":
            norm = self.q_norm if role == "q" else self.k_norm
            if norm.frozen_scale is None:
                raise CircuitlabError("qk_of_parts needs frozen mode (the reference run's q/k norm scales)")
            scale = norm.frozen_scale[0, pos]                                  # [heads, 1] or [1]
            if self.cfg.qk_norm == "head":
                y = y.view(-1, heads, D)
            y = norm.linear(y, scale)
            y = torch.cat([y[:-1], y[-1:] + norm.bias])
        y = y.reshape(-1, heads, D)
        if self.rotary is not None:  # a rotation by the absolute position: linear, part by part
            y = self.rotary(y[:, None], offset=pos)[:, 0]
        return y

    def kv_head(self, head: int) -> int:
        """The key/value head a query head reads (grouped-query attention shares one among n_heads // n_kv)."""
        return head // (self.n_heads // self.n_kv)

    def score_terms(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q [n, d_head], k [m, d_head] (one head's, parts of a query and a key) -> [n, m] their products times
        the score scale: the terms of the score before any soft-cap and mask (their sum is the raw score)."""
        return (q @ k.T) * self.scale

    def _v_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The V rows of the fused projection: weight [n_kv_heads * d_head, d_model], bias (or None)."""
        start = (self.n_heads + self.n_kv) * self.d_head
        bias = self.qkv.bias[start:] if self.qkv.bias is not None else None
        return self.qkv.weight[start:], bias

    def _per_head(self, z: torch.Tensor) -> torch.Tensor:
        """z [batch, pos, head, d_head] -> each head's output [batch, pos, head, d_model] (no b_O)."""
        if self.out is None:  # V-only heads write z itself (d_head == d_model)
            return z
        w_o = upcast(self.out.weight, z).T.reshape(self.n_heads, self.d_head, -1)  # [head, d_head, d_model]
        return torch.einsum("bphd,hdm->bphm", z, w_o)

    def _attend(self, q: torch.Tensor | None, k: torch.Tensor | None, v: torch.Tensor,
                kv_cache: "LayerKV | None") -> torch.Tensor:
        """q [batch, pos, n_heads, d_head]; k, v [batch, pos, n_kv_heads, d_head] (as projected) ->
        z [batch, pos, n_heads, d_head] (through hook_z). In frozen mode the pattern is the reference's
        and q, k are None (not computed: hook_q / hook_k do not fire)."""
        if self.frozen_pattern is not None:
            return self.hook_z(self._frozen(self.frozen_pattern, self.hook_v(v), kv_cache))
        assert q is not None and k is not None
        B, T, H, D = q.shape
        K = k.shape[2]
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
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
            mask = None if plain else _causal_mask(T, S, offset, q.device, self.window)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=plain,
                                               scale=self.scale, enable_gqa=K != H)
        return self.hook_z(z.transpose(1, 2))

    def _frozen(self, frozen_pattern: torch.Tensor, v: torch.Tensor, kv_cache: "LayerKV | None") -> torch.Tensor:
        """pattern (the reference's, detached) @ v: v [batch, pos, n_kv_heads, d_head] -> z [batch, pos, head, d_head]."""
        if kv_cache is not None:
            raise CircuitlabError("frozen mode runs whole sequences: it cannot decode with a KV cache")
        B, T = v.shape[:2]
        pattern = fit_reference(frozen_pattern, (B, self.n_heads, T, T), "an attention pattern", (2, 3))
        pattern = self.hook_pattern(pattern.to(v.dtype))
        v = v.transpose(1, 2)  # [batch, kv_head, pos, d_head]
        if self.n_kv != self.n_heads:
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        return (pattern @ v).transpose(1, 2)

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
        """Scores and pattern made explicit (hookable). q [b, H, T, D]; k, v [b, K, S, D] -> z [b, H, T, D]."""
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        T, S = q.shape[2], k.shape[2]
        # In place on the fresh product: the same numbers as (q @ k^T) * scale, two [b, H, T, S] copies fewer.
        scores = (q @ k.transpose(-1, -2)).mul_(self.scale)
        if self.softcap is not None:  # c * tanh(s / c), in Gemma-2's order; out of place (tanh's backward needs it)
            scores = torch.tanh(scores / self.softcap) * self.softcap
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
    up projection; hook_post [batch, pos, d_mlp]: the neuron activations fed to fc_out; hook_out [batch, pos,
    d_model]: the MLP's output, before the block's post-MLP norm (circuit-tracer's mlp.hook_out) -- only in blocks
    that have one (cfg.block_norms "sandwich" or "post"): elsewhere that output is hook_mlp_out itself.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.mlp
        self.d_mlp = cfg.mlp_dim
        self.gated = self.kind in ("swiglu", "geglu")
        width = 2 * self.d_mlp if self.gated else self.d_mlp
        self.fc_in = Linear(cfg.d_model, width, bias=cfg.bias)
        self.fc_out = Linear(self.d_mlp, cfg.d_model, bias=cfg.bias)
        self.hook_pre = HookPoint()
        if self.gated:
            self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()
        self.hook_out = HookPoint() if cfg.block_norms != "pre" else None

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
        out = self.fc_out(self.hook_post(h))
        return self.hook_out(out) if self.hook_out is not None else out


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

    def attn_out_shares(self, result: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's share of what attention adds to the residual stream: result [..., pos, n_heads, d_model]
        (each head's z W_O, without b_O) -> (shares [..., pos, n_heads, d_model], rest [..., pos, d_model]) with
        shares.sum(-2) + rest == hook_attn_out. Pre-norm: the results themselves and b_O. Under a post-norm
        (ln1_post) a head's share is its result through the norm as the linear map it is at the scale of the
        whole output (this run's; the reference's in frozen mode), rest is b_O's share plus the norm's bias."""
        out = self.attn.out
        b_O = upcast(out.bias, result) if out is not None and out.bias is not None else \
            torch.zeros_like(result[..., 0, :])
        norm = self.ln1_post
        if self.cfg.block_norms == "pre" or not isinstance(norm, Norm):  # no post-norm (or an Identity one)
            return result, b_O.expand_as(result[..., 0, :])
        scale = norm.scale_of(result.sum(-2) + b_O)  # [..., pos, 1]
        return norm.linear(result, scale[..., None, :]), norm.linear(b_O, scale) + norm.bias

    def mlp_out(self, x: torch.Tensor) -> torch.Tensor:
        """What the MLP adds to the residual stream given the block's stream x [..., pos, d_model] (ln2, the MLP,
        ln2_post when there is one): hook_mlp_out."""
        return self.ln2_post(self.mlp(self.ln2(x)))

    def split_attention(self, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor) -> torch.Tensor:
        """This block's attention with a separate residual-stream input per head and role (TransformerLens's
        use_split_qkv_input): q_in [..., batch, pos, n_heads, d_model], k_in, v_in [..., batch, pos,
        n_kv_heads, d_model], each normalised by ln1 on its own -> each head's output [..., batch, pos,
        n_heads, d_model] without b_O and before any post-norm (ln1_post; Attention.split_forward). With every
        input equal to resid_pre, attn_out_shares of them sum to this block's hook_attn_out."""
        return self.attn.split_forward(*(per_head_norm(self.ln1, x) for x in (q_in, k_in, v_in)))

    def qk_parts(self, parts: torch.Tensor, pos: int, role: str) -> torch.Tensor:
        """Frozen mode: parts [n, d_model] of this block's input at absolute position pos (their sum is
        blocks.l.hook_resid_pre there, in the reference run) -> each part's share of every head's query (role
        "q") or key ("k") [n + 1, heads, d_head], through ln1 as the linear map it is at the reference's scale
        at pos, then Attention.qk_of_parts; row n is the constant no part carries (norm biases, b_Q / b_K)."""
        ln = self.ln1
        const = parts.new_zeros(1, parts.shape[-1])
        if isinstance(ln, Norm):
            if ln.frozen_scale is None:
                raise CircuitlabError("qk_parts needs frozen mode (the reference run's norm scales)")
            x = torch.cat([ln.linear(parts, ln.frozen_scale[0, pos]), const + ln.bias])
        else:
            x = torch.cat([parts, const])
        return self.attn.qk_of_parts(x, pos, role)


def per_head_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """norm applied to per-head residual inputs x [..., batch, pos, head, d_model] (the head dim moved in
    front, so a frozen scale [batch, pos, 1] broadcasts over heads)."""
    return norm(x.movedim(-2, 0)).movedim(0, -2)


if TYPE_CHECKING:
    class BlockList(nn.ModuleList):
        """Transformer.blocks as the type checker sees it: an nn.ModuleList of Block."""

        @overload
        def __getitem__(self, idx: slice) -> nn.ModuleList: ...
        @overload
        def __getitem__(self, idx: int) -> Block: ...
        def __getitem__(self, idx: int | slice) -> Block | nn.ModuleList: ...
        def __iter__(self) -> Iterator[Block]: ...
else:
    BlockList = nn.ModuleList  # at run time the plain container (no new class, no change to the module tree)
