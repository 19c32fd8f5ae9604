"""Tokenize documents into one EOS-separated token stream, split train/val, cache as .bin files.

Cache layout: <cache_dir>/<key>/{train.bin, val.bin, meta.json}. The key is the
sha256 of the source spec, sizes, seed, val_frac and the tokenizer's identity,
so a second build with the same settings memory-maps the files instead of
tokenizing again. meta.json is written last and marks the entry complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm import tqdm

from circuitlab.atomic import atomic_write_array, atomic_write_text, json_text
from circuitlab.data.tokenizers import Tokenizer, iter_batches
from circuitlab.errors import CircuitlabError

CACHE_ENV = "CIRCUITLAB_CACHE"


def default_cache_dir() -> Path:
    """$CIRCUITLAB_CACHE if set, else ~/.cache/circuitlab/tokens."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "circuitlab" / "tokens"


def cache_key(parts: dict) -> str:
    """sha256 hex digest of `parts` (JSON-able) with sorted keys."""
    return hashlib.sha256(json_text(parts, sort_keys=True).encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def tokenize_documents(texts: Iterable[str], tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Encode each document and append EOS.

    Returns (tokens [n_tokens] uint16/uint32, doc_ends [n_docs] int64: end offset of each document).
    A progress bar appears when tokenizing takes more than a couple of seconds.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    chunks, lengths = [], []
    with tqdm(desc="tokenizing", unit="doc", delay=2.0) as bar:
        for batch in iter_batches(texts, 1000):
            for ids in tokenizer.encode_batch(batch):
                ids = list(ids) + [tokenizer.eos_id]
                chunks.append(np.asarray(ids, dtype=dtype))
                lengths.append(len(ids))
            bar.update(len(batch))
    if not chunks:
        raise CircuitlabError("The corpus has no documents to tokenize; check the data source.")
    return np.concatenate(chunks), np.cumsum(lengths)


def split_tokens(tokens: np.ndarray, doc_ends: np.ndarray, val_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): val is the last ~val_frac of the tokens.

    The split is at the document boundary nearest to the target when that keeps
    the val size within half of val_frac of the request; otherwise (few, long
    documents) it is at the exact token fraction.
    """
    n = len(tokens)
    if val_frac <= 0 or n < 2:
        return tokens, tokens[:0]
    target = min(max(round(n * (1 - val_frac)), 1), n - 1)
    inner = doc_ends[doc_ends < n]  # boundaries strictly inside the stream
    cut = target
    if len(inner):
        nearest = int(inner[np.argmin(np.abs(inner - target))])
        if abs((n - nearest) / n - val_frac) <= val_frac / 2:
            cut = nearest
    return tokens[:cut], tokens[cut:]


def pack_tokens(texts: Iterable[str], tokenizer: Tokenizer, val_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize `texts` with EOS separators and split into (train, val) arrays."""
    tokens, doc_ends = tokenize_documents(texts, tokenizer)
    return split_tokens(tokens, doc_ends, val_frac)


def _load_bin(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    if path.stat().st_size != n * dtype.itemsize:
        raise ValueError(f"{path} has the wrong size")
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def load_cached(entry: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(train, val) memmaps of a complete cache entry, or None if absent or damaged."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        return _load_bin(entry / "train.bin", dtype, meta["n_train"]), _load_bin(entry / "val.bin", dtype, meta["n_val"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_or_pack(
    key_parts: dict,
    make_texts: Callable[[], Iterable[str]],
    tokenizer: Tokenizer,
    val_frac: float,
    cache_dir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray, Path]:
    """(train, val, entry folder), from the cache when present, else tokenized and cached.

    `make_texts` is only called on a cache miss. `key_parts` describes the corpus
    (source, sizes, seed); val_frac and the tokenizer identity are added to the key.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = cache_key({**key_parts, "val_frac": val_frac, "tokenizer": tokenizer.identity()})
    entry = root / key
    cached = load_cached(entry)
    if cached is not None:
        return cached[0], cached[1], entry
    train, val = pack_tokens(make_texts(), tokenizer, val_frac)
    try:
        entry.mkdir(parents=True, exist_ok=True)
        atomic_write_array(entry / "train.bin", train)
        atomic_write_array(entry / "val.bin", val)
        meta = {"dtype": train.dtype.name, "n_train": len(train), "n_val": len(val), "tokenizer": tokenizer.name, **key_parts}
        atomic_write_text(entry / "meta.json", json_text(meta, indent=1))
    except OSError as e:
        raise CircuitlabError(f"Could not write the token cache in {root} ({e}); set cache_dir or ${CACHE_ENV} to a writable folder.") from None
    cached = load_cached(entry)
    if cached is None:
        raise CircuitlabError(f"The token cache entry {entry} could not be read back; delete it and try again.")
    return cached[0], cached[1], entry
