"""Hand-built adders: the reference post's 2-digit design, and an exact n-digit + m-digit adder.

Token format (shared with circuitlab.data.synthetic.AdditionTask): digits 0..9 are tokens 0..9,
EOS is token 10. A problem is [digits of a, digits of b, EOS], each number written most
significant digit first and zero-padded to the width the model was built for; the answer is
max(n_a, n_b) + 1 digits, most significant first.

build_post_adder()   the post's design: 2 layers, one V-only head each, d_model 3. The EOS
                     residual ends at [units sum, tens sum, 1]; the answer 10·x1 + x0 is read off
                     it in Python, carries included.
build_carry_adder()  everything in the model: it writes the answer digits as tokens, read through
                     the unembedding (argmax), carries computed by attention and two MLPs, for
                     any digit counts n and m.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from circuitlab.errors import CircuitlabError
from circuitlab.forge.builder import Forge, ResidualLayout
from circuitlab.model.transformer import Transformer

EOS = 10
D_VOCAB = 11
MAX_DIGITS = 40  # the model grows with the digit count (d_model = 14 + 2·max(n, m)); checked exact up to here
EXHAUSTIVE_LIMIT = 1_000_000  # check every pair when there are at most this many


# ---------------------------------------------------------------------- operands and tokens
def parse_operand(value: Any, name: str, n_digits: int | None = None, hint: str = "") -> int:
    """An operand from user input (int or str) as an int; with n_digits, also checks it fits in
    n_digits digits. Anything else is a CircuitlabError (hint is appended to the too-many-digits one)."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.isdigit() or (text.startswith("-") and text[1:].isdigit())):
            raise CircuitlabError(f"{name} must be a whole number, got {value!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CircuitlabError(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise CircuitlabError(f"{name} must not be negative, got {value}")
    if n_digits is not None and value >= 10 ** n_digits:
        raise CircuitlabError(f"{name} = {value} has {len(str(value))} digits, but this adder was built for "
                              f"{n_digits}-digit {name}{hint}")
    return value


def digits_of(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [batch] (int64) -> [batch, n] digits, most significant first, zero-padded."""
    powers = 10 ** torch.arange(n - 1, -1, -1)
    return (x[:, None] // powers) % 10


def add_digits(da: torch.Tensor, db: torch.Tensor, n_out: int) -> torch.Tensor:
    """Schoolbook sum of digit tensors da [batch, n], db [batch, m] (most significant first)
    -> [batch, n_out] digits, most significant first. Works for any length (no int64 overflow).
    This is the checker's ground truth, not part of any model."""
    batch = da.shape[0]
    a = torch.zeros(batch, n_out, dtype=torch.long)
    b = torch.zeros(batch, n_out, dtype=torch.long)
    a[:, n_out - da.shape[1]:] = da
    b[:, n_out - db.shape[1]:] = db
    out = torch.zeros(batch, n_out, dtype=torch.long)
    carry = torch.zeros(batch, dtype=torch.long)
    for col in range(n_out - 1, -1, -1):
        total = a[:, col] + b[:, col] + carry
        out[:, col] = total % 10
        carry = total // 10
    return out


def digits_to_str(d: torch.Tensor) -> str:
    """[n] digits -> the number as text, without leading zeros."""
    return "".join(str(int(x)) for x in d).lstrip("0") or "0"


def _token_name(t: int) -> str:
    return "EOS" if t == EOS else str(t)


def _fmt(x: float) -> str:
    r = round(x, 3)
    return str(int(r)) if r == int(r) else f"{r:g}"


def _vec(values: list[float]) -> str:
    return "[" + ", ".join(_fmt(v) for v in values) + "]"


# ---------------------------------------------------------------------- results
@dataclass
class AdderCheck:
    """How many inputs an adder gets right. failures: up to 10 (a, b, model's answer)."""

    design: str
    n_digits_a: int
    n_digits_b: int
    correct: int
    total: int
    exhaustive: bool
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    note: str = ""

    @property
    def exact(self) -> bool:
        return self.correct == self.total

    def to_dict(self) -> dict[str, Any]:
        return {"design": self.design, "n_digits_a": self.n_digits_a, "n_digits_b": self.n_digits_b,
                "correct": self.correct, "total": self.total, "exhaustive": self.exhaustive,
                "failures": [list(f) for f in self.failures], "note": self.note}

    def __str__(self) -> str:
        which = (f"all a < 10^{self.n_digits_a}, b < 10^{self.n_digits_b}" if self.exhaustive
                 else "random pairs")
        line = f"{self.design} adder: {self.correct}/{self.total} inputs correct ({which})"
        if self.failures:
            line += "; e.g. " + ", ".join(f"{a}+{b} -> {got}" for a, b, got in self.failures[:3])
        return line + (f"\n  {self.note}" if self.note else "")


# ---------------------------------------------------------------------- common adder behaviour
class Adder:
    """An adder: the model, its residual layout (None for a trained model), and the digit counts of a and b."""

    design = ""

    def __init__(self, model: Transformer, layout: ResidualLayout | None, n_digits_a: int, n_digits_b: int) -> None:
        self.model, self.layout = model, layout
        self.n_digits_a, self.n_digits_b = n_digits_a, n_digits_b
        self.n_answer = max(n_digits_a, n_digits_b) + 1

    @property
    def prompt_len(self) -> int:
        return self.n_digits_a + self.n_digits_b + 1

    def prompt(self, a: Any, b: Any) -> torch.Tensor:
        """[prompt_len] token ids of the problem a + b (checked: whole numbers that fit)."""
        a = parse_operand(a, "a", self.n_digits_a)
        b = parse_operand(b, "b", self.n_digits_b)
        digits = [int(c) for c in str(a).zfill(self.n_digits_a) + str(b).zfill(self.n_digits_b)]
        return torch.tensor(digits + [EOS])

    def add(self, a: Any, b: Any) -> int:
        """a + b computed by the model."""
        prompt = self.prompt(a, b)
        return int(digits_to_str(self.answer_digits(prompt[None])[0]))

    def answer_digits(self, prompts: torch.Tensor) -> torch.Tensor:
        """prompts [batch, prompt_len] -> the model's answers [batch, n_answer] digits, most significant first."""
        raise NotImplementedError

    def correct_rows(self, da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        """da [batch, n_a], db [batch, n_b] digits -> [batch] bool: the model's answer is a + b."""
        prompts = torch.cat([da, db, torch.full((da.shape[0], 1), EOS)], dim=1)
        return (self.answer_digits(prompts) == add_digits(da, db, self.n_answer)).all(dim=1)

    def check(self, samples: int = 10_000, seed: int = 0, exhaustive: bool | None = None,
              chunk: int = 100_000, progress: bool = True) -> AdderCheck:
        """Count correct answers: on every pair when there are at most EXHAUSTIVE_LIMIT (or when
        exhaustive=True), else on `samples` random pairs (uniform digits, seeded)."""
        n, m = self.n_digits_a, self.n_digits_b
        if exhaustive is None:
            exhaustive = 10 ** (n + m) <= EXHAUSTIVE_LIMIT
        if exhaustive and 10 ** (n + m) > 10 * EXHAUSTIVE_LIMIT:
            raise CircuitlabError(f"an exhaustive check of {n}+{m} digits is {10 ** (n + m):,} inputs; "
                                  "use random samples instead")
        if not exhaustive and samples <= 0:
            raise CircuitlabError(f"samples must be positive, got {samples}")
        total = 10 ** (n + m) if exhaustive else samples
        gen = torch.Generator().manual_seed(seed)
        correct, failures = 0, []
        with tqdm(total=total, desc=f"checking {self.design} adder", unit="sum", delay=2.0,
                  disable=not progress) as bar:
            for start in range(0, total, chunk):
                size = min(chunk, total - start)
                if exhaustive:
                    idx = torch.arange(start, start + size)
                    da, db = digits_of(idx // 10 ** m, n), digits_of(idx % 10 ** m, m)
                else:
                    da = torch.randint(0, 10, (size, n), generator=gen)
                    db = torch.randint(0, 10, (size, m), generator=gen)
                ok = self.correct_rows(da, db)
                correct += int(ok.sum())
                rows = torch.nonzero(~ok).flatten()[: 10 - len(failures)]
                if len(rows):
                    prompts = torch.cat([da[rows], db[rows], torch.full((len(rows), 1), EOS)], dim=1)
                    for x, y, got in zip(da[rows], db[rows], self.answer_digits(prompts)):
                        failures.append((digits_to_str(x), digits_to_str(y), digits_to_str(got)))
                bar.update(size)
        return AdderCheck(self.design, n, m, correct, total, exhaustive, failures)

    def explain(self, a: Any, b: Any) -> str:
        """A walk through the computation of a + b, as text."""
        raise NotImplementedError


# ---------------------------------------------------------------------- the reference post's design
class PostAdder(Adder):
    """The post's 2-digit adder. Readout in Python: round(10 · x[digit] + x[acc]) of EOS's final residual."""

    design = "post"

    def final_eos_residual(self, prompts: torch.Tensor) -> torch.Tensor:
        """prompts [batch, 5] -> EOS's residual after the last layer [batch, 3] = [acc, digit, sign]."""
        name = f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post"
        _, cache = self.model.run_with_cache(prompts, names_filter=[name])
        return cache[name][:, -1]

    def readout(self, prompts: torch.Tensor) -> torch.Tensor:
        """[batch, 5] -> 10 · x[digit] + x[acc] before rounding [batch] (float)."""
        x = self.final_eos_residual(prompts)
        return 10 * self.layout.read(x, "digit")[:, 0] + self.layout.read(x, "acc")[:, 0]

    def answer_digits(self, prompts: torch.Tensor) -> torch.Tensor:
        value = self.readout(prompts).round().long().clamp(min=0)
        return digits_of(value, self.n_answer)

    def check(self, *args: Any, **kwargs: Any) -> AdderCheck:
        result = super().check(*args, **kwargs)
        # How far the residual is from whole numbers: the margin that rounding relies on.
        idx = torch.arange(10_000)
        prompts = torch.cat([digits_of(idx // 100, 2), digits_of(idx % 100, 2), torch.full((10_000, 1), EOS)], 1)
        raw = self.readout(prompts)
        err = (raw - (idx // 100 + idx % 100)).abs().max().item()
        truncated = int((raw.floor().long() == idx // 100 + idx % 100).sum())
        result.note = (f"readout before rounding is off by at most {err:.2g}; truncating instead of rounding "
                       f"would get {truncated}/10000")
        return result

    def explain(self, a: Any, b: Any) -> str:
        prompt = self.prompt(a, b)
        a, b = int(a), int(b)
        _, cache = self.model.run_with_cache(prompt[None])
        names = [_token_name(t) for t in prompt.tolist()]
        stages = [("embedding", cache["hook_embed"] + cache["hook_pos_embed"])]
        stages += [(f"after layer {l}", cache["resid_post", l]) for l in range(self.model.cfg.n_layers)]
        lines = [f"{a} + {b} with the reference post's adder: 2 layers, one V-only head each, "
                 f"residual [{', '.join(self.layout.names)}]",
                 "tokens: " + "  ".join(f"{n:>3}" for n in names), ""]
        width = max(len(n) for n, _ in stages)
        for label, x in stages:
            cells = "  ".join(f"{t}:{_vec(x[0, i].tolist())}" for i, t in enumerate(names))
            lines.append(f"{label:<{width}}  {cells}")
        lines.append("")
        for l in range(self.model.cfg.n_layers):
            pattern = cache["pattern", l][0, 0, -1]
            cells = "  ".join(f"{t}:{p:.2f}" for t, p in zip(names, pattern.tolist()))
            lines.append(f"layer {l}: EOS attends  {cells}")
        x = cache["resid_post", self.model.cfg.n_layers - 1][0, -1]
        acc, digit = x[self.layout["acc"]].item(), x[self.layout["digit"]].item()
        lines += ["", f"EOS residual {_vec(x.tolist())} -> 10·{_fmt(digit)} + {_fmt(acc)} = "
                      f"{round(10 * digit + acc)}   (read off the residual in Python, as in the post)"]
        return "\n".join(lines)


def build_post_adder(qk_scale: float = 10.0) -> PostAdder:
    """The reference post's 2-digit adder, exactly as published (qk_scale 10).

    Residual (d_model 3): acc (dim 0), digit (dim 1), sign (dim 2: -1 at units positions, +1 at
    tens positions and EOS). The sign comes from a hand-set learned positional embedding, so the
    tokens stay the plain digits and EOS of the task format.
    """
    layout = ResidualLayout({"acc": 1, "digit": 1, "sign": 1})
    f = Forge(layout, n_layers=2, n_heads=1, d_head=3, use_attn_out=False, d_vocab=D_VOCAB, n_ctx=5,
              positional="learned")
    for d in range(10):
        f.embed(d, digit=d)           # W_E[d] = [0, d, 0]; EOS's row stays [0, 0, 0]
    for position, sign in enumerate([+1, -1, +1, -1, +1]):
        f.pos(position, sign=sign)    # W_pos: tens(a), units(a), tens(b), units(b), EOS
    # Layer 0: score = (s·sign_q)(-s·sign_k) = -s² sign_q sign_k: EOS (+1) scores +s² on the two units
    # positions (-1) and -s² on the rest, so it averages the two units digits; W_V = 2 undoes the
    # average and moves the digit into acc. EOS gets acc = units(a) + units(b).
    f.head(0).q("sign", qk_scale, into="sign").k("sign", -qk_scale, into="sign").v("digit", 2.0, into="acc")
    # Layer 1: score = s² sign_q sign_k: EOS scores +s² on tens(a), tens(b) and itself, averages their
    # digits (EOS's is 0) and W_V = 3 undoes the average of three. EOS gets digit = tens(a) + tens(b).
    f.head(1).q("sign", qk_scale, into="sign").k("sign", qk_scale, into="sign").v("digit", 3.0, into="digit")
    # No unembedding: the post reads 10·digit + acc off EOS's residual (PostAdder.readout).
    return PostAdder(f.model, layout, 2, 2)


# ---------------------------------------------------------------------- the exact n + m digit adder
class TokenAdder(Adder):
    """Any model that writes the answer as tokens in the task format (hand-built or trained):
    greedy decoding of max(n, m) + 1 digits after EOS, most significant first."""

    design = "token"

    def __init__(self, model: Transformer, n_digits_a: int, n_digits_b: int,
                 layout: ResidualLayout | None = None, design: str | None = None) -> None:
        super().__init__(model, layout, n_digits_a, n_digits_b)
        if design is not None:
            self.design = design
        cfg = model.cfg
        if cfg.d_vocab < D_VOCAB:
            raise CircuitlabError(f"the model's vocabulary ({cfg.d_vocab}) is too small for the addition task "
                                  f"(digits 0..9 and EOS = {EOS})")
        if cfg.n_ctx < self.prompt_len + self.n_answer - 1:
            raise CircuitlabError(f"the model's context ({cfg.n_ctx}) is too short for {n_digits_a}+{n_digits_b}-digit "
                                  f"problems ({self.prompt_len + self.n_answer - 1} tokens)")

    def answer_digits(self, prompts: torch.Tensor) -> torch.Tensor:
        out = self.model.generate(prompts, self.n_answer, temperature=0)
        return out[:, prompts.shape[1]:]

    def correct_rows(self, da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        # Teacher forcing: feed the true answer and check every answer position's argmax. This equals
        # greedy generation being right (by induction over the answer digits), in one forward pass.
        answer = add_digits(da, db, self.n_answer)
        tokens = torch.cat([da, db, torch.full((da.shape[0], 1), EOS), answer], dim=1)
        with torch.no_grad():
            logits = self.model(tokens[:, :-1])
        pred = logits[:, self.prompt_len - 1:].argmax(dim=-1)
        return (pred == answer).all(dim=1)

    def explain(self, a: Any, b: Any) -> str:
        raise CircuitlabError("explain() walks through a hand-built adder's subspaces; this model has none")


class CarryAdder(TokenAdder):
    """The hand-built exact adder: answer digits as tokens, carries computed by attention and MLPs."""

    design = "carry"

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
            vals = self.layout.describe(final[i], show)
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
            v = self.layout.describe(final[pos], ["a", "b", "carry", "wrap"])
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
    n, m = n_digits_a, m_given
    C = max(n, m)        # columns of the inputs, 0 = units
    K = C + 1            # answer digits
    EOS_POS = n + m
    lam = float(sharpness)

    def pos_a(j: int) -> int:  # where a's digit of column j sits (EOS if a has no such digit)
        return n - 1 - j if j < n else EOS_POS

    def pos_b(j: int) -> int:
        return n + m - 1 - j if j < m else EOS_POS

    def holder(j: int) -> int:  # the last of column j's digits in the sequence
        return pos_b(j) if j < m else pos_a(j)

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
              d_vocab=D_VOCAB, n_ctx=n + m + K, positional="learned")

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
    M = lam * (C + 3)
    for r in range(K):  # answer position r (EOS, then each answer digit) predicts column i
        p, i = EOS_POS + r, K - 1 - r
        f.pos(p, tgt_a=pos_a(i), tgt_b=pos_b(i),
              lookup=[2 * lam + lam * c if c < i else -M for c in range(C)])

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
    return CarryAdder(f.model, n, m, layout)


def build_adder(design: str = "carry", n_digits_a: int = 2, n_digits_b: int | None = None) -> Adder:
    """build_post_adder() for design "post" (2 + 2 digits only), else build_carry_adder(n, m)."""
    m = n_digits_a if n_digits_b is None else n_digits_b
    if design == "post":
        if (n_digits_a, m) != (2, 2):
            raise CircuitlabError(f"the post's design adds two 2-digit numbers; for {n_digits_a}+{m} digits "
                                  "use the carry design")
        return build_post_adder()
    if design == "carry":
        return build_carry_adder(n_digits_a, m)
    raise CircuitlabError(f"unknown adder design {design!r}; choose post or carry")


__all__ = ["Adder", "AdderCheck", "CarryAdder", "D_VOCAB", "EOS", "PostAdder", "TokenAdder", "add_digits",
           "build_adder", "build_carry_adder", "build_post_adder", "digits_of", "parse_operand"]
