"""Synthetic token tasks: repeated random tokens, tiled random segments, addition."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from circuitlab.errors import CircuitlabError, ConfigError


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}.")


PERIOD_DISTS = ("uniform", "log")


def repeated_random_tokens(
    batch: int,
    half_len: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    bos: int | None = None,
    exclude: Sequence[int] = (),
) -> torch.Tensor:
    """Random tokens followed by the same tokens again, [r, r]: the induction test set.

    Returns LongTensor [batch, 2*half_len], or [batch, 1 + 2*half_len] with a BOS
    column first. The random tokens are drawn uniformly from the ids in [0, vocab_size)
    other than `bos` and `exclude` (e.g. a tokenizer's special tokens).
    """
    _check_int("batch", batch, 1)
    _check_int("half_len", half_len, 1)
    _check_int("vocab_size", vocab_size, 2)
    banned = {int(t) for t in exclude} | ({bos} if bos is not None else set())
    allowed = torch.tensor([t for t in range(vocab_size) if t not in banned], dtype=torch.long)
    if len(allowed) < 1:
        raise ConfigError(f"no token left to draw from: vocab_size {vocab_size} with {sorted(banned)} excluded.")
    x = allowed[torch.randint(0, len(allowed), (batch, half_len), generator=generator)]
    x = torch.cat([x, x], dim=1)
    if bos is not None:
        x = torch.cat([torch.full((batch, 1), bos, dtype=torch.long), x], dim=1)
    return x


def tiled_random_segments(
    batch: int,
    seq_len: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    min_len: int = 8,
    max_len: int = 32,
    period_dist: str = "uniform",
) -> torch.Tensor:
    """Rows made of random segments, each repeated (tiled) several times.

    Per row: draw a period L in [min_len, max_len] (uniformly, or log-uniformly with period_dist
    "log": P(L) proportional to log((L + 1) / L), as likely in 4-7 as in 16-31) and L random tokens, tile them
    for a random run of at least 2*L tokens, then switch to a new segment. The
    period varies within and between rows, so only copying from one period back
    (induction), not a fixed positional offset, predicts the repeats.
    Returns LongTensor [batch, seq_len].
    """
    _check_int("batch", batch, 1)
    _check_int("seq_len", seq_len, 1)
    _check_int("vocab_size", vocab_size, 2)
    _check_int("min_len", min_len, 1)
    _check_int("max_len", max_len, min_len)
    if period_dist not in PERIOD_DISTS:
        raise ConfigError(f"period_dist must be one of {', '.join(PERIOD_DISTS)}, got {period_dist!r}.")
    lengths = torch.arange(min_len, max_len + 1, dtype=torch.float64)
    weights = torch.log1p(1 / lengths)  # log-uniform over the integers: P(L) = log(L + 1) - log(L)
    out = torch.empty(batch, seq_len, dtype=torch.long)
    for row in range(batch):
        pos = 0
        while pos < seq_len:
            if period_dist == "uniform":
                period = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
            else:
                period = min_len + int(torch.multinomial(weights, 1, generator=generator))
            run = int(torch.randint(2 * period, max(2 * period, seq_len // 2) + 1, (1,), generator=generator))
            run = min(run, seq_len - pos)
            segment = torch.randint(0, vocab_size, (period,), generator=generator)
            out[row, pos : pos + run] = segment.repeat(run // period + 1)[:run]
            pos += run
    return out


class AdditionTask:
    """a + b as tokens, in the format of the hand-built adder.

    Digits 0..9 are tokens 0..9 and EOS = 10 (vocab_size 11). A sequence is
    [a digits, b digits, EOS, answer digits], each number most significant digit
    first and zero-padded; the answer has max(n_digits_a, n_digits_b) + 1 digits.
    """

    EOS = 10
    vocab_size = 11

    def __init__(self, n_digits_a: int = 2, n_digits_b: int = 2):
        _check_int("n_digits_a", n_digits_a, 1)
        _check_int("n_digits_b", n_digits_b, 1)
        self.n_digits_a = n_digits_a
        self.n_digits_b = n_digits_b
        self.n_answer = max(n_digits_a, n_digits_b) + 1
        self.prompt_len = n_digits_a + n_digits_b + 1  # tokens up to and including EOS
        self.seq_len = self.prompt_len + self.n_answer

    def _check(self, a: int, b: int) -> None:
        for name, x, n in (("a", a, self.n_digits_a), ("b", b, self.n_digits_b)):
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 10**n:
                raise ConfigError(f"{name} must be an int in [0, {10**n - 1}] for {n}-digit addition, got {x!r}.")

    @staticmethod
    def _digits(x: int, n: int) -> list[int]:
        return [int(d) for d in str(x).zfill(n)]

    def encode(self, a: int, b: int) -> list[int]:
        """Token ids of the full sequence for a + b (length seq_len)."""
        self._check(a, b)
        return self._digits(a, self.n_digits_a) + self._digits(b, self.n_digits_b) + [self.EOS] + self._digits(a + b, self.n_answer)

    def batch(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens LongTensor [n, seq_len] and loss_mask BoolTensor [n, seq_len - 1] for the given pairs."""
        tokens = torch.tensor([self.encode(a, b) for a, b in pairs], dtype=torch.long).view(-1, self.seq_len)
        return tokens, self.loss_mask(len(pairs))

    def loss_mask(self, n: int) -> torch.Tensor:
        """BoolTensor [n, seq_len - 1]: True where the target tokens[:, 1:] is an answer digit."""
        mask = torch.zeros(n, self.seq_len - 1, dtype=torch.bool)
        mask[:, self.prompt_len - 1 :] = True
        return mask

    def sample(self, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random problems: tokens LongTensor [batch, seq_len], loss_mask BoolTensor [batch, seq_len - 1]."""
        _check_int("batch", batch, 1)
        a = torch.randint(0, 10**self.n_digits_a, (batch,), generator=generator)
        b = torch.randint(0, 10**self.n_digits_b, (batch,), generator=generator)

        def digits(x: torch.Tensor, n: int) -> torch.Tensor:  # [batch] -> [batch, n], most significant first
            powers = 10 ** torch.arange(n - 1, -1, -1)
            return (x[:, None] // powers) % 10

        eos = torch.full((batch, 1), self.EOS, dtype=torch.long)
        tokens = torch.cat([digits(a, self.n_digits_a), digits(b, self.n_digits_b), eos, digits(a + b, self.n_answer)], dim=1)
        return tokens, self.loss_mask(batch)

    def all_pairs(self) -> list[tuple[int, int]]:
        """Every (a, b) with a < 10**n_digits_a and b < 10**n_digits_b."""
        return [(a, b) for a in range(10**self.n_digits_a) for b in range(10**self.n_digits_b)]

    def decode_answer(self, ids) -> int:
        """The number written by the answer digits.

        `ids` is either a full sequence (the digits after the first EOS are used)
        or just the answer digits.
        """
        ids = [int(i) for i in ids]
        if self.EOS in ids:
            ids = ids[ids.index(self.EOS) + 1 :]
        if not ids or any(not 0 <= i <= 9 for i in ids):
            raise CircuitlabError(f"Answer tokens must be digits 0..9, got {ids}; pass the answer digits or a full sequence.")
        return int("".join(map(str, ids)))
