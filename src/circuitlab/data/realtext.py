"""Real English prose that installs from a package registry: the King James Bible (1611, public domain), 4.3 MB
of text, from Debian's bible-kjv package (`apt-get install bible-kjv`; its `bible` program prints the text of
bible-kjv-text, which it pulls in).

    docs = kjv_chapters("val")                      # the held-out chapters (every 20th of the 1,189)
    batches = real_text_batches(tokenizer, "val", n_batches=2, batch_size=8, seq_len=64)

The built-in stories are a synthetic grammar: the lenses and dictionaries of a model that learned language need
text like what it learned. This is the `kjv` data source (circuitlab.data.sources): one document per chapter,
verse numbers stripped. Its split is by chapter, fixed (VAL_EVERY): the chapters a held-out measure reads
("val") are never in "train". Early-modern English, so a model of today's English finds it harder than modern
prose; it is real text all the same, and nobody's copyright.
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


def is_held_out(index: int) -> bool:
    """Whether chapter `index` (0-based, in the book's order) belongs to the held-out split."""
    return index % VAL_EVERY == VAL_EVERY - 1


def kjv_chapters(split: str = "all") -> list[str]:
    """The chapters of `split`: "all", "train" (never held out) or "val" (every VAL_EVERY-th chapter)."""
    if split not in SPLITS:
        raise CircuitlabError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    chapters = [body for _, body in parse_chapters(kjv_text())]
    if not chapters:
        raise CircuitlabError(f"the bible program printed no chapters; reinstall it: {INSTALL}")
    return [c for i, c in enumerate(chapters) if split == "all" or is_held_out(i) == (split == "val")]


def real_text_batches(tokenizer, split: str, n_batches: int, batch_size: int, seq_len: int) -> list["torch.Tensor"]:
    """The chapters of `split` tokenized and joined by EOS, cut into n_batches of [batch_size, seq_len] tokens
    (fewer when the split holds less). Refuses a split shorter than one batch."""
    import torch

    from circuitlab.data.packing import tokenize_documents

    need = n_batches * batch_size * seq_len
    tokens, _ = tokenize_documents(kjv_chapters(split), tokenizer)
    n = min(n_batches, len(tokens) // (batch_size * seq_len))
    if n == 0:
        raise CircuitlabError(f"the kjv {split} split holds {len(tokens)} tokens; one batch needs "
                              f"{batch_size * seq_len}")
    flat = torch.from_numpy(tokens[:min(need, n * batch_size * seq_len)].astype("int64"))
    return list(flat.view(n, batch_size, seq_len))
