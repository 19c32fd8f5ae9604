"""Reading the user's text files (prompt files, answer files, training text): one reader, one message.

    text = read_text("dragon.txt", "positive prompt file")
    prompts = read_lines("dragon.txt", "positive prompt file")     # non-blank lines, stripped of "\\n"

A missing file, a folder, or bytes that are not UTF-8 are one InputError naming the file (and, for
bad bytes, the byte offset and the bytes found there), never a UnicodeDecodeError traceback. A UTF-8
byte-order mark (as Windows editors write) is dropped.
"""
from __future__ import annotations

import codecs
from pathlib import Path

from circuitlab.errors import InputError


def read_text(path: str | Path, what: str = "text file") -> str:
    """The whole file as text; `what` names it in messages ("prompt file", "--text file")."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} not found: {p}")
    if p.is_dir():
        raise InputError(f"{what} {p} is a folder; give a text file")
    data = p.read_bytes()
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        offset = start + e.start
        line = data[:offset].count(b"\n") + 1
        raise InputError(f"{what} {p} is not UTF-8 text: byte {offset} (line {line}) is 0x{data[offset]:02x}; "
                         "save it as UTF-8") from None


def read_lines(path: str | Path, what: str = "text file", keep_blank: bool = False) -> list[str]:
    """The file's lines without their line ends; blank lines dropped unless keep_blank."""
    lines = read_text(path, what).splitlines()
    return lines if keep_blank else [line for line in lines if line.strip()]
