"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches."""

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

TEXT = 'Once upon a time, Mibaro said "héllo" to Kito.\n\nÜnïcode ✓ and emoji 🙂 too.'


@pytest.fixture(scope="module")
def stories():
    return generate_stories(200, seed=0)


@pytest.fixture(scope="module")
def bpe(stories):
    return build_tokenizer("bpe", stories + [TEXT], vocab_size=300)


# ---------------------------------------------------------------- stories


def test_stories_deterministic_and_seeded():
    a, b, c = generate_stories(50, seed=1), generate_stories(50, seed=1), generate_stories(50, seed=2)
    assert a == b
    assert a != c
    assert generate_stories(80, seed=1)[:50] == a  # a bigger corpus extends a smaller one
    assert stories_text(3, seed=1) == "\n\n".join(a[:3])


def test_stories_shape_names_repeat_and_pool_is_large():
    items = generate_stories(2000, seed=0, return_names=True)
    names = set()
    for text, story_names in items:
        assert 1 <= len(story_names) <= 2
        for name in story_names:
            assert text.count(name) >= 2, (name, text)
        names.update(story_names)
    assert len(names) > 1000
    texts = [t for t, _ in items]
    assert sum(t.startswith("Once upon a time") for t in texts) > len(texts) / 3
    assert len({t.split(",")[0].split(" ")[0] for t in texts}) >= 3  # several openings
    n_sentences = [t.count(".") + t.count("?") + t.count("!") for t in texts]
    assert min(n_sentences) >= 3 and max(n_sentences) <= 10


def test_stories_bad_size():
    with pytest.raises(ConfigError):
        generate_stories(-1)


# ---------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("spec", ["char", "byte", "bpe"])
def test_tokenizer_roundtrip_and_save_load(spec, stories, bpe, tmp_path):
    tok = bpe if spec == "bpe" else build_tokenizer(spec, stories + [TEXT])
    assert tok.name == spec
    for text in [TEXT, stories[0], ""]:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size and i != tok.eos_id for i in ids)
        assert tok.decode(ids) == text
    assert tok.decode(tok.encode("ab") + [tok.eos_id] + tok.encode("c")) == "ab<|endoftext|>c"

    tok.save(tmp_path / spec)
    meta = json.loads((tmp_path / spec / "tokenizer_meta.json").read_text())
    assert meta["kind"] == spec
    again = load_tokenizer(tmp_path / spec)
    assert type(again) is type(tok)
    assert (again.vocab_size, again.eos_id, again.identity()) == (tok.vocab_size, tok.eos_id, tok.identity())
    for text in [TEXT, stories[1]]:
        assert again.encode(text) == tok.encode(text)
        assert again.decode(tok.encode(text)) == text


