"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Split out of the flat test_data module, issue 38.)"""
import numpy as np

from circuitlab.data import DataConfig, build_data, generate_stories, load_tokenizer
from circuitlab.data import packing

from data.test_dataset import _cfg  # noqa: F401 (shared with it)


def test_packing_cache_hit(tmp_path, monkeypatch):
    calls = []
    real = packing.tokenize_documents
    monkeypatch.setattr(packing, "tokenize_documents", lambda *a: calls.append(1) or real(*a))
    d1 = build_data(_cfg(tmp_path, tokenizer="bpe", vocab_size=300))
    assert len(calls) == 1
    files = sorted(d1.cache_path.iterdir())
    assert [f.name for f in files] == ["meta.json", "train.bin", "val.bin"]
    mtimes = [f.stat().st_mtime_ns for f in files]
    d2 = build_data(_cfg(tmp_path, tokenizer="bpe", vocab_size=300))
    assert len(calls) == 1  # loaded from the cache, not re-tokenized
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert isinstance(d2.train, np.memmap) and d2.train.dtype == np.uint16
    assert np.array_equal(d1.train, d2.train) and np.array_equal(d1.val, d2.val)
    assert d2.tokenizer.identity() == d1.tokenizer.identity()
    # a different setting is a different key
    build_data(_cfg(tmp_path, tokenizer="bpe", vocab_size=300, n_stories=301))
    assert len(calls) == 2
    # resuming with a saved tokenizer reuses the same cache entry
    d1.tokenizer.save(tmp_path / "run")
    d3 = build_data(_cfg(tmp_path, tokenizer="bpe", vocab_size=300), tokenizer=load_tokenizer(tmp_path / "run"))
    assert len(calls) == 2 and d3.cache_path == d1.cache_path


def test_packing_layout_and_env_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITLAB_CACHE", str(tmp_path / "envcache"))
    data = build_data(DataConfig(n_stories=100, tokenizer="byte", val_frac=0.1))
    assert data.cache_path.parent == tmp_path / "envcache"
    tok, stream = data.tokenizer, np.concatenate([data.train, data.val])
    docs = tok.decode(stream.tolist()).split("<|endoftext|>")
    assert docs[:-1] == generate_stories(100) and docs[-1] == ""
    assert data.train[-1] == tok.eos_id  # split at a document boundary
    assert 0.05 < len(data.val) / len(stream) < 0.15
