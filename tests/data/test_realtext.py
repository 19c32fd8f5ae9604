"""The kjv real-text source: chapters parsed from the bible program's output, the held-out split by chapter, one
line when the Debian package is missing, and (where it is installed) the whole text as a data source."""
import shutil

import pytest

from circuitlab.data import realtext
from circuitlab.data.realtext import VAL_EVERY, is_held_out, kjv_chapters, parse_chapters
from circuitlab.errors import CircuitlabError

PRINTED = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void.

Genesis 2

  1 Thus the heavens and the earth were finished.
"""


def test_chapters_are_parsed_with_the_verse_numbers_stripped():
    assert parse_chapters(PRINTED) == [
        ("Genesis 1", "In the beginning God created the heaven and the earth. And the earth was without form, and void."),
        ("Genesis 2", "Thus the heavens and the earth were finished.")]
    assert parse_chapters("") == []


def test_the_held_out_split_is_every_twentieth_chapter_and_never_in_train(monkeypatch):
    text = "".join(f"\nBook {i}\n\n  1 verse of chapter {i}.\n" for i in range(1, 101))
    monkeypatch.setattr(realtext, "kjv_text", lambda: text)
    val, train = kjv_chapters("val"), kjv_chapters("train")
    assert len(val) == 100 // VAL_EVERY and len(train) == 100 - len(val)
    assert not set(val) & set(train) and sorted(val + train) == sorted(kjv_chapters("all"))
    assert val[0] == f"verse of chapter {VAL_EVERY}." and is_held_out(VAL_EVERY - 1) and not is_held_out(0)
    with pytest.raises(CircuitlabError, match="split must be one of"):
        kjv_chapters("test")


def test_without_the_debian_package_it_says_how_to_install_it(monkeypatch):
    realtext.kjv_text.cache_clear()
    monkeypatch.setattr(realtext.shutil, "which", lambda name: None)
    with pytest.raises(CircuitlabError, match="apt-get install bible-kjv") as e:
        realtext.kjv_text()
    assert "\n" not in str(e.value)
    realtext.kjv_text.cache_clear()


@pytest.mark.skipif(shutil.which("bible") is None, reason="Debian's bible-kjv is not installed (apt-get install bible-kjv)")
def test_the_king_james_text_is_a_data_source_with_held_out_batches():
    from circuitlab.data import build_tokenizer, load_texts
    from circuitlab.data.realtext import real_text_batches

    docs = list(load_texts("kjv"))
    assert len(docs) == 1189 and docs[0].startswith("In the beginning God created the heaven and the earth.")
    assert sum(len(d) for d in docs) > 3_000_000   # a few MB of real English
    tok = build_tokenizer("byte")
    batches = real_text_batches(tok, "val", n_batches=2, batch_size=2, seq_len=32)
    assert len(batches) == 2 and batches[0].shape == (2, 32)
    assert tok.decode(batches[0][0].tolist()) in "".join(kjv_chapters("val")[0])
