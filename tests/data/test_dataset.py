"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Its tests of other modules moved with issue 38: tests/data/test_packing.py, tests/data/test_sources.py,
tests/data/test_stories.py, tests/data/test_synthetic.py, tests/data/test_tokenizers.py.)"""

import json

import numpy as np
import pytest
import torch

from circuitlab.data import (
    AdditionTask,
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    DataConfig,
    build_data,
    build_tokenizer,
    generate_stories,
    load_texts,
    load_tokenizer,
    repeated_random_tokens,
    save_tokenizer,
    stories_text,
    tiled_random_segments,
)
from circuitlab.data import packing
from circuitlab.errors import CircuitlabError, ConfigError


# ---------------------------------------------------------------- stories


# ---------------------------------------------------------------- tokenizers


# ---------------------------------------------------------------- synthetic


def _first_period(row, lo, hi):
    for p in range(lo, hi + 1):
        if torch.equal(row[p : 2 * p], row[:p]):
            return p
    return None


# ---------------------------------------------------------------- sources


# ---------------------------------------------------------------- packing and batches


def _cfg(tmp_path, **kw):
    base = dict(n_stories=300, tokenizer="char", val_frac=0.1, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**base, **kw})


def test_get_batch(tmp_path):
    data = build_data(_cfg(tmp_path))
    b1 = data.get_batch("train", 7, 8, 32)
    assert b1.shape == (8, 33) and b1.dtype == torch.long
    assert torch.equal(b1, data.get_batch("train", 7, 8, 32))  # same step, same batch
    again = build_data(_cfg(tmp_path))
    assert torch.equal(b1, again.get_batch("train", 7, 8, 32))  # also across processes/resumes
    assert not torch.equal(b1, data.get_batch("train", 8, 8, 32))
    assert not torch.equal(b1, data.get_batch("val", 7, 8, 32))
    # rows are real windows of the stream
    stream = torch.from_numpy(np.asarray(data.train, dtype=np.int64))
    row = b1[0]
    hits = (stream.unfold(0, 33, 1) == row).all(dim=1)
    assert hits.any()
    # DDP: the ranks' shares, in rank order, are the single-process batch
    shares = [data.get_batch("train", 7, 8, 32, rank=r, world_size=4) for r in range(4)]
    assert all(s.shape == (2, 33) for s in shares)
    assert torch.equal(torch.cat(shares), b1)
    with pytest.raises(ConfigError, match="divisible"):
        data.get_batch("train", 0, 6, 32, rank=0, world_size=4)
    with pytest.raises(ConfigError, match="rank"):
        data.get_batch("train", 0, 8, 32, rank=4, world_size=4)
    with pytest.raises(ConfigError, match="split"):
        data.get_batch("test", 0, 8, 32)
    with pytest.raises(CircuitlabError, match="seq_len"):
        data.get_batch("val", 0, 8, len(data.val))


def test_random_segment_rows(tmp_path):
    data = build_data(_cfg(tmp_path, random_segment_frac=0.5))
    plain = build_data(_cfg(tmp_path))
    x = data.get_batch("train", 3, 8, 128)
    assert torch.equal(x, data.get_batch("train", 3, 8, 128))
    assert (x != data.tokenizer.eos_id).all(dim=1).sum() >= 4  # random rows never contain EOS
    y = plain.get_batch("train", 3, 8, 128)
    same = [torch.equal(x[i], y[i]) for i in range(8)]
    assert sum(same) == 4  # exactly half the rows were replaced
    for i in range(8):
        if not same[i]:
            assert _first_period(x[i], 4, 16) is not None  # DataConfig.segment_len default
    shares = [data.get_batch("train", 3, 8, 128, rank=r, world_size=2) for r in range(2)]
    assert torch.equal(torch.cat(shares), x)


def test_data_config_validation(tmp_path):
    for field, value in [
        ("n_stories", 0),
        ("n_stories", 2.5),
        ("tokenizer", "word"),
        ("vocab_size", 100),
        ("val_frac", 1.0),
        ("val_frac", -0.1),
        ("seed", "0"),
        ("random_segment_frac", 1.5),
        ("cache_dir", 3),
        ("source", ""),
    ]:
        with pytest.raises(ConfigError, match=field):
            DataConfig(**{field: value})
    with pytest.raises(ConfigError, match="bogus"):
        DataConfig.from_dict({"bogus": 1})
    assert DataConfig.from_dict({"tokenizer": "byte"}).tokenizer == "byte"
    assert DataConfig(cache_dir=tmp_path).cache_dir == str(tmp_path)
