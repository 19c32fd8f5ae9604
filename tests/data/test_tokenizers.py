"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Split out of the flat test_data module, issue 38.)"""
import json

import pytest

from circuitlab.data import BPETokenizer, ByteTokenizer, CharTokenizer, build_tokenizer, generate_stories, load_tokenizer, save_tokenizer
from circuitlab.errors import CircuitlabError, ConfigError


TEXT = 'Once upon a time, Mibaro said "héllo" to Kito.\n\nÜnïcode ✓ and emoji 🙂 too.'


@pytest.fixture(scope="module")
def stories():
    return generate_stories(200, seed=0)


@pytest.fixture(scope="module")
def bpe(stories):
    return build_tokenizer("bpe", stories + [TEXT], vocab_size=300)


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
