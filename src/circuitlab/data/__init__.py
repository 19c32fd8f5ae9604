"""Data: tokenizers, the built-in story corpus, synthetic tasks, text sources and token batches."""

from circuitlab.data.dataset import DataConfig, TokenData, build_data
from circuitlab.data.packing import default_cache_dir, load_or_pack, pack_tokens, tokenize_documents
from circuitlab.data.sources import load_texts
from circuitlab.data.stories import generate_stories, make_name, stories_text
from circuitlab.data.synthetic import AdditionTask, repeated_random_tokens, tiled_random_segments
from circuitlab.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    HFTokenizer,
    Tokenizer,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

__all__ = [
    "AdditionTask",
    "BPETokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "DataConfig",
    "GPT2Tokenizer",
    "HFTokenizer",
    "TokenData",
    "Tokenizer",
    "build_data",
    "build_tokenizer",
    "default_cache_dir",
    "generate_stories",
    "load_or_pack",
    "load_texts",
    "load_tokenizer",
    "make_name",
    "pack_tokens",
    "repeated_random_tokens",
    "save_tokenizer",
    "stories_text",
    "tiled_random_segments",
    "tokenize_documents",
]
