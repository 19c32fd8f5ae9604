"""The exact n-digit + m-digit adder: it writes the answer digits as tokens, carries computed by attention and
two MLPs (build_carry_adder's docstring walks through each part)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from circuitlab.errors import CircuitlabError
from circuitlab.forge.adder_base import D_VOCAB, EOS, MAX_DIGITS, TokenAdder, _fmt, _token_name, digits_to_str
from circuitlab.forge.builder import Forge, ResidualLayout

if TYPE_CHECKING:
    import torch


class CarryAdder(TokenAdder):
    """The hand-built exact adder: answer digits as tokens, carries computed by attention and MLPs."""

    design = "carry"
    layout: ResidualLayout  # always built with one

    def _scalars(self, x: torch.Tensor, names: list[str]) -> dict[str, float]:
        """x [d_model] read on the named subspaces, each one-dimensional in this design."""
        return cast(dict[str, float], self.layout.describe(x, names))

    def explain(self, a: Any, b: Any) -> str:
        prompt = self.prompt(a, b)
        a, b = int(a), int(b)
        full = self.model.generate(prompt[None], self.n_answer, temperature=0)
        tokens = full[:, :-1]  # the last answer digit is predicted, never fed back
        _, cache = self.model.run_with_cache(tokens)
        names = [_token_name(t) for t in tokens[0].tolist()]
        n, m, K, P = self.n_digits_a, self.n_digits_b, self.n_answer, self.prompt_len
        cfg = self.model.cfg
        final = cache["blocks.1.hook_resid_post"][0]
        roles: dict[int, str] = {}
        for j in range(max(n, m)):
            holder = n + m - 1 - j if j < m else n - 1 - j
            roles[holder] = f"holds column 10^{j}" + (" (a+b)" if j < min(n, m) else "")
        for r in range(K):
            roles[P - 1 + r] = f"predicts column 10^{K - 1 - r}"
        show = ["a", "b", "is9", "gen", "carry", "wrap"]
        used = {"holds": {"is9", "gen"}, "predicts": {"a", "b", "carry", "wrap"}}
        lines = [f"{a} + {b} with the carry adder ({n}+{m} digits; {cfg.n_layers} layers, {cfg.n_heads} heads, "
                 f"d_model {cfg.d_model}, MLPs of {cfg.mlp_dim} ReLUs)",
                 "tokens: " + " ".join(names[:P]) + " | answer fed back: " + " ".join(names[P:]), "",
                 "each token's residual after both layers, on the subspaces the model computes (each is written "
                 "by one part:",
                 "a, b by layer 0's heads, is9, gen by MLP 0, carry by layer 1's head, wrap by MLP 1; "
                 "· = not used there):",
                 f"{'pos':>3} {'token':>5} {'role':<26}" + "".join(f"{s:>6}" for s in show)]
        for i, t in enumerate(names):
            role = roles.get(i, "")
            keep = used.get(role.split(" ")[0], set())
            if "(a+b)" in role:
                keep = keep | {"a"}
            vals = self._scalars(final[i], show)
            lines.append(f"{i:>3} {t:>5} {role:<26}" + "".join(
                f"{_fmt(vals[s]) if s in keep else '·':>6}" for s in show))
        lines += ["", "where each answer position attends, and what it predicts:"]
        digit_logits = self.model.readout(final)[:, :10]
        for r in range(K):
            pos, column = P - 1 + r, K - 1 - r
            att = []
            for layer, head, what in ((0, 0, "a"), (0, 1, "b"), (1, 0, "carry")):
                pattern = cache["pattern", layer][0, head, pos]
                k = int(pattern.argmax())
                att.append(f"{what} <- pos {k} ({names[k]}, {pattern[k]:.2f})")
            v = self._scalars(final[pos], ["a", "b", "carry", "wrap"])
            s = v["a"] + v["b"] + v["carry"] - 10 * v["wrap"]
            lines.append(f"  pos {pos} ({names[pos]}), column 10^{column}: " + ", ".join(att))
            lines.append(f"      {_fmt(v['a'])} + {_fmt(v['b'])} + carry {_fmt(v['carry'])}, wrap {_fmt(v['wrap'])} "
                         f"-> digit {_fmt(s)}; argmax of the logits: {int(digit_logits[pos].argmax())}")
        lines += ["", f"answer tokens, most significant first: {' '.join(str(int(d)) for d in full[0, P:])} "
                      f"-> {a} + {b} = {digits_to_str(full[0, P:])}"]
        return "\n".join(lines)


def build_carry_adder(n_digits_a: int = 2, n_digits_b: int | None = None, sharpness: float = 20.0) -> CarryAdder:
    """An exact adder of an n-digit and an m-digit number (n = n_digits_a, m = n_digits_b, default n).

    It writes the max(n, m) + 1 answer digits, most significant first, as tokens: argmax of the
    logits at EOS and at each answer digit gives the next digit. Two layers, two heads, two MLPs:

    layer 0   heads a, b: each answer position fetches its column's digit of a and of b (position
              targeting: score = sharpness·(2·t·p − p²), maximal at p = t, the target set by W_pos;
              EOS, digit 0, stands in for a digit a shorter number does not have). Head a also
              brings a_j to the last digit of each column j (its "holder": b_j, or a_j when b
              is shorter), where the column sum p_j = a_j + b_j now sits.
    MLP 0     at holders: gen_j = [p_j ≥ 10] (this column makes a carry) and is9_j = [p_j = 9]
              (it passes an incoming carry on).
    layer 1   head carry: the carry into column i is gen_j of the nearest column j < i that is not
              a 9, or 0 if there is none; the head finds that column by attention (lookup scores
              from W_pos) and copies its gen, with EOS (gen 0) as the fallback.
    MLP 1     wrap = [a_i + b_i + carry ≥ 10].
    unembed   digit s = a_i + b_i + carry − 10·wrap; logit_d = 2·d·s − d² = s² − (s − d)², largest at d = s.

    Every quantity is a small integer and every softmax picks one key with a margin of at least
    `sharpness` (e^-20 ≈ 2e-9 leaks elsewhere), so the argmax is exact; tested exhaustively up to
    3 digits and on random pairs beyond.
    """
    m_given = n_digits_a if n_digits_b is None else n_digits_b
    for name, v in (("n_digits_a", n_digits_a), ("n_digits_b", m_given)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIGITS:
            raise CircuitlabError(f"{name} must be an integer from 1 to {MAX_DIGITS}, got {v!r}")
    if not sharpness > 0:
        raise CircuitlabError(f"sharpness must be positive, got {sharpness}")
    cols = _Columns(n_digits_a, m_given)
    lam = float(sharpness)
    C = cols.C
    layout = ResidualLayout({
        "one": 1,                 # 1 on every token: the constant term of every hand-set affine map
        "digit": 1,               # the token's digit value (0 for EOS)
        "is_eos": 1,              # 1 on EOS: the carry lookup's fallback key
        "p": 1, "p2": 1,          # position p and p²: keys of the position-targeting heads
        "tgt_a": 1, "tgt_b": 1,   # per position: the position layer 0's head a / head b should read
        "paired": 1,              # 1 at the holder of a column that has both a digit of a and of b
        "col": C,                 # one-hot column index at each column's holder
        "lookup": C,              # at answer positions: the carry lookup's score for each column
        "a": 1, "b": 1,           # written by layer 0: the digits fetched by heads a and b
        "is9": 1, "gen": 1,       # written by MLP 0 at holders: column sum == 9, column sum >= 10
        "carry": 1,               # written by layer 1: the carry into this answer position's column
        "wrap": 1,                # written by MLP 1: this column's digit sum reaches 10
    })
    f = Forge(layout, n_layers=2, n_heads=2, d_head=C + 2, d_mlp=4, mlp="relu", use_attn_out=True,
              d_vocab=D_VOCAB, n_ctx=cols.n + cols.m + cols.K, positional="learned")
    _embeddings(f, cols, lam)
    _layer0(f, lam)
    _layer1(f, cols, lam)
    return CarryAdder(f.model, cols.n, cols.m, layout)


class _Columns:
    """Where each column's digits sit in an n-digit + m-digit problem [a digits, b digits, EOS]."""

    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m
        self.C = max(n, m)   # columns of the inputs, 0 = units
        self.K = self.C + 1  # answer digits
        self.eos_pos = n + m

    def pos_a(self, j: int) -> int:  # where a's digit of column j sits (EOS if a has no such digit)
        return self.n - 1 - j if j < self.n else self.eos_pos

    def pos_b(self, j: int) -> int:
        return self.n + self.m - 1 - j if j < self.m else self.eos_pos

    def holder(self, j: int) -> int:  # the last of column j's digits in the sequence
        return self.pos_b(j) if j < self.m else self.pos_a(j)

    def lookup_penalty(self, lam: float) -> float:
        """M: the score that puts a column out of the carry lookup's reach."""
        return lam * (self.C + 3)


