"""QK and OV circuits read off the weights (products of weight matrices), copying scores, composition scores.

(Not to be confused with a circuit as an edge subgraph: analysis/edges/circuit.py.)

Following the Mathematical Framework (Elhage et al. 2021), in the row-vector orientation
(x @ W) of model.W_Q etc.:

- full QK circuit of a head: W_E W_Q W_Kᵀ W_Eᵀ [query token, key token], the score a query
  token gives a key token through the direct path (before the 1/sqrt(d_head) scale);
- positional QK circuit: the same with W_pos [query pos, key pos];
- full OV circuit: W_E W_V W_O W_U [source token, output token], what attending to a token does
  to the logits;
- direct path: W_E W_U, the bigram table of a 0-layer model.

All of them are FactoredMatrix objects of inner size d_head (or d_model), so a d_vocab x d_vocab
matrix is never built unless you ask for `.AB`.

Norms and biases: these functions read the raw weights and ignore b_Q, b_K, b_V and b_O.
Attention-only models without norms are covered exactly. For a model with LayerNorm or RMSNorm,
call `circuitlab.analysis.folding.fold_layer_norm(model)` first: it moves the norm gains and biases
into the weights, so all that is left of each norm is a positive scale per token (and, for
LayerNorm, a centring the folded weights already ignore). The circuits leave that scale out, as the
Framework paper does. Rotary models have no W_pos; their token QK circuit leaves the rotation out.

Architecture: the QK circuits read the residual stream through ln1 only and hold for every block layout.
Whatever involves W_O writing into the residual stream (OV circuits, OV eigenvalues and copying scores,
composition) needs heads whose outputs add straight into it (cfg.additive_heads: no post / sandwich
norm between W_O and the stream); other models are refused in one line (circuitlab.model.assumptions).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.analysis._json import from_rounded, rounded
from circuitlab.analysis.factored import FactoredMatrix
from circuitlab.errors import CircuitlabError
from circuitlab.model.assumptions import require
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer


# ---------------------------------------------------------------------------- circuits as matrices


def _layers(model: Transformer, layer: int | None) -> slice | int:
    if layer is None:
        return slice(None)
    if not 0 <= layer < model.cfg.n_layers:
        raise CircuitlabError(f"layer {layer} is out of range: the model has {model.cfg.n_layers} layers")
    return layer


def _check_head(model: Transformer, layer: int, head: int) -> None:
    _layers(model, layer)
    if not 0 <= head < model.cfg.n_heads:
        raise CircuitlabError(f"head {head} is out of range: the model has {model.cfg.n_heads} heads per layer")


@torch.no_grad()
def qk_circuit(model: Transformer, layer: int | None = None) -> FactoredMatrix:
    """Full QK circuit W_E W_Q W_Kᵀ W_Eᵀ.

    Returns FactoredMatrix [layer, head, d_vocab (query token), d_vocab (key token)], or
    [head, d_vocab, d_vocab] when layer is given. Inner size d_head.
    """
    sel = _layers(model, layer)
    W_E = model.W_E
    return FactoredMatrix(W_E @ model.W_Q[sel], (W_E @ model.W_K[sel]).transpose(-1, -2))


@torch.no_grad()
def pos_qk_circuit(model: Transformer, layer: int | None = None) -> FactoredMatrix:
    """Positional QK circuit W_pos W_Q W_Kᵀ W_posᵀ (learned positions only).

    Returns FactoredMatrix [layer, head, n_ctx (query pos), n_ctx (key pos)] ([head, ...] when layer
    is given). A previous-token head shows a bright sub-diagonal (before the causal mask).
    """
    sel = _layers(model, layer)
    W_pos = model.W_pos  # raises a CircuitlabError for rotary / no positions
    return FactoredMatrix(W_pos @ model.W_Q[sel], (W_pos @ model.W_K[sel]).transpose(-1, -2))


@torch.no_grad()
def ov_circuit(model: Transformer, layer: int | None = None) -> FactoredMatrix:
    """Full OV circuit W_E W_V W_O W_U.

    Returns FactoredMatrix [layer, head, d_vocab (attended token), d_vocab (output logit)]
    ([head, ...] when layer is given). A copying head has a large positive diagonal.
    """
    require(model, "the OV circuit", "additive_heads")
    sel = _layers(model, layer)
    return FactoredMatrix(model.W_E @ model.W_V[sel], model.W_O[sel] @ model.W_U)


@torch.no_grad()
def direct_path(model: Transformer) -> FactoredMatrix:
    """The direct path W_E W_U [d_vocab (input token), d_vocab (output logit)], inner size d_model:
    the bigram logits a 0-layer model predicts (without b_U)."""
    return FactoredMatrix(model.W_E, model.W_U)


@torch.no_grad()
def k_composition_qk_circuit(model: Transformer, head: tuple[int, int], prev_head: tuple[int, int]) -> FactoredMatrix:
    """QK circuit of `head` whose keys are read through the OV circuit of an earlier `prev_head`:
    W_E W_Q (W_E W_OV_prev W_K)ᵀ, [d_vocab (query token), d_vocab (token prev_head moved to the key)].

    For an induction head composed with a previous-token head this is the "attend to the token whose
    predecessor is me" circuit: a positive diagonal.
    """
    require(model, "K-composition through an OV circuit", "additive_heads")
    (layer, h), (prev_layer, prev_h) = head, prev_head
    _check_head(model, layer, h)
    _check_head(model, prev_layer, prev_h)
    if prev_layer >= layer:
        raise CircuitlabError(f"prev_head {prev_head} must be in an earlier layer than head {head}")
    W_E = model.W_E
    key_side = W_E @ model.W_V[prev_layer, prev_h] @ model.W_O[prev_layer, prev_h] @ model.W_K[layer, h]
    return FactoredMatrix(W_E @ model.W_Q[layer, h], key_side.T)


# ---------------------------------------------------------------------------- top entries


@dataclass
class TokenPairs:
    """The largest entries of a token-token circuit, best first."""

    values: list[float]
    rows: list[int]          # query / source token ids
    cols: list[int]          # key / output token ids
    row_strs: list[str] | None = None
    col_strs: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        pairs = []
        for i, (v, r, c) in enumerate(zip(self.values, self.rows, self.cols)):
            pair: dict[str, Any] = {"row": r, "col": c, "value": round(v, 6)}
            if self.row_strs is not None and self.col_strs is not None:
                pair.update(row_str=self.row_strs[i], col_str=self.col_strs[i])
            pairs.append(pair)
        return {"pairs": pairs}


def top_token_pairs(circuit: FactoredMatrix, k: int = 10, largest: bool = True, tokenizer=None) -> TokenPairs:
    """The k largest (or smallest) entries of a 2-D circuit [d_vocab, d_vocab] (e.g. qk_circuit(m)[l, h]),
    computed in row chunks. tokenizer: anything with decode(list[int]) -> str, for token strings."""
    if circuit.ndim != 2:
        raise CircuitlabError(f"top_token_pairs needs one head's 2-D circuit, got shape {tuple(circuit.shape)}; "
                              "index it first, e.g. circuit[layer, head]")
    values, rows, cols = circuit.topk(k, largest=largest)
    pairs = TokenPairs(values.tolist(), rows.tolist(), cols.tolist())
    if tokenizer is not None:
        pairs.row_strs = [tokenizer.decode([r]) for r in pairs.rows]
        pairs.col_strs = [tokenizer.decode([c]) for c in pairs.cols]
    return pairs


# ---------------------------------------------------------------------------- copying


@dataclass
class CopyingScores:
    """Copying score of each head's full OV circuit: Σλ / Σ|λ| over its eigenvalues, in [-1, 1].

    1 means every eigenvalue is positive: attending to a token raises that token's logit (copying).
    """

    scores: torch.Tensor  # [layer, head]
    threshold: float = 0.5

    def copying_heads(self) -> list[tuple[int, int]]:
        """Heads scoring at least the threshold, highest first."""
        heads = [(l, h) for l, h in torch.nonzero(self.scores >= self.threshold).tolist()]
        return sorted(heads, key=lambda lh: -float(self.scores[lh]))

    def to_dict(self) -> dict[str, Any]:
        return {"scores": rounded(self.scores), "threshold": self.threshold,
                "copying_heads": [head_name(l, h) for l, h in self.copying_heads()]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CopyingScores":
        """to_dict() read back (float64, so the written values come back exactly; copying_heads is derived)."""
        return cls(from_rounded(d["scores"]), d.get("threshold", 0.5))


def ov_eigenvalues(model: Transformer, layer: int, unembed_embed: torch.Tensor | None = None) -> torch.Tensor:
    """Eigenvalues (complex) [head, d_head] of the full OV circuits of one layer.

    They are those of the small matrix W_O W_U W_E W_V [d_head, d_head] (AB and BA share non-zero
    eigenvalues); W_U W_E [d_model, d_model] is formed once (or passed in: copying_scores forms it once for
    every layer), so nothing of size d_vocab per head is built.
    """
    require(model, "OV eigenvalues (copying scores)", "additive_heads")
    sel = _layers(model, layer)
    with torch.no_grad():
        if unembed_embed is None:
            unembed_embed = model.W_U @ model.W_E  # [d_model, d_model]
        inner = model.W_O[sel] @ unembed_embed @ model.W_V[sel]  # [head, d_head, d_head]
    return torch.linalg.eigvals(inner.float() if inner.dtype in (torch.float16, torch.bfloat16) else inner)


def copying_scores(model: Transformer, threshold: float = 0.5) -> CopyingScores:
    """Σλ / Σ|λ| of each head's full OV circuit W_E W_OV W_U -> CopyingScores with scores [layer, head].

    Σλ is the trace, so the score is real; it is 0 for a head with no OV circuit (all λ = 0).
    """
    per_layer = []
    with torch.no_grad():
        unembed_embed = model.W_U @ model.W_E if model.cfg.n_layers else None  # [d_model, d_model], once
    for layer in range(model.cfg.n_layers):
        lam = ov_eigenvalues(model, layer, unembed_embed)
        total = lam.abs().sum(-1)
        per_layer.append(torch.where(total > 0, lam.sum(-1).real / total.clamp(min=1e-30), torch.zeros_like(total)))
    scores = torch.stack(per_layer) if per_layer else torch.zeros(0, model.cfg.n_heads)
    return CopyingScores(scores.float(), threshold)


# ---------------------------------------------------------------------------- composition

MODES = ("q", "k", "v")


@dataclass
class CompositionScores:
    """Composition scores between every earlier head (writer) and later head (reader).

    q, k, v: [layer, head, layer, head]; entry [l1, h1, l2, h2] scores how much head (l1, h1)'s
    output feeds the queries / keys / values of head (l2, h2). NaN where l1 >= l2 (no path).
    baseline_mean / baseline_std: the score of random matrices of the same shapes.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    baseline_mean: float
    baseline_std: float
    n_baseline: int = 0
    # the threshold as written, when read back from JSON (from the unrounded baseline, so it can differ by 1e-6)
    written_threshold: float | None = field(default=None, repr=False, compare=False)

    def scores(self, mode: str) -> torch.Tensor:
        if mode not in MODES:
            raise CircuitlabError(f"composition mode must be one of q, k, v; got {mode!r}")
        return getattr(self, mode)

    @property
    def threshold(self) -> float:
        """Scores above baseline mean + 3 std are unlikely for unrelated heads."""
        if self.written_threshold is not None:
            return self.written_threshold
        return self.baseline_mean + 3 * self.baseline_std

    def top(self, mode: str, n: int = 5) -> list[tuple[tuple[int, int], tuple[int, int], float]]:
        """The n strongest (writer, reader, score) pairs for a mode."""
        s = self.scores(mode)
        flat = torch.nan_to_num(s, nan=-1.0).flatten()
        order = flat.argsort(descending=True)[:n]
        order = order[flat[order] >= 0]  # drop the NaN (no-path) entries
        l1, h1, l2, h2 = torch.unravel_index(order, s.shape)
        return [((a, b), (c, d), float(s[a, b, c, d]))
                for a, b, c, d in zip(l1.tolist(), h1.tolist(), l2.tolist(), h2.tolist())]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {m: rounded(self.scores(m)) for m in MODES}
        d.update(baseline_mean=round(self.baseline_mean, 6), baseline_std=round(self.baseline_std, 6),
                 n_baseline=self.n_baseline, threshold=round(self.threshold, 6))
        d["top"] = {m: [{"writer": f"L{a[0]}H{a[1]}", "reader": f"L{b[0]}H{b[1]}", "score": round(s, 6)}
                        for a, b, s in self.top(m)] for m in MODES}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CompositionScores":
        """to_dict() read back (float64, None as NaN: the written values come back exactly; the top pairs and
        the threshold are derived)."""
        q, k, v = (from_rounded(d[m]) for m in MODES)
        return cls(q, k, v, d["baseline_mean"], d["baseline_std"], d.get("n_baseline", 0), d.get("threshold"))


