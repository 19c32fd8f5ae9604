"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Split out of the flat test_data module, issue 38.)"""
import numpy as np
import pytest

from circuitlab.data import DataConfig, build_data, generate_stories, load_texts
from circuitlab.errors import CircuitlabError, ConfigError


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