def test_tokenizer_specifics(stories, bpe):
    char = build_tokenizer("char", ["bca"])
    assert isinstance(char, CharTokenizer) and char.chars == ["a", "b", "c"] and char.eos_id == 3 and char.vocab_size == 4
    with pytest.raises(CircuitlabError, match="byte"):
        char.encode("z")
    byte = ByteTokenizer()
    assert (byte.vocab_size, byte.eos_id) == (257, 256)
    assert isinstance(bpe, BPETokenizer) and bpe.vocab_size <= 300
    assert len(bpe.encode(stories[0])) < 0.8 * len(stories[0])  # merges were learned
    assert bpe.encode(bpe.decode([bpe.eos_id])) == [bpe.eos_id]


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ConfigError, match="char, byte, bpe"):
        build_tokenizer("wordpiece")
    with pytest.raises(ConfigError, match="texts"):
        build_tokenizer("bpe")
    with pytest.raises(ConfigError, match="vocab_size"):
        build_tokenizer("bpe", ["abc"], vocab_size=100)
    with pytest.raises(CircuitlabError, match="tokenizer_meta.json"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer_meta.json").write_text("{not json")
    with pytest.raises(CircuitlabError, match="corrupt"):
        load_tokenizer(tmp_path / "bad")
    (tmp_path / "bpe").mkdir()
    (tmp_path / "bpe" / "tokenizer_meta.json").write_text('{"kind": "bpe"}')  # tokenizer.json missing
    with pytest.raises(CircuitlabError, match="corrupt"):
        load_tokenizer(tmp_path / "bpe")


def test_gpt2_works_or_explains():
    try:
        tok = build_tokenizer("gpt2")
    except CircuitlabError as e:
        msg = str(e)
        assert all(alt in msg for alt in ("char", "byte", "bpe", "hf:"))
        return
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_hf_tokenizer_from_local_folder(bpe, tmp_path):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.hf, eos_token="<|endoftext|>")
    fast.save_pretrained(tmp_path / "hf")
    tok = build_tokenizer(f"hf:{tmp_path / 'hf'}")
    assert tok.eos_id == bpe.eos_id and tok.vocab_size == bpe.vocab_size
    assert tok.encode(TEXT) == bpe.encode(TEXT)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    save_tokenizer(tok, tmp_path / "saved")
    assert load_tokenizer(tmp_path / "saved").encode(TEXT) == tok.encode(TEXT)
    with pytest.raises(CircuitlabError, match="hf:"):
        build_tokenizer(f"hf:{tmp_path / 'missing'}")


# ---------------------------------------------------------------- synthetic


def test_repeated_random_tokens():
    g = torch.Generator().manual_seed(0)
    x = repeated_random_tokens(4, 10, 50, g)
    assert x.shape == (4, 20) and x.dtype == torch.long
    assert torch.equal(x[:, :10], x[:, 10:])
    y = repeated_random_tokens(4, 10, 5, g, bos=2)
    assert y.shape == (4, 21) and (y[:, 0] == 2).all() and (y[:, 1:] != 2).all()
    assert torch.equal(y[:, 1:11], y[:, 11:])


def _first_period(row, lo, hi):
    for p in range(lo, hi + 1):
        if torch.equal(row[p : 2 * p], row[:p]):
            return p
    return None


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


# ---------------------------------------------------------------- sources


def test_text_file_and_folder(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("first doc\nstill first\n\n\nsecond doc\n\n")
    assert list(load_texts(f"file:{f}")) == ["first doc\nstill first", "second doc"]
    assert list(load_texts(str(f))) == ["first doc\nstill first", "second doc"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.md").write_text("markdown doc")
    (tmp_path / "b.txt").write_text("doc b")
    (tmp_path / "skip.py").write_text("not text")
    docs = list(load_texts(f"folder:{tmp_path}"))
    assert docs == ["first doc\nstill first\n\n\nsecond doc", "doc b", "markdown doc"]
    assert list(load_texts("stories", n_stories=5, seed=3)) == generate_stories(5, seed=3)


def test_source_errors(tmp_path):
    with pytest.raises(CircuitlabError, match="does not exist"):
        load_texts(f"file:{tmp_path / 'missing.txt'}")
    with pytest.raises(CircuitlabError, match="does not exist"):
        load_texts(str(tmp_path / "missing.txt"))
    with pytest.raises(CircuitlabError, match="does not exist"):
        load_texts(f"folder:{tmp_path / 'nope'}")
    with pytest.raises(ConfigError, match="stories"):
        load_texts("wikipedia")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(CircuitlabError, match="no text"):
        list(load_texts(str(empty)))
    with pytest.raises(CircuitlabError, match="no text"):
        build_data(DataConfig(source=str(empty), tokenizer="byte", cache_dir=str(tmp_path / "c")))
    with pytest.raises(ConfigError):
        load_texts("hf:a:b:c:d")


def test_hf_datasets_path_on_local_files(tmp_path):
    pytest.importorskip("datasets")
    txt = tmp_path / "docs.txt"
    txt.write_text("alpha one\nalpha two\n\nbeta\n")
    assert list(load_texts(f"hf:{txt}")) == list(load_texts(f"file:{txt}"))
    js = tmp_path / "docs.jsonl"
    js.write_text('{"story": "one"}\n{"story": "two"}\n')
    assert list(load_texts(f"hf:{js}:train:story")) == ["one", "two"]
    with pytest.raises(CircuitlabError, match="no field 'text'"):
        list(load_texts(f"hf:{js}"))
    # the same downstream code: identical token streams from file: and hf:
    a = build_data(DataConfig(source=f"file:{txt}", tokenizer="byte", val_frac=0.0, cache_dir=str(tmp_path / "c")))
    b = build_data(DataConfig(source=f"hf:{txt}", tokenizer="byte", val_frac=0.0, cache_dir=str(tmp_path / "c")))
    assert np.array_equal(a.train, b.train)


def test_hf_hub_unreachable_is_clear(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    # offline mode fails at once instead of retrying the network for ~30 s
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CircuitlabError, match="network") as e:
        load_texts("hf:someone/no-such-dataset-xyz")
    assert "file:" in str(e.value) and "stories" in str(e.value)


# ---------------------------------------------------------------- packing and batches


def _cfg(tmp_path, **kw):
    base = dict(n_stories=300, tokenizer="char", val_frac=0.1, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**base, **kw})


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
