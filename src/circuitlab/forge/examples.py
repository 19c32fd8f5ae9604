"""Hand-built heads with known ground truth: a previous-token head, a 2-layer induction circuit, and
a positional head that copies from a fixed distance back (the shortcut an induction detector must reject).

    pt = build_previous_token_model(d_vocab=20, n_ctx=32)
    pt.roles                       # {(0, 0): "previous_token"}
    ind = build_induction_model(d_vocab=20, n_ctx=32)
    ind.heads_with_role("induction")   # [(1, 0)]
    fake = build_positional_copy_model(k=15)   # attends 15 back: induction on [r, r] of period 16 only

They are fixtures for detectors and patching: every head's job is known exactly, including heads
that attend somewhere but write nothing (their patching effect is exactly zero).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from circuitlab.errors import CircuitlabError
from circuitlab.forge.builder import Forge, ResidualLayout
from circuitlab.model.transformer import Transformer


@dataclass
class HandBuilt:
    """A hand-built model with the ground truth of its heads.

    roles: (layer, head) -> role name ("previous_token", "induction", "current_token", "first_token").
    writes: (layer, head) -> whether the head writes anything into the residual stream.
    """

    model: Transformer
    layout: ResidualLayout
    roles: dict[tuple[int, int], str]
    writes: dict[tuple[int, int], bool] = field(default_factory=dict)
    description: str = ""

    def heads_with_role(self, role: str) -> list[tuple[int, int]]:
        return [lh for lh, r in self.roles.items() if r == role]


def _check_sizes(d_vocab: int, n_ctx: int, sharpness: float) -> None:
    for name, v, low in (("d_vocab", d_vocab, 2), ("n_ctx", n_ctx, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise CircuitlabError(f"{name} must be an integer >= {low}, got {v!r}")
    if not sharpness > 0:
        raise CircuitlabError(f"sharpness must be positive, got {sharpness}")


def _shift(n: int) -> torch.Tensor:
    """[n, n] with 1 at (j, j + 1): position j's one-hot becomes position j + 1's."""
    return torch.diag(torch.ones(n - 1), diagonal=1)


def _previous_token_head(f: Forge, layer: int, head: int, n_ctx: int, d_vocab: int, sharpness: float,
                         write_to: str) -> None:
    # QK: q(p) = sharpness · onehot(p), k(j) = onehot(j + 1), so score(p, j) = sharpness · [j = p - 1].
    # Position 0 has no previous token; its only key is itself (score 0), so it attends to itself.
    # OV: copy the key's token one-hot (head dims 0..d_vocab-1) into `write_to`.
    h = f.head(layer, head)
    h.q("pos", sharpness, into=0).k("pos", _shift(n_ctx), into=0)
    h.v("tok", 1.0, into=0).o(write_to, 1.0, from_=0)


def build_previous_token_model(d_vocab: int = 20, n_ctx: int = 32, sharpness: float = 20.0) -> HandBuilt:
    """One layer, one head that attends from every position p to p - 1 and copies that token.

    The logits at p are the one-hot of the token at p - 1 (at p = 0: its own token), so
    argmax(logits[:, p]) == tokens[:, p - 1]. Residual: tok (one-hot token), pos (one-hot
    position), prev (the head's output); d_head = max(n_ctx, d_vocab).
    """
    _check_sizes(d_vocab, n_ctx, sharpness)
    layout = ResidualLayout({"tok": d_vocab, "pos": n_ctx, "prev": d_vocab})
    f = Forge(layout, n_layers=1, n_heads=1, d_head=max(n_ctx, d_vocab), d_vocab=d_vocab, n_ctx=n_ctx,
              positional="learned")
    eye_v, eye_p = torch.eye(d_vocab), torch.eye(n_ctx)
    for t in range(d_vocab):
        f.embed(t, tok=eye_v[t])          # W_E: token t -> onehot(t) on "tok"
        f.unembed(t, prev=eye_v[t])       # W_U: logit[t] = prev[t]
    for p in range(n_ctx):
        f.pos(p, pos=eye_p[p])            # W_pos: position p -> onehot(p) on "pos"
    _previous_token_head(f, 0, 0, n_ctx, d_vocab, sharpness, "prev")
    return HandBuilt(f.model, layout, {(0, 0): "previous_token"}, {(0, 0): True},
                     "one previous-token head; logits = one-hot of the previous token")


def build_induction_model(d_vocab: int = 20, n_ctx: int = 32, sharpness: float = 20.0,
                          d_mlp: int | None = None) -> HandBuilt:
    """Two layers, two heads each: an induction circuit plus two heads that write nothing.

    L0H0 previous-token head: writes the previous token into "prev".
    L0H1 current-token head: attends to its own position; writes nothing.
    L1H0 induction head: at position p, attends to the positions j whose previous token equals
         tok(p) (K-composition with L0H0 through "prev") and copies tok(j) into "out".
    L1H1 first-token head: attends to position 0; writes nothing.
    Logits = "out", so on a repeated random sequence the second repeat is predicted exactly:
    argmax(logits[:, p]) == tokens[:, p + 1] for p in the second half (up to the last position).
    d_mlp: give the blocks MLPs of that width, all zero (they compute nothing: a replacement model of it has
    exact transcoders, as attribution graphs need).
    """
    _check_sizes(d_vocab, n_ctx, sharpness)
    layout = ResidualLayout({"one": 1, "tok": d_vocab, "pos": n_ctx, "prev": d_vocab, "out": d_vocab})
    mlps = {} if d_mlp is None else {"d_mlp": d_mlp}
    f = Forge(layout, n_layers=2, n_heads=2, d_head=max(n_ctx, d_vocab + 1), d_vocab=d_vocab, n_ctx=n_ctx,
              positional="learned", **mlps)
    eye_v, eye_p = torch.eye(d_vocab), torch.eye(n_ctx)
    for t in range(d_vocab):
        f.embed(t, one=1, tok=eye_v[t])   # W_E: [one = 1, tok = onehot(t)]
        f.unembed(t, out=eye_v[t])        # W_U: logit[t] = out[t]
    for p in range(n_ctx):
        f.pos(p, pos=eye_p[p])            # W_pos: onehot(p) on "pos"

    _previous_token_head(f, 0, 0, n_ctx, d_vocab, sharpness, "prev")
    # L0H1, current token: score(p, j) = sharpness · onehot(p)·onehot(j) = sharpness · [j = p]; OV zero.
    f.head(0, 1).q("pos", sharpness, into=0).k("pos", 1.0, into=0)
    # L1H0, induction: q = sharpness · onehot(tok(p)), k = onehot(prev(j)): score = sharpness when the
    # token before j is the current token. Position 0's "prev" is its own token (the previous-token
    # head attends to itself there), not a real previous token, so its key gets a -sharpness penalty
    # (head dim d_vocab: q reads "one", k reads pos[0] with weight -1).
    # OV: copy tok(j) into "out".
    h = f.head(1, 0)
    h.q("tok", sharpness, into=0).k("prev", 1.0, into=0)
    h.q("one", sharpness, into=d_vocab).k("pos", -eye_p[0], into=d_vocab)
    h.v("tok", 1.0, into=0).o("out", 1.0, from_=0)
    # L1H1, first token: q reads "one", k reads pos[0]: score = sharpness at position 0, 0 elsewhere. OV zero.
    f.head(1, 1).q("one", sharpness, into=0).k("pos", eye_p[0], into=0)

    roles = {(0, 0): "previous_token", (0, 1): "current_token", (1, 0): "induction", (1, 1): "first_token"}
    writes = {(0, 0): True, (0, 1): False, (1, 0): True, (1, 1): False}
    return HandBuilt(f.model, layout, roles, writes,
                     "previous-token head (L0H0) + induction head (L1H0); L0H1 and L1H1 attend but write nothing")


def build_positional_copy_model(k: int, d_vocab: int = 20, n_ctx: int = 32, sharpness: float = 20.0) -> HandBuilt:
    """The positional shortcut an induction detector must not be fooled by: the induction model's
    layout, but L1H0 attends a fixed k positions back (by position alone) and copies that token.

    On [r, r] with period k + 1 it attends exactly where an induction head would (the token after
    the previous occurrence), and nowhere right at any other period. L0H0 is the same previous-token
    head as in build_induction_model; L0H1 and L1H1 attend to the current / first token and write nothing.
    Queries p < k have no key k back and attend uniformly to positions 0..p.
    """
    _check_sizes(d_vocab, n_ctx, sharpness)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < n_ctx:
        raise CircuitlabError(f"k must be an integer in [1, {n_ctx - 1}], got {k!r}")
    layout = ResidualLayout({"one": 1, "tok": d_vocab, "pos": n_ctx, "prev": d_vocab, "out": d_vocab})
    f = Forge(layout, n_layers=2, n_heads=2, d_head=max(n_ctx, d_vocab), d_vocab=d_vocab, n_ctx=n_ctx,
              positional="learned")
    eye_v, eye_p = torch.eye(d_vocab), torch.eye(n_ctx)
    for t in range(d_vocab):
        f.embed(t, one=1, tok=eye_v[t])
        f.unembed(t, out=eye_v[t])
    for p in range(n_ctx):
        f.pos(p, pos=eye_p[p])
    _previous_token_head(f, 0, 0, n_ctx, d_vocab, sharpness, "prev")
    f.head(0, 1).q("pos", sharpness, into=0).k("pos", 1.0, into=0)
    # L1H0: q(p) = sharpness · onehot(p), k(j) = onehot(j + k): score(p, j) = sharpness · [j = p - k].
    h = f.head(1, 0)
    h.q("pos", sharpness, into=0).k("pos", torch.diag(torch.ones(n_ctx - k), diagonal=k), into=0)
    h.v("tok", 1.0, into=0).o("out", 1.0, from_=0)
    f.head(1, 1).q("one", sharpness, into=0).k("pos", eye_p[0], into=0)
    roles = {(0, 0): "previous_token", (0, 1): "current_token", (1, 0): f"positional_{k}_back", (1, 1): "first_token"}
    writes = {(0, 0): True, (0, 1): False, (1, 0): True, (1, 1): False}
    return HandBuilt(f.model, layout, roles, writes,
                     f"previous-token head (L0H0) + a head attending {k} positions back and copying (L1H0)")


__all__ = ["HandBuilt", "build_induction_model", "build_positional_copy_model", "build_previous_token_model"]
