"""Real English prose that installs from a package registry or ships with Python, as data sources (VAL_EVERY-th
documents held out):

    kjv     the King James Bible (1611, public domain), 4.3 MB, from Debian's bible-kjv package (`apt-get install
            bible-kjv`; its `bible` program prints the text of bible-kjv-text, which it pulls in); one document per
            chapter, verse numbers stripped. Early-modern English.
    pyref   the Python Language Reference's prose (PSF licence), as the standard library ships it for `help()`
            (pydoc_data.topics: always installed, so CI has it); one document per topic, the grammar and code
            blocks (indented) and the headings' underlines left out. Today's technical English.

    docs = real_documents("pyref", "val")           # the held-out documents
    batches = real_text_batches(tokenizer, "val", n_batches=2, batch_size=8, seq_len=64, source="pyref")

The built-in stories are a synthetic grammar: the lenses and dictionaries of a model that learned language need
text like what it learned. Each source's split is by document, fixed: the documents a held-out measure reads
("val") are never in "train".
"""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
from typing import TYPE_CHECKING

from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    import torch

KJV_SOURCE = "kjv"
PYREF_SOURCE = "pyref"
REAL_SOURCES = (KJV_SOURCE, PYREF_SOURCE)
INSTALL = "apt-get install bible-kjv"   # Debian's package; it brings bible-kjv-text, the text itself
VAL_EVERY = 20     # chapter i is held out when i % VAL_EVERY == VAL_EVERY - 1 (60 of 1,189 chapters)
SPLITS = ("all", "train", "val")
_WHOLE = "gen1:1-rev22:21"   # the whole book, in the bible program's verse spec
_CHAPTER = re.compile(r"^(\S.*\S) (\d+)$")
_VERSE = re.compile(r"^\s+\d+ (.*)$")


@functools.cache   # the text is read once per process (0.3 s)
def kjv_text() -> str:
    """The whole King James Bible as the `bible` program prints it (a "Book N" line per chapter, then one
    "  N text" line per verse); one line saying how to install it when it is missing."""
    program = shutil.which("bible")
    if program is None:
        raise CircuitlabError(f"the kjv text source needs Debian's bible-kjv package: {INSTALL} (or give your own "
                              "text with --text FILE)")
    try:
        done = subprocess.run([program, "-l0", _WHOLE], capture_output=True, text=True, timeout=60, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        raise CircuitlabError(f"the bible program could not print the King James text ({type(e).__name__}); "
                              f"reinstall it: {INSTALL}") from None
    return done.stdout


def parse_chapters(text: str) -> list[tuple[str, str]]:
    """(title "Genesis 1", the chapter's verses joined by spaces) for each chapter of the bible program's
    output, verse numbers stripped, in order."""
    chapters: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        verse = _VERSE.match(line)
        if verse and chapters:
            chapters[-1][1].append(verse.group(1).strip())
        elif _CHAPTER.match(line.strip()) and not line.startswith(" "):
            chapters.append((line.strip(), []))
    return [(title, " ".join(verses)) for title, verses in chapters if verses]


def is_held_out(index: int, every: int = VAL_EVERY) -> bool:
    """Whether document `index` (0-based, in the source's order) belongs to the held-out split."""
    return index % every == every - 1


def _split(docs: list[str], split: str, every: int) -> list[str]:
    if split not in SPLITS:
        raise CircuitlabError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    return [d for i, d in enumerate(docs) if split == "all" or is_held_out(i, every) == (split == "val")]


def kjv_chapters(split: str = "all") -> list[str]:
    """The chapters of `split`: "all", "train" (never held out) or "val" (every VAL_EVERY-th chapter)."""
    if split not in SPLITS:
        raise CircuitlabError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    chapters = [body for _, body in parse_chapters(kjv_text())]
    if not chapters:
        raise CircuitlabError(f"the bible program printed no chapters; reinstall it: {INSTALL}")
    return _split(chapters, split, VAL_EVERY)


PYREF_VAL_EVERY = 8   # 79 topics in Python 3.11: 9 held out (about 8k tokens of prose), the rest train


def topic_prose(text: str) -> str:
    """One pydoc topic's prose: its paragraphs (blank-line separated blocks), each joined into one line, bullets'
    stars dropped. Left out: the headings' underlines (*** / === / ---), headings alone (three words or fewer),
    and code and grammar blocks: the text indents them by 3 beyond their context, where prose and bullets indent by
    2 (an odd indent), or they hold a grammar rule (::=) or an interactive prompt (>>>)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not set(line.strip()) <= set("*=-")]
        if not lines:
            continue
        indent = min(len(line) - len(line.lstrip(" ")) for line in lines)
        if indent % 2 or any("::=" in line or line.lstrip().startswith((">>>", "...")) for line in lines):
            continue
        words = " ".join(line.strip() for line in lines)
        words = words[2:] if words.startswith("* ") else words
        if len(words.split()) > 3:
            paragraphs.append(words)
    return "\n\n".join(paragraphs)


@functools.cache
def pyref_topics() -> list[str]:
    """The Python Language Reference's topics as prose, in sorted topic order (pydoc_data.topics)."""
    from pydoc_data.topics import topics

    return [prose for _, text in sorted(topics.items()) if (prose := topic_prose(text))]


def pyref_documents(split: str = "all") -> list[str]:
    """The pyref topics of `split`: "all", "train" (never held out) or "val" (every PYREF_VAL_EVERY-th topic)."""
    return _split(pyref_topics(), split, PYREF_VAL_EVERY)


def real_documents(source: str, split: str = "all") -> list[str]:
    """The documents of a real-text source (REAL_SOURCES) in `split`."""
    if source == KJV_SOURCE:
        return kjv_chapters(split)
    if source == PYREF_SOURCE:
        return pyref_documents(split)
    raise CircuitlabError(f"unknown real-text source {source!r}: choose one of {', '.join(REAL_SOURCES)}")


def real_text_batches(tokenizer, split: str, n_batches: int, batch_size: int, seq_len: int,
                      source: str = KJV_SOURCE) -> list["torch.Tensor"]:
    """The documents of `source`'s `split` tokenized and joined by EOS, cut into n_batches of [batch_size, seq_len]
    tokens (fewer when the split holds less). Refuses a split shorter than one batch."""
    import torch

    from circuitlab.data.packing import tokenize_documents

    need = n_batches * batch_size * seq_len
    tokens, _ = tokenize_documents(real_documents(source, split), tokenizer)
    n = min(n_batches, len(tokens) // (batch_size * seq_len))
    if n == 0:
        raise CircuitlabError(f"the {source} {split} split holds {len(tokens)} tokens; one batch needs "
                              f"{batch_size * seq_len}")
    flat = torch.from_numpy(tokens[:min(need, n * batch_size * seq_len)].astype("int64"))
    return list(flat.view(n, batch_size, seq_len))
