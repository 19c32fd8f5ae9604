"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Split out of the flat test_data module, issue 38.)"""
import pytest
import torch

from circuitlab.data import AdditionTask, repeated_random_tokens, tiled_random_segments
from circuitlab.errors import ConfigError

from data.test_dataset import _first_period  # noqa: F401 (shared with it)


def test_repeated_random_tokens():
    g = torch.Generator().manual_seed(0)
    x = repeated_random_tokens(4, 10, 50, g)
    assert x.shape == (4, 20) and x.dtype == torch.long
    assert torch.equal(x[:, :10], x[:, 10:])
    y = repeated_random_tokens(4, 10, 5, g, bos=2)
    assert y.shape == (4, 21) and (y[:, 0] == 2).all() and (y[:, 1:] != 2).all()
    assert torch.equal(y[:, 1:11], y[:, 11:])


def test_tiled_random_segments_periodic_with_varying_periods():
    g = torch.Generator().manual_seed(0)
    x = tiled_random_segments(16, 256, 10_000, g, min_len=8, max_len=32)
    assert x.shape == (16, 256) and x.dtype == torch.long and 0 <= x.min() and x.max() < 10_000
    periods = [_first_period(row, 8, 32) for row in x]
    assert all(p is not None for p in periods)
    assert len(set(periods)) > 3  # varies between rows
    # within a row the segment switches: some position breaks the first period
    breaks = sum(bool((row[p:] != row[:-p]).any()) for row, p in zip(x, periods))
    assert breaks >= 12
    # at least half the tokens repeat the token one period (8..32) back
    copied = torch.zeros_like(x, dtype=torch.bool)
    for p in range(8, 33):
        copied[:, p:] |= x[:, p:] == x[:, :-p]
    assert copied.float().mean() > 0.5


def test_addition_task():
    task = AdditionTask(2, 2)
    assert task.vocab_size == 11 and task.EOS == 10 and task.seq_len == 8
    assert task.encode(7, 58) == [0, 7, 5, 8, 10, 0, 6, 5]
    pairs = task.all_pairs()
    assert len(pairs) == 10_000
    for a, b in pairs:
        ids = task.encode(a, b)
        assert task.decode_answer(ids) == a + b
        assert task.decode_answer(ids[task.prompt_len :]) == a + b
    tokens, mask = task.sample(64, torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 8) and mask.shape == (64, 7) and mask.dtype == torch.bool
    assert mask[0].tolist() == [False] * 4 + [True] * 3  # targets tokens[:, 5:] are the answer
    assert (tokens[:, 4] == 10).all()
    for row in tokens.tolist():
        a, b = row[0] * 10 + row[1], row[2] * 10 + row[3]
        assert row == task.encode(a, b)
    t2, m2 = task.batch([(1, 2), (99, 99)])
    assert t2[1].tolist() == [9, 9, 9, 9, 10, 1, 9, 8] and torch.equal(m2, mask[:2])
    assert AdditionTask(3, 1).encode(999, 9) == [9, 9, 9, 9, 10, 1, 0, 0, 8]
    for a, b in [(-1, 0), (100, 0), (0, 100), (1.5, 2), (True, 1)]:
        with pytest.raises(ConfigError):
            task.encode(a, b)