def composition_score(left: FactoredMatrix, right: FactoredMatrix) -> torch.Tensor:
    """‖L R‖_F / (‖L‖_F ‖R‖_F) for FactoredMatrix L [..., d, d] and R [..., d, d] (broadcast) -> [...].
    A zero matrix (a dead head) composes with nothing: its score is 0, not 0/0."""
    denom = left.norm() * right.norm()
    return torch.where(denom > 0, (left @ right).norm() / denom.clamp(min=1e-30), torch.zeros_like(denom))




def _packed_gram(A: torch.Tensor, B: torch.Tensor, inner: torch.Tensor, side: str) -> torch.Tensor:
    """The Gram matrices of M = A B (A [n, d, k], B [n, k, d]) packed for Frobenius inner products: side "right"
    gives Mᵀ M = Bᵀ (Aᵀ A) B, side "left" M Mᵀ = A (B Bᵀ) Aᵀ (inner: the k x k Gram Aᵀ A or B Bᵀ), each [d, d]
    symmetric, packed to its upper triangle [n, d (d + 1) / 2] with the off-diagonal entries scaled by √2, so that
    packed(P) · packed(Q) = ⟨P, Q⟩_F = trace(P Q)."""
    full = B.transpose(-1, -2) @ inner @ B if side == "right" else A @ inner @ A.transpose(-1, -2)
    d = full.shape[-1]
    i, j = torch.triu_indices(d, d, device=full.device)
    scale = torch.where(i == j, 1.0, 2.0 ** 0.5).to(full.dtype)
    return full[:, i, j] * scale


