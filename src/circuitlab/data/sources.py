"""Where the training text comes from: built-in stories, local files, or HF datasets.

Source specs:
  "stories"                     the built-in story corpus (n_stories, seed)
  "kjv"                         real English: the King James Bible from Debian's bible-kjv package, one
                                document per chapter (circuitlab.data.realtext; its held-out chapters: "val")
  "pyref"                       real English that ships with Python: the Language Reference's prose
                                (pydoc_data, PSF licence), one document per topic (circuitlab.data.realtext)
  "file:PATH" or "PATH"         a .txt/.md file; blank-line-separated blocks are documents
  "folder:PATH"                 every .txt/.md file under PATH (sorted); each file is a document
  "hf:NAME[:SPLIT][:FIELD]"     datasets.load_dataset(NAME), split "train", field "text" by default;
                                NAME may also be a local .txt/.json/.jsonl/.csv/.parquet file
  "addition[:N[:M]]"            not text: the synthetic N-digit + M-digit addition task (default 2, and
                                M = N), one problem per row (circuitlab.data.dataset.AdditionData)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Iterator

from circuitlab.checks import DEFAULT_SEED
from circuitlab.data.realtext import REAL_SOURCES, real_documents
from circuitlab.data.stories import generate_stories
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.textfile import read_text

VALID_SOURCES = '"stories", "kjv", "pyref", "file:PATH", a .txt path, "folder:PATH", "hf:NAME[:SPLIT][:FIELD]"'
ADDITION_MAX_DIGITS = 9  # a and b stay far inside int64, and a pair's index a·10^M + b too
TEXT_SUFFIXES = (".txt", ".md")
_HF_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}



def load_texts(source: str, n_stories: int = 20000, seed: int = DEFAULT_SEED) -> Iterator[str]:
    """Documents of `source` as an iterator of strings.

    Bad specs and missing paths raise at once; an empty corpus raises when the
    iterator ends without yielding anything.
    """
    if not isinstance(source, str) or not source:
        raise ConfigError(f"source must be a non-empty string: one of {VALID_SOURCES}; got {source!r}.")
    if parse_addition_source(source) is not None:
        raise ConfigError(f"{source!r} is a synthetic token task, not text; build it with build_data(DataConfig(source=...)).")
    if source == "stories":
        docs: Iterable[str] = generate_stories(n_stories, seed)
    elif source in REAL_SOURCES:
        docs = real_documents(source, "all")
    elif source.startswith("hf:"):
        docs = _hf_texts(source)
    elif source.startswith("folder:"):
        docs = _folder_texts(_existing(source[len("folder:") :], folder=True))
    else:
        path = source[len("file:") :] if source.startswith("file:") else source
        if not source.startswith("file:") and not Path(path).exists() and not path.endswith(TEXT_SUFFIXES):
            raise ConfigError(f"Unknown data source {source!r}; use one of {VALID_SOURCES}.")
        docs = _file_texts(_existing(path, folder=False))
    return _nonempty(docs, source)


def parse_addition_source(source: str) -> tuple[int, int] | None:
    """"addition", "addition:N" or "addition:N:M" -> (N, M) digits of a and b (defaults 2 and N);
    None for any other source. A malformed addition spec raises ConfigError."""
    if not isinstance(source, str) or (source != "addition" and not source.startswith("addition:")):
        return None
    parts = source.split(":")[1:]
    if len(parts) > 2 or not all(p.isdigit() and 1 <= int(p) <= ADDITION_MAX_DIGITS for p in parts):
        raise ConfigError(f"Bad addition source {source!r}; write addition, addition:N or addition:N:M with digit "
                          f"counts from 1 to {ADDITION_MAX_DIGITS}.")
    n = int(parts[0]) if parts else 2
    return n, int(parts[1]) if len(parts) > 1 else n


def _nonempty(docs: Iterable[str], source: str) -> Iterator[str]:
    count = 0
    for d in docs:
        if d.strip():
            count += 1
            yield d
    if count == 0:
        raise CircuitlabError(f"The data source {source!r} has no text; point it at a non-empty file, folder or dataset.")


def _existing(path: str, folder: bool) -> Path:
    p = Path(path).expanduser()
    if folder and not p.is_dir():
        raise CircuitlabError(f"Data folder {str(p)!r} does not exist; check the path in 'folder:PATH'.")
    if not folder and not p.is_file():
        raise CircuitlabError(f"Data file {str(p)!r} does not exist; check the path (or use source 'stories' for the built-in corpus).")
    return p


def _split_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]


def _file_texts(path: Path) -> Iterator[str]:
    yield from _split_blocks(read_text(path, "data file"))  # not UTF-8: one line with the byte offset


def folder_files(path: Path) -> list[Path]:
    """The .txt/.md files under `path`, sorted."""
    return sorted(p for p in Path(path).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def _folder_texts(path: Path) -> Iterator[str]:
    for f in folder_files(path):
        yield read_text(f, "data file").strip()


def parse_hf_source(source: str) -> tuple[str, str, str]:
    """"hf:NAME[:SPLIT][:FIELD]" -> (NAME, SPLIT, FIELD) with defaults "train" and "text"."""
    parts = source[len("hf:") :].split(":")
    if not parts[0] or len(parts) > 3 or any(not p for p in parts):
        raise ConfigError(f"Bad HF source {source!r}; write it as hf:NAME, hf:NAME:SPLIT or hf:NAME:SPLIT:FIELD.")
    name, split, field = parts[0], "train", "text"
    if len(parts) > 1:
        split = parts[1]
    if len(parts) > 2:
        field = parts[2]
    return name, split, field


def _hf_texts(source: str) -> Iterator[str]:
    name, split, field = parse_hf_source(source)
    try:
        import datasets
    except ImportError:
        raise CircuitlabError("HF sources need the `datasets` package; install circuitlab[hub] or use a file:/stories source.") from None
    path = Path(name).expanduser()
    try:
        if path.is_file():
            builder = _HF_FILE_BUILDERS.get(path.suffix)
            if builder is None:
                raise CircuitlabError(f"Cannot read {name!r} as a dataset; use a .txt, .json, .jsonl, .csv or .parquet file.")
            kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
            ds = datasets.load_dataset(builder, data_files=str(path), split=split, streaming=True, **kwargs)
        else:
            ds = datasets.load_dataset(name, split=split, streaming=True)
    except CircuitlabError:
        raise
    except (ConnectionError, OSError) as e:
        raise CircuitlabError(
            f"Could not load the dataset {name!r} ({type(e).__name__}): the Hugging Face hub needs network access "
            "(or a cached copy); use a local 'file:PATH' or the built-in 'stories' source instead."
        ) from None
    except Exception as e:
        raise CircuitlabError(f"Could not load the dataset {name!r} split {split!r} ({type(e).__name__}: {e}); check the name and split.") from None
    return _hf_rows(ds, name, field)


def _hf_rows(ds, name: str, field: str) -> Iterator[str]:
    try:
        for row in ds:
            if field not in row:
                raise CircuitlabError(f"The dataset {name!r} has no field {field!r} (fields: {', '.join(row)}); write hf:NAME:SPLIT:FIELD.")
            text = row[field]
            if isinstance(text, str) and text.strip():
                yield text.strip()
    except CircuitlabError:
        raise
    except (ConnectionError, OSError) as e:
        raise CircuitlabError(
            f"Reading the dataset {name!r} failed ({type(e).__name__}); streaming from the hub needs network access, "
            "so use a local 'file:PATH' or the built-in 'stories' source instead."
        ) from None


def source_fingerprint(source: str) -> list:
    """(path, size, mtime) of the local files behind `source`, so edits invalidate caches; [] otherwise."""
    if source == "stories" or source in REAL_SOURCES:
        return []
    if source.startswith("folder:"):
        files = folder_files(Path(source[len("folder:") :]).expanduser())
    elif source.startswith("hf:"):
        p = Path(parse_hf_source(source)[0]).expanduser()
        files = [p] if p.is_file() else []
    else:
        p = Path(source[len("file:") :] if source.startswith("file:") else source).expanduser()
        files = [p] if p.is_file() else []
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