def _embeddings(f: Forge, cols: _Columns, lam: float) -> None:
    """Token and position embeddings: what each token is, and what each position must look up."""
    n, m, C, K = cols.n, cols.m, cols.C, cols.K
    pos_a, pos_b, holder, EOS_POS = cols.pos_a, cols.pos_b, cols.holder, cols.eos_pos
    # Embedding: a digit token d is [one=1, digit=d]; EOS is [one=1, is_eos=1] (its digit value is 0).
    for d in range(10):
        f.embed(d, one=1, digit=d)
    f.embed(EOS, one=1, is_eos=1)

    # Positional embedding: p and p² everywhere; the rest says what each position must look up.
    for p in range(n + m + K):
        f.pos(p, p=p, p2=p * p)
    for j in range(C):
        f.pos(holder(j), col=[1.0 if c == j else 0.0 for c in range(C)])
        if j < min(n, m):  # b_j holds column j; head a brings it a_j
            f.pos(holder(j), paired=1, tgt_a=pos_a(j))
    # Carry lookup scores (layer 1), relative to EOS's fallback score lam: a column below the answer's
    # column that is not a 9 scores 2·lam + lam·c (nearer columns score higher); is9 subtracts M, which
    # puts 9s under the fallback; columns at or above the answer's column score -M.
    M = cols.lookup_penalty(lam)
    for r in range(K):  # answer position r (EOS, then each answer digit) predicts column i
        p, i = EOS_POS + r, K - 1 - r
        f.pos(p, tgt_a=pos_a(i), tgt_b=pos_b(i),
              lookup=[2 * lam + lam * c if c < i else -M for c in range(C)])