def composition_flops(cfg: Any) -> float:
    """The flops of composition_scores: each head's d_model x d_model Gram matrices, then one packed inner
    product (d_model (d_model + 1) / 2 terms) per (earlier head, later head, mode)."""
    L, H, d, k = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.head_dim
    grams = 4 * L * H * (2 * d * k * k + 2 * d * d * k)   # the writers' and the three readers'
    pairs = 3 * H * H * L * (L - 1) / 2
    return float(grams + 2 * pairs * d * (d + 1) / 2)


COMPOSITION_EFFICIENCY = 0.09   # the packed inner products' share of the matmul probe (SmolLM2: 86 GFLOP, 5.5 s)


def copying_flops(cfg: Any) -> float:
    """The flops of copying_scores: W_U W_E once, each head's W_O (W_U W_E) W_V, its d_head eigenvalues (~25 k³)."""
    L, H, d, k = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.head_dim
    return float(2 * cfg.d_vocab * d * d + L * H * (2 * k * d * d + 2 * d * k * k + 25 * k ** 3))


COPYING_EFFICIENCY = 0.06   # eigenvalues run far below the probe's speed (SmolLM2: 44 GFLOP, 4.5 s)

WRITER_CHUNK_BYTES = 256 * 2 ** 20   # the packed writer Grams held at once (SmolLM2's 270 heads: 180 MiB)


