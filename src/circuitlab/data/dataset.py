"""DataConfig -> TokenData: a tokenizer plus train/val token streams with deterministic batches.

source "addition[:N[:M]]" gives AdditionData instead: one N-digit + M-digit problem per row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.data.packing import cache_key, default_cache_dir, load_or_pack
from circuitlab.data.sources import load_texts, parse_addition_source, source_fingerprint
from circuitlab.data.synthetic import PERIOD_DISTS, AdditionTask, tiled_random_segments
from circuitlab.data.tokenizers import CharTokenizer, Tokenizer, build_tokenizer, load_tokenizer, save_tokenizer
from circuitlab.errors import CircuitlabError, ConfigError, refuse_unknown

SPLITS = ("train", "val")
MAX_STORIES = 1_000_000  # ~270 MB of text and its tokens, generated and held at once



@dataclass
class DataConfig:
    """What text to train on and how to tokenize it.

    source: "stories", "file:PATH", "folder:PATH", "hf:NAME[:SPLIT][:FIELD]" (see data.sources), or
    "addition[:N[:M]]", the synthetic addition task (its own 11 tokens: tokenizer, vocab_size,
    n_stories, random_segment_frac and cache_dir do not apply; val_frac of the pairs are held out).

    random_segment_frac: fraction of each batch's rows replaced by tiled random
    segments (periodic random tokens that teach induction heads).
    segment_len: [min, max] period of those segments (short periods give the most copying signal).
    segment_only_steps: training steps (from 0) whose rows are all tiled random segments, before the
    mix with random_segment_frac starts (a curriculum: copying is learned fastest without text).
    segment_dist: how periods are drawn from segment_len: "uniform", or "log" (log-uniform: as many
    periods in 4-8 as in 16-32, so short periods drive the phase change while long ones still teach
    the heads to copy from any distance).
    cache_dir: token cache folder; None means $CIRCUITLAB_CACHE or ~/.cache/circuitlab/tokens.
    """

    source: str = "stories"
    n_stories: int = 20000
    tokenizer: str = "bpe"
    vocab_size: int = 512
    val_frac: float = 0.05
    seed: int = DEFAULT_SEED
    random_segment_frac: float = 0.0
    segment_len: tuple[int, int] | list[int] = (4, 16)  # period range of the tiled random segments
    segment_dist: str = "uniform"                        # "uniform" or "log" over segment_len
    segment_only_steps: int = 0                          # first training steps: segments only
    cache_dir: str | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field."""

        def bad(field, want):
            raise ConfigError(f"DataConfig.{field} must be {want}, got {getattr(self, field)!r}.")

        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        if not isinstance(self.source, str) or not self.source:
            bad("source", 'a non-empty string such as "stories", "file:PATH", "folder:PATH", "hf:NAME" or "addition:N:M"')
        parse_addition_source(self.source)  # a malformed addition spec fails here, not at build time
        if not is_int(self.n_stories) or self.n_stories < 1:
            bad("n_stories", "an int >= 1")
        if self.n_stories > MAX_STORIES:
            bad("n_stories", f"at most {MAX_STORIES:,} (the stories are generated and tokenised in memory at once)")
        if self.tokenizer not in ("char", "byte", "bpe", "gpt2") and not (
            isinstance(self.tokenizer, str) and self.tokenizer.startswith("hf:") and len(self.tokenizer) > 3
        ):
            bad("tokenizer", '"char", "byte", "bpe", "gpt2" or "hf:<name or path>"')
        if not is_int(self.vocab_size) or self.vocab_size < 2:
            bad("vocab_size", "an int >= 2")
        if self.tokenizer == "bpe" and self.vocab_size < 257:
            bad("vocab_size", "an int >= 257 for the bpe tokenizer (256 bytes + EOS)")
        if not is_num(self.val_frac) or not 0 <= self.val_frac < 1:
            bad("val_frac", "a number in [0, 1)")
        if not is_int(self.seed):
            bad("seed", "an int")
        if not is_num(self.random_segment_frac) or not 0 <= self.random_segment_frac <= 1:
            bad("random_segment_frac", "a number in [0, 1]")
        seg = self.segment_len
        if not (isinstance(seg, (list, tuple)) and len(seg) == 2 and all(is_int(x) for x in seg)
                and 1 <= seg[0] <= seg[1]):
            bad("segment_len", "[min, max] periods with 1 <= min <= max")
        self.segment_len = [int(seg[0]), int(seg[1])]  # a list, so YAML and JSON can write it
        if not is_int(self.segment_only_steps) or self.segment_only_steps < 0:
            bad("segment_only_steps", "an int >= 0")
        if self.segment_dist not in PERIOD_DISTS:
            bad("segment_dist", " or ".join(f'"{d}"' for d in PERIOD_DISTS))
        if isinstance(self.cache_dir, os.PathLike):
            self.cache_dir = os.fspath(self.cache_dir)
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            bad("cache_dir", "a folder path (string) or None")

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        """Build from a dict (e.g. a YAML section); unknown keys raise ConfigError."""
        refuse_unknown(d, sorted(f.name for f in dataclasses.fields(cls)), "data config field(s)", list_known=True)
        return cls(**d)