def _layer0(f: Forge, lam: float) -> None:
    """Layer 0: heads a and b fetch each column's digits; MLP 0 computes gen and is9 at the holders."""
    # Layer 0, heads a (0) and b (1): position targeting. q = [2·lam·tgt, -lam], k = [p, p²], so
    # score = lam·(2·tgt·p - p²) = lam·(tgt² - (p - tgt)²): the target wins by lam over its neighbours.
    # OV: read the digit (head dim 0) and write it into "a" / "b".
    for head, tgt, out in ((0, "tgt_a", "a"), (1, "tgt_b", "b")):
        h = f.head(0, head)
        h.q(tgt, 2 * lam, into=0).q("one", -lam, into=1)
        h.k("p", 1.0, into=0).k("p2", 1.0, into=1)
        h.v("digit", 1.0, into=0).o(out, 1.0, from_=0)

    # MLP 0, at holders: column sum s = digit + a where the column is paired, s = digit otherwise.
    # G = 30 switches neurons off: every digit sum is at most 18 < 30 - 10.
    # Paired:   n0 = ReLU(s - 8), n1 = ReLU(s - 9), n2 = ReLU(s - 10)  (zero unless paired = 1)
    #           gen = n1 - n2 = [s >= 10];  is9 = n0 - 2·n1 + n2 = [s == 9] (a triangle at 9).
    # Unpaired: n3 = ReLU(digit - 8) = [digit == 9] (digits stop at 9; zero when paired = 1), adds to is9.
    G = 30.0
    mlp0 = f.mlp(0)
    for i, threshold, write in ((0, 8, {"is9": 1.0}), (1, 9, {"gen": 1.0, "is9": -2.0}),
                                (2, 10, {"gen": -1.0, "is9": 1.0})):
        mlp0.neuron(i, read={"digit": 1.0, "a": 1.0, "paired": G, "one": -threshold - G}, write=write)
    mlp0.neuron(3, read={"digit": 1.0, "paired": -G, "one": -8.0}, write={"is9": 1.0})


def _layer1(f: Forge, cols: _Columns, lam: float) -> None:
    """Layer 1: the carry lookup head and MLP 1's wrap; the unembedding that turns them into the digit."""
    C, M = cols.C, cols.lookup_penalty(lam)
    # Layer 1, head 0 (carry lookup): score = lookup·col - M·is9 + lam·is_eos.
    # q = [lookup (C dims), -M, lam], k = [col (C dims), is9, is_eos]. OV: read gen, write carry.
    # Head 1 of layer 1 is unused (all zero).
    h = f.head(1, 0)
    h.q("lookup", 1.0, into=0).q("one", [-M, lam], into=[C, C + 1])
    h.k("col", 1.0, into=0).k("is9", 1.0, into=C).k("is_eos", 1.0, into=C + 1)
    h.v("gen", 1.0, into=0).o("carry", 1.0, from_=0)

    # MLP 1: wrap = [a + b + carry >= 10]. With carry in {0, 1}, t = 2(a + b) + carry is >= 19 exactly
    # then (a + b = 9 needs the carry; a + b >= 10 gives t >= 20; a + b <= 8 gives t <= 17).
    # wrap = ReLU(t - 18) - ReLU(t - 19).
    mlp1 = f.mlp(1)
    mlp1.neuron(0, read={"a": 2.0, "b": 2.0, "carry": 1.0, "one": -18.0}, write={"wrap": 1.0})
    mlp1.neuron(1, read={"a": 2.0, "b": 2.0, "carry": 1.0, "one": -19.0}, write={"wrap": -1.0})

    # Unembedding: logit_d = 2d·s - d² with s = a + b + carry - 10·wrap, so the argmax is d = s with a
    # margin of at least 1. EOS is never the answer: logit -1000.
    for d in range(10):
        f.unembed(d, a=2 * d, b=2 * d, carry=2 * d, wrap=-20 * d, one=-d * d)
    f.unembed(EOS, one=-1000.0)


