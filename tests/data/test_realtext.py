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


TOPIC = """Assignment statements
*********************

Assignment statements are used to (re)bind names to values and to
modify attributes or items of mutable objects:

   assignment_stmt ::= (target_list "=")+ (starred_expression | yield_expression)
   target_list     ::= target ("," target)* [","]

* If the target list is a single target with no trailing comma,
  optionally in parentheses, the object is assigned to that target.

For example:

   x = [0, 1]
   i = 0

   >>> print(x)
   [0, 1]
"""


def test_a_pyref_topic_keeps_its_prose_and_drops_code_grammar_and_headings():
    from circuitlab.data.realtext import topic_prose

    assert topic_prose(TOPIC).split("\n\n") == [
        "Assignment statements are used to (re)bind names to values and to modify attributes or items of mutable "
        "objects:",
        "If the target list is a single target with no trailing comma, optionally in parentheses, the object is "
        "assigned to that target."]   # "For example:" (three words) is no paragraph of prose


def test_the_python_reference_is_a_data_source_that_ships_with_python():
    """pyref: always installed (pydoc_data, PSF licence), real English prose, split by topic, never a topic in both."""
    from circuitlab.data import build_tokenizer, load_texts
    from circuitlab.data.realtext import (PYREF_SOURCE, PYREF_VAL_EVERY, pyref_documents, real_documents,
                                          real_text_batches)
    from circuitlab.data.sources import source_fingerprint

    docs = list(load_texts(PYREF_SOURCE))
    assert len(docs) >= 60 and sum(len(d) for d in docs) > 200_000
    assert not any("::=" in d or ">>>" in d for d in docs)
    val, train = pyref_documents("val"), pyref_documents("train")
    assert len(val) == len(docs) // PYREF_VAL_EVERY and not set(val) & set(train) and len(val) + len(train) == len(docs)
    assert real_documents(PYREF_SOURCE, "val") == val and source_fingerprint(PYREF_SOURCE) == []
    tok = build_tokenizer("byte")
    batches = real_text_batches(tok, "val", n_batches=2, batch_size=2, seq_len=32, source=PYREF_SOURCE)
    assert len(batches) == 2 and batches[0].shape == (2, 32)
    with pytest.raises(CircuitlabError, match="unknown real-text source 'gutenberg'"):
        real_documents("gutenberg")
