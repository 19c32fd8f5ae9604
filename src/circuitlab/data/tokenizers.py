"""Tokenizers behind one small interface: char, byte, bpe, gpt2 and hf:<name>.

Every tokenizer has `name`, `vocab_size`, `eos_id`, `encode`, `decode` and `save`.
EOS separates documents in the packed token stream; `decode` writes it as
"<|endoftext|>".
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterable, cast

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import CircuitlabError, ConfigError, InputError

EOS_TEXT = "<|endoftext|>"
META_FILE = "tokenizer_meta.json"
BPE_FILE = "tokenizer.json"
VALID_SPECS = "char, byte, bpe, gpt2, hf:<name or local path>"


def check_text(text: str, what: str = "the text") -> str:
    """text itself, or an InputError when it is not a str or holds lone surrogates (what a JSON "\\ud800"
    escape or undecodable command-line bytes give), which no tokenizer can encode."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, got {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"{what} is not valid Unicode: {text[e.start]!r} at character {e.start} is a lone "
                             "surrogate; send UTF-8 text") from None
    return text


class Tokenizer(ABC):
    """Text <-> token ids. Subclasses set `name`, `vocab_size` and `eos_id`."""

    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no EOS added); an InputError for text that is not a valid Unicode string."""
        return self._encode(check_text(text))

    @abstractmethod
    def _encode(self, text: str) -> list[int]:
        """encode() of text already checked by check_text."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; the EOS id becomes "<|endoftext|>"."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Encode many documents (subclasses may do this faster)."""
        return [self.encode(t) for t in texts]

    def token_id(self, text: str, what: str = "token") -> int:
        """The id of `text` when it is exactly one token, else a CircuitlabError naming `what`
        (e.g. "target") and how the text splits."""
        ids = self.encode(text)
        if len(ids) != 1:
            split = " + ".join(repr(self.decode([i])) for i in ids) if ids else "no tokens"
            raise CircuitlabError(f"{what} {text!r} is not one token of this tokenizer (it encodes to {split}); "
                                  "give a single token, with its leading space if it has one")
        return ids[0]

    def meta(self) -> dict:
        """Small JSON-able description written to tokenizer_meta.json."""
        return {"kind": self.name}

    def identity(self) -> str:
        """A string that changes whenever the token mapping changes (for cache keys)."""
        return json_text(self.meta(), sort_keys=True)

    def save(self, directory: str | Path) -> None:
        save_tokenizer(self, directory)

    def to_hf(self):
        """The same token mapping as a transformers tokenizer (for Hugging Face exports), or None
        where there is no such form (char, byte, gpt2 via tiktoken)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class CharTokenizer(Tokenizer):
    """One token per character seen in the corpus (sorted), plus EOS = len(chars)."""

    name = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = sorted(set(chars))
        if not self.chars or any(len(c) != 1 for c in self.chars):
            raise ConfigError("CharTokenizer needs a non-empty list of single characters; build it from a non-empty corpus.")
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.eos_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "CharTokenizer":
        chars: set[str] = set()
        for t in texts:
            chars.update(t)
        if not chars:
            raise CircuitlabError("The corpus has no characters, so the char tokenizer cannot be built; check the data source.")
        return cls(chars)

    def _encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise CircuitlabError(
                f"Character {e.args[0]!r} is not in the char tokenizer's vocabulary (built from the training corpus); "
                "use the 'byte' or 'bpe' tokenizer for open text."
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(EOS_TEXT if i == self.eos_id else self.chars[i] for i in ids)

    def meta(self) -> dict:
        return {"kind": "char", "chars": self.chars}


class ByteTokenizer(Tokenizer):
    """The 256 UTF-8 byte values, plus EOS = 256."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def _encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        parts, buf = [], bytearray()
        for i in ids:
            if i == self.eos_id:
                parts.append(buf.decode("utf-8", errors="replace") + EOS_TEXT)
                buf = bytearray()
            else:
                buf.append(i)
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)


class BPETokenizer(Tokenizer):
    """Byte-level BPE (HF `tokenizers`) trained on the corpus; EOS is "<|endoftext|>"."""

    name = "bpe"

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        eos = self.hf.token_to_id(EOS_TEXT)
        if eos is None:
            raise CircuitlabError(f"This BPE tokenizer has no {EOS_TEXT} token; retrain it with build_tokenizer('bpe', texts).")
        self.eos_id = eos
        self.vocab_size = self.hf.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 512) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTok
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
            raise ConfigError(f"vocab_size must be an int >= 257 for the bpe tokenizer (256 bytes + EOS), got {vocab_size!r}.")
        tok = HFTok(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(iter_batches(texts, 1000), trainer=trainer)
        return cls(tok)

    def _encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def meta(self) -> dict:
        return {"kind": "bpe", "vocab_size": self.vocab_size}

    def identity(self) -> str:
        return json_text(self.meta(), sort_keys=True) + self.hf.to_str()

    def to_hf(self):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self.hf, eos_token=EOS_TEXT, bos_token=EOS_TEXT)


class GPT2Tokenizer(Tokenizer):
    """The GPT-2 BPE from tiktoken (50257 tokens; EOS 50256). Needs tiktoken's cache or network."""

    name = "gpt2"

    def __init__(self):
        try:
            import tiktoken

            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # ImportError, network or cache errors
            raise CircuitlabError(
                f"The gpt2 tokenizer could not be loaded ({type(e).__name__}): tiktoken needs network access or a "
                "cached copy of the gpt2 encoding; use one of the offline tokenizers char, byte, bpe, or hf:<local path>."
            ) from None
        self.vocab_size = self.enc.n_vocab
        self.eos_id = self.enc.eot_token

    def _encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts, num_threads=2)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids))


