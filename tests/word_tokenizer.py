"""A word-level tokenizer for the studies' fast tests: every word of the IOI prompts and of the facts is one token
(" Mary", " Paris" too)."""
from __future__ import annotations

import re

from circuitlab.studies.facts_data import FACTS
from circuitlab.studies.ioi import NAMES, PLACES, TEMPLATES, THINGS

_WORD = re.compile(r" ?[A-Za-z]+|[^\sA-Za-z]")


class WordTokenizer:
    """encode(text) -> ids of its words (a leading space belongs to the word) and punctuation; eos_id 0."""

    eos_id = 0

    def __init__(self) -> None:
        words = {w for t in TEMPLATES for w in _WORD.findall(t.replace("{", "").replace("}", ""))}
        words |= {" " + w for w in NAMES + PLACES + THINGS} | set(_WORD.findall("Then, the."))
        words |= {w for prompt, _, answer in FACTS for w in _WORD.findall(prompt) + [" " + answer]}
        self.vocab = ["<eos>"] + sorted(words)
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        self.vocab_size = len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self.ids[w] for w in _WORD.findall(text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)