@torch.no_grad()
def composition_scores(model: Transformer, n_baseline: int = 200, seed: int = DEFAULT_SEED) -> CompositionScores:
    """Q-, K- and V-composition scores between all pairs of heads in different layers.

    In x @ W orientation, head (l1, h1) writes x W_OV1 into the residual stream; a later head reads it
    through its queries (Q: W_OV1 W_QK2), keys (K: W_OV1 W_QK2ᵀ) or values (V: W_OV1 W_OV2).
    The score is ‖W_OV1 M2‖_F / (‖W_OV1‖_F ‖M2‖_F). It is computed from Gram matrices, never forming a product
    per head pair: ‖W M‖²_F = trace(Wᵀ W · M Mᵀ) = ⟨Wᵀ W, M Mᵀ⟩_F, where Wᵀ W = W_Oᵀ (W_Vᵀ W_V) W_O is formed once
    per writer and M Mᵀ once per reader (each [d_model, d_model], from d_head x d_head Grams of the factors), so a
    pair costs one inner product (composition_flops); ‖W‖²_F and ‖M‖²_F are their traces.
    The baseline is the same score for random Gaussian factors of the same shapes (n_baseline draws);
    for i.i.d. factors the three modes share one distribution, so one baseline serves all three.
    Returns CompositionScores with q, k, v [layer, head, layer, head].
    """
    require(model, "composition scores", "additive_heads")
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    out = {m: torch.full((L, H, L, H), float("nan")) for m in MODES}
    dtype = torch.float32 if model.W_V.dtype in (torch.float16, torch.bfloat16) else model.W_V.dtype
    W_Q, W_K, W_V, W_O = (w.to(dtype) for w in (model.W_Q, model.W_K, model.W_V, model.W_O))

    def gram(a: torch.Tensor) -> torch.Tensor:   # [n, d, k] -> [n, k, k]
        return a.transpose(-1, -2) @ a

    def reader(mode: str, layer: int) -> torch.Tensor:   # [head, packed]: M Mᵀ of each head's M in this mode
        A, B = {"q": (W_Q[layer], W_K[layer].transpose(-1, -2)), "k": (W_K[layer], W_Q[layer].transpose(-1, -2)),
                "v": (W_V[layer], W_O[layer])}[mode]
        return _packed_gram(A, B, B @ B.transpose(-1, -2), "left")

    per_writer = H * d * (d + 1) // 2 * torch.finfo(dtype).bits // 8
    step = max(1, min(L, WRITER_CHUNK_BYTES // per_writer))
    trace_idx = None
    for first in range(0, L - 1, step):      # writer layers first .. first + step - 1, packed together
        last = min(first + step, L - 1)
        writers = _packed_gram(W_V[first:last].flatten(0, 1), W_O[first:last].flatten(0, 1),
                               gram(W_V[first:last].flatten(0, 1)), "right")         # [n_writers, packed]
        if trace_idx is None:
            i, j = torch.triu_indices(d, d, device=writers.device)
            trace_idx = (i == j).nonzero()[:, 0]   # the packed entries on the diagonal: their sum is the trace
        w_norm = writers[:, trace_idx].sum(-1).clamp(min=0).sqrt()                   # ‖W_OV‖_F
        for l2 in range(first + 1, L):
            n = (min(last, l2) - first) * H      # writers in layers before l2
            for m in MODES:
                r = reader(m, l2)                                                    # [head2, packed]
                r_norm = r[:, trace_idx].sum(-1).clamp(min=0).sqrt()
                num = (writers[:n] @ r.T).clamp(min=0).sqrt()                        # [n, head2]
                denom = w_norm[:n, None] * r_norm[None]
                score = torch.where(denom > 0, num / denom.clamp(min=1e-30), torch.zeros_like(denom))
                out[m][first:first + n // H, :, l2, :] = score.view(n // H, H, H).float()
    mean, std = composition_baseline(model.cfg.d_model, model.cfg.head_dim, n_baseline, seed)
    return CompositionScores(out["q"], out["k"], out["v"], mean, std, n_baseline)


@functools.lru_cache(maxsize=32)  # pure in its arguments, and the same shapes recur for every call on a model
def composition_baseline(d_model: int, d_head: int, n_samples: int = 200, seed: int = DEFAULT_SEED
                         ) -> tuple[float, float]:
    """Mean and std of the composition score of random rank-d_head matrices [d_model, d_model]
    (Gaussian factors [d_model, d_head] @ [d_head, d_model]); the scale of the factors does not matter."""
    if n_samples < 2:
        raise CircuitlabError(f"the composition baseline needs at least 2 samples, got {n_samples}")
    gen = torch.Generator().manual_seed(seed)

    def draw() -> FactoredMatrix:
        return FactoredMatrix(torch.randn(n_samples, d_model, d_head, generator=gen),
                              torch.randn(n_samples, d_head, d_model, generator=gen))

    scores = composition_score(draw(), draw())
    return float(scores.mean()), float(scores.std())