class HFTokenizer(Tokenizer):
    """Any `transformers.AutoTokenizer`, by hub name or local path ("hf:<name or path>")."""

    def __init__(self, path: str, files: str | Path | None = None, loaded=None):
        """path: the hub name or folder it came from (its name); files: a folder holding a saved
        copy to load instead; loaded: an already loaded transformers tokenizer to wrap."""
        try:
            from transformers import AutoTokenizer

            self.hf = loaded if loaded is not None else AutoTokenizer.from_pretrained(str(files or path))
        except Exception as e:
            reason = (str(e).splitlines() or [""])[0]
            raise CircuitlabError(
                f"The tokenizer 'hf:{path}' could not be loaded ({type(e).__name__}: {reason}); a hub name needs network "
                "access or a cached copy, so give a local folder (hf:<path>) or use char, byte or bpe."
            ) from None
        if self.hf.eos_token_id is None:
            raise CircuitlabError(f"The tokenizer 'hf:{path}' has no EOS token, which is needed to separate documents; pick another tokenizer.")
        self.saved_max_length = self.hf.model_max_length  # what save_pretrained writes
        self.hf.model_max_length = 10**12  # we pack long documents ourselves; silence length warnings
        self.path = path
        self.name = f"hf:{path}"
        self.vocab_size = len(self.hf)
        self.eos_id = self.hf.eos_token_id

    def _encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.hf(texts, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return cast(str, self.hf.decode(list(ids)))  # one sequence of ids: one string

    def meta(self) -> dict:
        return {"kind": "hf", "path": self.path, "vocab_size": self.vocab_size}

    def to_hf(self):
        """The transformers tokenizer, with the context limit it came with (for saving)."""
        from copy import copy

        hf = copy(self.hf)
        hf.model_max_length = self.saved_max_length
        return hf


def iter_batches(texts: Iterable[str], n: int):
    batch = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def build_tokenizer(spec: str, texts: Iterable[str] | None = None, vocab_size: int = 512) -> Tokenizer:
    """Make the tokenizer named by `spec`; char and bpe are built from `texts`."""
    if not isinstance(spec, str):
        raise ConfigError(f"tokenizer must be a string (one of {VALID_SPECS}), got {spec!r}.")
    if spec in ("char", "bpe"):
        if texts is None:
            raise ConfigError(f"The {spec} tokenizer is built from the corpus; pass texts=... to build_tokenizer.")
        return CharTokenizer.from_texts(texts) if spec == "char" else BPETokenizer.train(texts, vocab_size)
    if spec == "byte":
        return ByteTokenizer()
    if spec == "gpt2":
        return GPT2Tokenizer()
    if spec.startswith("hf:") and len(spec) > 3:
        return HFTokenizer(spec[3:])
    raise ConfigError(f"Unknown tokenizer {spec!r}; use one of {VALID_SPECS}.")


def save_tokenizer(tok: Tokenizer, directory: str | Path) -> None:
    """Write tokenizer_meta.json (and tokenizer.json for bpe, the transformers files for hf) into
    `directory`, so that the folder alone rebuilds it. A transformers tokenizer is saved as hf."""
    if hasattr(tok, "save_pretrained"):
        tok = HFTokenizer(getattr(tok, "name_or_path", "") or "unknown", loaded=tok)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(tok, BPETokenizer):
        atomic_write_text(directory / BPE_FILE, tok.hf.to_str())
    if isinstance(tok, HFTokenizer):
        tok.to_hf().save_pretrained(str(directory))
    atomic_write_text(directory / META_FILE, json_text(tok.meta(), indent=1))  # last: marks the save complete


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Rebuild the tokenizer saved by `save_tokenizer` in `directory`."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise CircuitlabError(f"No saved tokenizer in {directory} ({META_FILE} is missing); point to a folder written by save_tokenizer.")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        kind = meta["kind"]
        if kind == "char":
            return CharTokenizer(meta["chars"])
        if kind == "byte":
            return ByteTokenizer()
        if kind == "bpe":
            from tokenizers import Tokenizer as HFTok

            return BPETokenizer(HFTok.from_file(str(directory / BPE_FILE)))
        if kind == "gpt2":
            return GPT2Tokenizer()
        if kind == "hf":  # the saved copy when there is one (older folders hold only the name)
            saved = directory if (directory / "tokenizer_config.json").is_file() else None
            return HFTokenizer(meta["path"], files=saved)
        raise KeyError(f"unknown kind {kind!r}")
    except CircuitlabError:
        raise
    except Exception as e:
        raise CircuitlabError(
            f"The saved tokenizer in {directory} is corrupt or incomplete ({type(e).__name__}: {e}); delete it and rebuild the tokenizer."
        ) from None