def _batch_seed(seed: int, split: str, step: int) -> int:
    digest = hashlib.sha256(f"circuitlab-batch:{seed}:{split}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class TokenData:
    """A tokenizer with train/val token streams (1-D uint16/uint32 arrays or memmaps)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        train: np.ndarray,
        val: np.ndarray,
        seed: int = DEFAULT_SEED,
        random_segment_frac: float = 0.0,
        segment_len: tuple[int, int] | list[int] = (4, 16),
        cache_path: Path | None = None,
        segment_dist: str = "uniform",
        segment_only_steps: int = 0,
    ):
        self.tokenizer = tokenizer
        self.train = train
        self.val = val
        self.seed = seed
        self.random_segment_frac = random_segment_frac
        self.segment_len = segment_len
        self.segment_dist = segment_dist
        self.segment_only_steps = segment_only_steps
        self.cache_path = cache_path

    def __repr__(self) -> str:
        return f"TokenData(tokenizer={self.tokenizer.name!r}, train={len(self.train):,} tokens, val={len(self.val):,} tokens)"

    def get_batch(self, split: str, step: int, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
        """Rows of seq_len + 1 tokens: LongTensor [batch_size // world_size, seq_len + 1].

        Inputs are [:, :-1] and targets [:, 1:]. The global batch of batch_size rows
        depends only on (seed, split, step), so training resumes exactly from a
        step; rank r gets the contiguous rows [r * b, (r + 1) * b) with
        b = batch_size // world_size, so the ranks' shares in rank order are the
        single-process batch.
        """
        _check_batch_args(split, step, batch_size, seq_len, rank, world_size)
        data = self.train if split == "train" else self.val
        n = seq_len + 1
        if len(data) < n:
            raise CircuitlabError(
                f"The {split} split has {len(data)} tokens, fewer than seq_len + 1 = {n}; "
                "use a smaller seq_len or more data (n_stories, val_frac)."
            )

        g = torch.Generator().manual_seed(_batch_seed(self.seed, split, step))
        starts = torch.randint(0, len(data) - n + 1, (batch_size,), generator=g).tolist()
        x = torch.from_numpy(np.stack([data[s : s + n] for s in starts]).astype(np.int64))  # [batch_size, n]
        only_segments = split == "train" and step < self.segment_only_steps and self.random_segment_frac > 0
        n_random = batch_size if only_segments else round(self.random_segment_frac * batch_size)
        if n_random:
            eos, vocab = self.tokenizer.eos_id, self.tokenizer.vocab_size
            rows = torch.randperm(batch_size, generator=g)[:n_random]
            seg = tiled_random_segments(n_random, n, vocab - 1, g, self.segment_len[0], self.segment_len[1],
                                        period_dist=self.segment_dist)
            x[rows] = seg + (seg >= eos).long()  # every token id except EOS
        per_rank = batch_size // world_size
        return x[rank * per_rank : (rank + 1) * per_rank]


def _check_batch_args(split: str, step: int, batch_size: int, seq_len: int, rank: int, world_size: int) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split must be 'train' or 'val', got {split!r}.")
    for name, value, low in (("step", step, 0), ("batch_size", batch_size, 1), ("seq_len", seq_len, 1), ("world_size", world_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an int >= {low}, got {value!r}.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an int in [0, {world_size - 1}], got {rank!r}.")
    if batch_size % world_size:
        raise ConfigError(f"batch_size ({batch_size}) must be divisible by world_size ({world_size}); change one of them.")


def addition_tokenizer() -> CharTokenizer:
    """The addition task's tokens: digits 0..9 are ids 0..9 and EOS is 10 (AdditionTask's format)."""
    return CharTokenizer("0123456789")


ENUMERATE_LIMIT = 1_000_000  # up to this many pairs, each split's pairs are listed once and drawn from


class AdditionData(TokenData):
    """The addition task as training batches: every row is one problem, [a, b, EOS, answer] tokens
    (AdditionTask's format), so train.seq_len must be task.seq_len - 1.

    The pairs (a, b) are split by a seeded hash: a val_frac share of them is held out for "val" and
    never drawn for "train" (val_frac 0: both splits draw from every pair). Batches depend only on
    (seed, split, step), like TokenData's. The next-token loss covers every position, so it includes
    the unpredictable digits of a and b; only the positions from EOS on are the answer.
    """

    def __init__(self, task: AdditionTask, seed: int = DEFAULT_SEED, val_frac: float = 0.05):
        empty = np.zeros(0, dtype=np.uint16)
        super().__init__(addition_tokenizer(), empty, empty, seed=seed)
        self.task, self.val_frac = task, float(val_frac)
        self.n_pairs = 10 ** (task.n_digits_a + task.n_digits_b)
        self._listed: dict[str, torch.Tensor] = {}
        if self.n_pairs <= ENUMERATE_LIMIT:
            held_out = self.is_val_index(torch.arange(self.n_pairs))
            self._listed = {"train": torch.nonzero(~held_out).flatten(), "val": torch.nonzero(held_out).flatten()}
            if self.val_frac > 0 and not (len(self._listed["train"]) and len(self._listed["val"])):
                raise ConfigError(f"val_frac {val_frac} leaves no {'val' if not len(self._listed['val']) else 'train'} "
                                  f"pairs among the {self.n_pairs} problems; change val_frac.")

    def __repr__(self) -> str:
        return (f"AdditionData({self.task.n_digits_a}+{self.task.n_digits_b} digits, {self.n_pairs:,} pairs, "
                f"val_frac={self.val_frac})")

    def is_val_index(self, index: torch.Tensor) -> torch.Tensor:
        """index = a·10^M + b [k] (int64) -> [k] bool: the pair is held out for val."""
        if self.val_frac <= 0:
            return torch.zeros(index.shape, dtype=torch.bool)
        mask = 2**47 - 1  # x stays under 2^47, so x · 0x6F4B (< 2^15) stays inside int64
        x = index.long() ^ ((self.seed * 0x5BD1E995 + 0x2545F4914F6C) & mask)
        x = (x & mask) ^ (x >> 47)
        for _ in range(3):  # xorshift-multiply rounds
            x = ((x ^ (x >> 17)) * 0x6F4B & mask) ^ (x >> 29)
        return (x % 1_000_003).double() / 1_000_003 < self.val_frac

    def is_val(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a, b [k] -> [k] bool: the pair is held out for val."""
        return self.is_val_index(a.long() * 10 ** self.task.n_digits_b + b.long())

    def _indices(self, split: str, k: int, g: torch.Generator) -> torch.Tensor:
        listed = self._listed.get(split) if self.val_frac > 0 else None
        if listed is not None:
            return listed[torch.randint(0, len(listed), (k,), generator=g)]
        want_val, found, have = split == "val", [], 0
        while have < k:  # rejection sampling: draw pairs, keep those of this split
            idx = torch.randint(0, self.n_pairs, (4 * k,), generator=g)
            if self.val_frac > 0:
                idx = idx[self.is_val_index(idx) == want_val]
            found.append(idx)
            have += len(idx)
        return torch.cat(found)[:k]

    def get_batch(self, split: str, step: int, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
        """Problems of this split: LongTensor [batch_size // world_size, task.seq_len]; see TokenData.get_batch."""
        _check_batch_args(split, step, batch_size, seq_len, rank, world_size)
        if seq_len != self.task.seq_len - 1:
            raise ConfigError(f"the {self.task.n_digits_a}+{self.task.n_digits_b}-digit addition task has rows of "
                              f"{self.task.seq_len} tokens: set train.seq_len to {self.task.seq_len - 1}, got {seq_len}.")
        g = torch.Generator().manual_seed(_batch_seed(self.seed, split, step))
        idx = self._indices(split, batch_size, g)
        m = self.task.n_digits_b
        pairs = list(zip((idx // 10**m).tolist(), (idx % 10**m).tolist()))
        tokens, _ = self.task.batch(pairs)
        per_rank = batch_size // world_size
        return tokens[rank * per_rank : (rank + 1) * per_rank]


def _corpus_key(cfg: DataConfig) -> dict:
    key: dict[str, Any] = {"source": cfg.source, "files": source_fingerprint(cfg.source)}
    if cfg.source == "stories":
        key.update(n_stories=cfg.n_stories, seed=cfg.seed)
    return key


def _trained_tokenizer(cfg: DataConfig, corpus: dict, make_texts, root: Path) -> Tokenizer:
    """char/bpe: trained on the corpus once, then reloaded from the cache."""
    folder = root / ("tokenizer-" + cache_key({**corpus, "tokenizer": cfg.tokenizer, "vocab_size": cfg.vocab_size}))
    if (folder / "tokenizer_meta.json").is_file():
        try:
            return load_tokenizer(folder)
        except CircuitlabError:
            pass  # damaged cache entry: retrain below
    tok = build_tokenizer(cfg.tokenizer, make_texts(), cfg.vocab_size)
    try:
        save_tokenizer(tok, folder)
    except OSError as e:
        raise CircuitlabError(f"Could not write the tokenizer cache in {root} ({e}); set cache_dir or $CIRCUITLAB_CACHE to a writable folder.") from None
    return tok


def build_data(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> TokenData:
    """Load the corpus, build (or reuse) the tokenizer and the cached token streams.

    Pass `tokenizer` to reuse a saved one (e.g. when resuming); otherwise char and
    bpe tokenizers are trained on the corpus (and cached), the others are built.
    """
    if not isinstance(cfg, DataConfig):
        raise ConfigError(f"build_data needs a DataConfig, got {type(cfg).__name__}.")
    cfg.validate()
    digits = parse_addition_source(cfg.source)
    if digits is not None:
        if cfg.random_segment_frac > 0:
            raise ConfigError("random_segment_frac does not apply to the addition task; set it to 0.")
        if tokenizer is not None and tokenizer.identity() != addition_tokenizer().identity():
            raise ConfigError(f"the addition task has its own tokens (digits 0..9, EOS = 10); got {tokenizer!r}.")
        return AdditionData(AdditionTask(*digits), seed=cfg.seed, val_frac=cfg.val_frac)
    root = Path(cfg.cache_dir).expanduser() if cfg.cache_dir is not None else default_cache_dir()
    corpus = _corpus_key(cfg)

    def make_texts():
        return load_texts(cfg.source, n_stories=cfg.n_stories, seed=cfg.seed)

    if tokenizer is None:
        if cfg.tokenizer in ("char", "bpe"):
            tokenizer = _trained_tokenizer(cfg, corpus, make_texts, root)
        else:
            tokenizer = build_tokenizer(cfg.tokenizer, vocab_size=cfg.vocab_size)
    elif not isinstance(tokenizer, Tokenizer):
        raise ConfigError(f"tokenizer must be a circuitlab Tokenizer (see load_tokenizer), got {type(tokenizer).__name__}.")
    if cfg.random_segment_frac > 0 and tokenizer.vocab_size < 3:
        raise ConfigError("random_segment_frac needs a tokenizer with at least 2 non-EOS tokens; set it to 0.")
    train, val, entry = load_or_pack(corpus, make_texts, tokenizer, cfg.val_frac, root)
    return TokenData(tokenizer, train, val, seed=cfg.seed, random_segment_frac=cfg.random_segment_frac,
                     segment_len=cfg.segment_len, cache_path=entry, segment_dist=cfg.segment_dist,
                     segment_only_steps=cfg.segment_only_steps)
