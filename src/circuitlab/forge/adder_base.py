"""What every adder shares: the task's tokens (digits 0..9, EOS = 10) and operands, the schoolbook sum that is
the checkers' ground truth, AdderCheck, the Adder base (prompts, checking) and TokenAdder (any model that writes
the answer as tokens, hand-built or trained). The designs: post_adder.py, carry_adder.py; forge/adder.py is what
callers import."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from circuitlab.checks import DEFAULT_SEED
from circuitlab.errors import CircuitlabError
from circuitlab.forge.builder import ResidualLayout
from circuitlab.model.transformer import Transformer

EOS = 10
D_VOCAB = 11
MAX_DIGITS = 40  # the model grows with the digit count (d_model = 14 + 2·max(n, m)); checked exact up to here
EXHAUSTIVE_LIMIT = 1_000_000  # check every pair when there are at most this many
CHECK_SAMPLES = 10_000  # random pairs a check counts beyond that (`forge adder --samples`: AdderOptions.samples)



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

    def check(self, samples: int = CHECK_SAMPLES, seed: int = DEFAULT_SEED, exhaustive: bool | None = None,
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
        correct = 0
        failures: list[tuple[str, str, str]] = []
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


# ---------------------------------------------------------------------- answers as tokens
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


