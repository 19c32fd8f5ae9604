"""Compare two models on the same inputs: accuracy, attention patterns per head, OV subspaces.

Meant for a hand-built model against a trained one (or a perturbed copy), but every function
takes any two Transformers that read the same tokens.

    agree = attention_agreement(hand.model, trained, tokens, query_positions=range(4, 7))
    agree.best_match()                     # {(0, 0): ((1, 3), 0.97), ...}
    ov = ov_alignment(hand.model, (0, 0), trained, (1, 3))   # principal angles in token space
    cmp = compare_adders(hand, trained)    # all of it for the addition task; cmp.to_dict() for JSON

Agreement of two attention distributions p, q over the same keys is 1 - TV(p, q), where
TV = ½·Σ|p - q| is the total-variation distance: 1 when identical, 0 when disjoint.

OV alignment compares the subspaces two heads read from (side="input") or write to
(side="output") through principal angles. Two models' residual streams have unrelated bases, so
by default the subspaces are taken in token space (basis="token"): the input subspace is the
column space of W_E·W_OV [d_vocab, d_model] (which token features the head moves), the output
subspace that of (W_OV·W_U)ᵀ (which logits it pushes). This sees only what a head reads
directly from the embeddings or writes directly to the unembedding; basis="residual" compares
W_OV's own column / row spaces, meaningful only for models that share a residual basis (a model
and its perturbed copy).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.errors import CircuitlabError
from circuitlab.forge.adder import EOS, Adder, PostAdder, TokenAdder, add_digits
from circuitlab.model.transformer import Transformer

COMPARE_SAMPLES = 1000  # random problems two adders' attention is compared on (`forge compare --samples`)

Head = tuple[int, int]



def _all_heads(model: Transformer) -> list[Head]:
    return [(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


def _label(head: Head) -> str:
    return f"L{head[0]}H{head[1]}"


# ---------------------------------------------------------------------- attention patterns
@dataclass
class AttentionAgreement:
    """agreement [len(heads_a), len(heads_b)]: mean over inputs and query positions of 1 - TV distance."""

    heads_a: list[Head]
    heads_b: list[Head]
    agreement: torch.Tensor

    def best_match(self) -> dict[Head, tuple[Head, float]]:
        """For each head of model a, the head of model b whose pattern agrees most, and the agreement."""
        out = {}
        for i, ha in enumerate(self.heads_a):
            j = int(self.agreement[i].argmax())
            out[ha] = (self.heads_b[j], float(self.agreement[i, j]))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"heads_a": [_label(h) for h in self.heads_a], "heads_b": [_label(h) for h in self.heads_b],
                "agreement": self.agreement.tolist(),
                "best_match": {_label(a): {"head": _label(b), "agreement": v}
                               for a, (b, v) in self.best_match().items()}}


def query_patterns(model: Transformer, tokens: torch.Tensor, heads: Sequence[Head] | None = None,
                   query_positions: Iterable[int] | None = None) -> torch.Tensor:
    """tokens [batch, pos] -> patterns [len(heads), batch, n_query, pos] of the chosen heads at the chosen
    query positions (runs the model; analysis.heads.attention_patterns stacks a cache's patterns instead)."""
    heads = list(heads) if heads is not None else _all_heads(model)
    layers = sorted({l for l, _ in heads})
    names = [f"blocks.{l}.attn.hook_pattern" for l in layers]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    q = _positions(query_positions, tokens.shape[1])
    return torch.stack([cache["pattern", l][:, h][:, q] for l, h in heads])


def attention_agreement(model_a: Transformer, model_b: Transformer, tokens: torch.Tensor,
                        query_positions: Iterable[int] | None = None, heads_a: Sequence[Head] | None = None,
                        heads_b: Sequence[Head] | None = None) -> AttentionAgreement:
    """How alike every head of model a attends to every head of model b, on the same tokens [batch, pos].

    query_positions: the query positions averaged over (default all). Returns AttentionAgreement.
    """
    if tokens.dim() != 2:
        raise CircuitlabError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    heads_a = list(heads_a) if heads_a is not None else _all_heads(model_a)
    heads_b = list(heads_b) if heads_b is not None else _all_heads(model_b)
    pa = query_patterns(model_a, tokens, heads_a, query_positions)  # [Ha, batch, q, k]
    pb = query_patterns(model_b, tokens, heads_b, query_positions)
    agreement = torch.empty(len(heads_a), len(heads_b))
    for i in range(len(heads_a)):
        tv = 0.5 * (pa[i][None] - pb).abs().sum(dim=-1)  # [Hb, batch, q]
        agreement[i] = 1 - tv.mean(dim=(1, 2))
    return AttentionAgreement(heads_a, heads_b, agreement)


def _positions(query_positions: Iterable[int] | None, length: int) -> list[int]:
    if query_positions is None:
        return list(range(length))
    q = [int(p) for p in query_positions]
    if not q or any(not -length <= p < length for p in q):
        raise CircuitlabError(f"query positions must lie in 0..{length - 1}, got {q}")
    return q


# ---------------------------------------------------------------------- OV subspaces
def orthonormal_basis(M: torch.Tensor, rank: int | None = None, rel_tol: float = 0.05) -> torch.Tensor:
    """M [n, k] -> an orthonormal basis [n, r] of its column space: the left singular vectors whose
    singular value is at least rel_tol × the largest (or the top `rank` of them)."""
    M = M.detach().double()
    if M.numel() == 0:
        return torch.zeros(M.shape[0], 0, dtype=torch.float64)
    U, S, _ = torch.linalg.svd(M, full_matrices=False)
    if rank is None:
        rank = int((S > rel_tol * S[0]).sum()) if S.numel() and S[0] > 0 else 0
    return U[:, :rank]


def principal_angles(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Principal angles (radians, ascending) between the column spaces of A [n, p] and B [n, q],
    each given by an orthonormal basis. Returns [min(p, q)]; 0 = a shared direction."""
    if A.shape[0] != B.shape[0]:
        raise CircuitlabError(f"subspaces live in different spaces: {A.shape[0]} vs {B.shape[0]} dims")
    if A.shape[1] == 0 or B.shape[1] == 0:
        return torch.zeros(0, dtype=torch.float64)
    cosines = torch.linalg.svdvals(A.double().T @ B.double()).clamp(0.0, 1.0)
    return torch.arccos(cosines).sort().values


def ov_subspace(model: Transformer, head: Head, side: str = "input", basis: str = "token",
                rank: int | None = None, rel_tol: float = 0.05) -> torch.Tensor:
    """Orthonormal basis [n, r] of what head (layer, index) reads (side="input") or writes ("output").

    basis "token": n = d_vocab (through W_E for input, W_U for output); "residual": n = d_model.
    """
    layer, h = head
    if not (0 <= layer < model.cfg.n_layers and 0 <= h < model.cfg.n_heads):
        raise CircuitlabError(f"head {_label(head)} does not exist: the model has {model.cfg.n_layers} layers "
                              f"of {model.cfg.n_heads} heads")
    if side not in ("input", "output"):
        raise CircuitlabError(f"side must be 'input' or 'output', got {side!r}")
    if basis not in ("token", "residual"):
        raise CircuitlabError(f"basis must be 'token' or 'residual', got {basis!r}")
    with torch.no_grad():
        W_OV = model.W_OV[layer, h]  # [d_model, d_model], applied as x @ W_OV
        if side == "input":  # x @ W_OV depends on x only through W_OV's column space
            M = model.W_E @ W_OV if basis == "token" else W_OV
        else:                # x @ W_OV lies in W_OV's row space
            M = (W_OV @ model.W_U).T if basis == "token" else W_OV.T
    return orthonormal_basis(M, rank, rel_tol)


@dataclass
class OVAlignment:
    """Principal angles between two heads' OV subspaces. similarity = mean cos² over the
    min(rank_a, rank_b) angles: 1 when the smaller subspace lies inside the larger, 0 when
    orthogonal, None when a head has no such subspace (e.g. it reads nothing from the tokens)."""

    head_a: Head
    head_b: Head
    side: str
    basis: str
    rank_a: int
    rank_b: int
    angles_deg: list[float] = field(default_factory=list)

    @property
    def similarity(self) -> float | None:
        if not self.angles_deg:
            return None
        return sum(math.cos(math.radians(a)) ** 2 for a in self.angles_deg) / len(self.angles_deg)

    def to_dict(self) -> dict[str, Any]:
        return {"head_a": _label(self.head_a), "head_b": _label(self.head_b), "side": self.side,
                "basis": self.basis, "rank_a": self.rank_a, "rank_b": self.rank_b,
                "angles_deg": self.angles_deg, "similarity": self.similarity}


def ov_alignment(model_a: Transformer, head_a: Head, model_b: Transformer, head_b: Head, side: str = "input",
                 basis: str = "token", rank: int | None = None, rel_tol: float = 0.05) -> OVAlignment:
    """Principal angles between head_a's OV subspace in model a and head_b's in model b."""
    if basis == "token" and model_a.cfg.d_vocab != model_b.cfg.d_vocab:
        raise CircuitlabError(f"token-space comparison needs the same vocabulary: {model_a.cfg.d_vocab} vs "
                              f"{model_b.cfg.d_vocab} tokens")
    if basis == "residual" and model_a.cfg.d_model != model_b.cfg.d_model:
        raise CircuitlabError(f"residual-space comparison needs the same d_model: {model_a.cfg.d_model} vs "
                              f"{model_b.cfg.d_model}; use basis='token'")
    A = ov_subspace(model_a, head_a, side, basis, rank, rel_tol)
    B = ov_subspace(model_b, head_b, side, basis, rank, rel_tol)
    angles = principal_angles(A, B)
    return OVAlignment(head_a, head_b, side, basis, A.shape[1], B.shape[1], torch.rad2deg(angles).tolist())


# ---------------------------------------------------------------------- the addition task
def addition_problems(n_digits_a: int, n_digits_b: int, samples: int, seed: int = DEFAULT_SEED) -> torch.Tensor:
    """Random problems with their answers, [samples, n + m + 1 + max(n, m) + 1] tokens (the task format)."""
    gen = torch.Generator().manual_seed(seed)
    da = torch.randint(0, 10, (samples, n_digits_a), generator=gen)
    db = torch.randint(0, 10, (samples, n_digits_b), generator=gen)
    answer = add_digits(da, db, max(n_digits_a, n_digits_b) + 1)
    return torch.cat([da, db, torch.full((samples, 1), EOS), answer], dim=1)


@dataclass
class AdderComparison:
    """A hand-built adder against another model on the same problems.

    accuracy_*: fraction of exact answers; agreement: attention agreement at the answer positions;
    matches: for each hand-built head, its best-agreeing head in the other model and their OV alignment.
    """

    accuracy_hand: float
    accuracy_other: float
    agreement: AttentionAgreement
    matches: list[dict[str, Any]]
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy_hand": self.accuracy_hand, "accuracy_other": self.accuracy_other,
                "samples": self.samples, "agreement": self.agreement.to_dict(), "matches": self.matches}


def used_heads(model: Transformer) -> list[Head]:
    """Heads with a nonzero QK or OV circuit (a hand-built model may leave some heads all zero)."""
    with torch.no_grad():
        qk = model.W_QK.flatten(2).abs().amax(-1)
        ov = model.W_OV.flatten(2).abs().amax(-1)
    return [(l, h) for l, h in _all_heads(model) if qk[l, h] > 0 or ov[l, h] > 0]


def check_token_adder(hand: Adder) -> None:
    """Comparisons need an adder that writes its answer as tokens."""
    if isinstance(hand, PostAdder):
        raise CircuitlabError("the post's adder reads its answer off the residual in Python, not as tokens; "
                              "compare the carry adder (build_carry_adder) instead")


def answer_agreement(hand: Adder, other: Transformer, tokens: torch.Tensor) -> AttentionAgreement:
    """Attention agreement of the hand-built adder's used heads with every head of other, at the answer
    positions of problems tokens [batch, pos] (the task format without its last token)."""
    return attention_agreement(hand.model, other, tokens, range(hand.prompt_len - 1, tokens.shape[1]),
                               heads_a=used_heads(hand.model))


def compare_adders(hand: Adder, other: Transformer, samples: int = COMPARE_SAMPLES, seed: int = DEFAULT_SEED,
                   basis: str = "token") -> AdderComparison:
    """Accuracy, per-head attention agreement (at the answer positions) and OV alignment of each
    used hand-built head with its best-agreeing head in `other`. Both models must read the task
    format and write the answer as tokens (the carry adder does; the post's design reads out in Python)."""
    check_token_adder(hand)
    n, m = hand.n_digits_a, hand.n_digits_b
    hand_tokens = TokenAdder(hand.model, n, m, hand.layout, hand.design)
    other_tokens = TokenAdder(other, n, m, design="other")
    acc_hand = hand_tokens.check(samples=samples, seed=seed, exhaustive=False, progress=False)
    acc_other = other_tokens.check(samples=samples, seed=seed, exhaustive=False, progress=False)
    agreement = answer_agreement(hand, other, addition_problems(n, m, samples, seed)[:, :-1])
    matches = []
    for head_a, (head_b, value) in agreement.best_match().items():
        ov_in = ov_alignment(hand.model, head_a, other, head_b, "input", basis)
        matches.append({"hand_head": _label(head_a), "other_head": _label(head_b), "agreement": value,
                        "ov_input": ov_in.to_dict()})
    return AdderComparison(acc_hand.correct / acc_hand.total, acc_other.correct / acc_other.total,
                           agreement, matches, samples)


__all__ = ["AdderComparison", "AttentionAgreement", "OVAlignment", "addition_problems", "attention_agreement",
           "attention_patterns", "compare_adders", "orthonormal_basis", "ov_alignment", "ov_subspace",
           "principal_angles", "used_heads"]
