"""A built-in corpus of tiny children's stories from a seeded grammar (no download).

Stories have recurring phrases ("Once upon a time", "From that day on") that a
small model learns quickly, and character names made of random syllables
(tens of thousands possible) that each story repeats several times. A name
cannot be guessed from the vocabulary; it can only be copied from earlier in
the story, which is what induction heads do.
"""

from __future__ import annotations

import random

from circuitlab.checks import DEFAULT_SEED
from circuitlab.errors import ConfigError

# The prompt the ready-made experiments and report.html use when none is given.
DEFAULT_PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                  "One day, Lily saw a big dog in the park.")

SYLLABLES = (
    "ba be bi bo da de di do fa fe fi fo ka ke ki ko la le li lo "
    "lu ma me mi mo na ne ni no pa pe pi po ra re ri ro sa si so"
).split()  # 40 syllables -> 1,600 two-syllable and 64,000 three-syllable names

ANIMALS = ["cat", "dog", "bunny", "bird", "fox", "bear", "frog", "duck", "mouse", "owl"]
KINDS = ["girl", "boy", "princess", "farmer", "dragon", "robot"] + ANIMALS
ADJECTIVES = ["little", "big", "happy", "kind", "brave", "shy", "funny", "sleepy", "clever", "tiny"]
COLORS = ["red", "blue", "green", "yellow", "shiny", "soft", "pink", "old"]
THINGS = ["ball", "kite", "box", "hat", "book", "cake", "flower", "boat", "drum", "apple", "key", "toy"]
PLACES = ["the park", "the forest", "the garden", "the river", "the hill", "the beach", "the town", "the farm", "the castle", "the meadow"]
LIKES = ["play", "sing", "run", "read", "dance", "jump", "paint", "swim", "bake", "climb"]
PAST = {"play": "played", "sing": "sang", "run": "ran", "read": "read", "dance": "danced",
        "jump": "jumped", "paint": "painted", "swim": "swam", "bake": "baked", "climb": "climbed"}
FEELINGS = ["happy", "sad", "excited", "scared", "surprised", "proud", "tired", "curious"]
PRONOUNS = [("she", "her"), ("he", "his")]



def make_name(rng: random.Random) -> str:
    """A capitalised name of 2 or 3 random syllables, e.g. "Mibaro"."""
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _opening(r: random.Random, a: str, pos: str) -> str:
    adj, kind, place = r.choice(ADJECTIVES), r.choice(KINDS), r.choice(PLACES)
    if r.random() < 0.6:
        return r.choice([
            f"Once upon a time, there was {_a(adj)} {kind} named {a}.",
            f"Once upon a time, {a} lived near {place} with {pos} {r.choice(ANIMALS)}.",
            f"Once upon a time, in {place}, there lived {_a(adj)} {kind} called {a}.",
        ])
    return r.choice([
        f"There was once {_a(adj)} {kind} called {a}.",
        f"One day, {a} the {kind} went to {place}.",
        f"Long ago, {a} was {_a(adj)} {kind} who lived in {place}.",
    ])


def _middle(r: random.Random, a: str, b: str, sub: str, pos: str) -> str:
    thing, color, place, like = r.choice(THINGS), r.choice(COLORS), r.choice(PLACES), r.choice(LIKES)
    return r.choice([
        f"{a} liked to {like} every day.",
        f"Every morning, {a} {PAST[like]} at {place}.",
        f"One day, {a} found {_a(color)} {thing} near {place}.",
        f'{a} said, "I want to {like} with {b}!"',
        f"{a} and {b} played with the {color} {thing} at {place}.",
        f'{b} asked {a}, "Can I see your {thing}?"',
        f"{a} was very {r.choice(FEELINGS)} because {sub} lost {pos} {thing}.",
        f"{a} gave the {thing} to {b}, and {b} said thank you.",
        f"Then {a} and {b} went to {place} to {like}.",
        f"{b} smiled at {a} and {a} smiled back.",
        f"The {thing} was {color} and {r.choice(ADJECTIVES)}, and {a} loved it.",
    ])


def _ending(r: random.Random, a: str, b: str) -> str:
    return r.choice([
        f"From that day on, {a} and {b} were best friends.",
        f"{a} was happy, and {b} was happy too.",
        f"At night, {a} went home and dreamed about {b}.",
        f"{a} and {b} learned that it is good to share. The end.",
        f"And {a} never forgot that day with {b}.",
    ])


def _make_story(r: random.Random) -> tuple[str, list[str]]:
    names = [make_name(r)]
    if r.random() < 0.6:
        other = make_name(r)
        while other == names[0]:
            other = make_name(r)
        names.append(other)
        b = other
    else:
        b = f"the {r.choice(ADJECTIVES)} {r.choice(ANIMALS)}"  # a friend without a name
    a = names[0]
    sub, pos = r.choice(PRONOUNS)
    n_sentences = r.randint(3, 8)
    sentences = [_opening(r, a, pos)]
    if len(names) == 2:
        sentences.append(r.choice([f"{a} had a friend named {b}.", f"{a} met {_a(r.choice(KINDS))} called {b}."]))
    sentences += [_middle(r, a, b, sub, pos) for _ in range(n_sentences - len(sentences) - 1)]
    sentences.append(_ending(r, a, b))
    return " ".join(s[0].upper() + s[1:] for s in sentences), names


def generate_stories(n_stories: int, seed: int = DEFAULT_SEED, return_names: bool = False) -> list:
    """`n_stories` short stories, the same for the same seed.

    Story i depends only on (seed, i), so a bigger corpus extends a smaller one.
    With return_names=True each item is (text, [names used in the story]).
    """
    if isinstance(n_stories, bool) or not isinstance(n_stories, int) or n_stories < 0:
        raise ConfigError(f"n_stories must be a non-negative int, got {n_stories!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int, got {seed!r}.")
    out = []
    for i in range(n_stories):
        text, names = _make_story(random.Random(f"circuitlab-stories:{seed}:{i}"))
        out.append((text, names) if return_names else text)
    return out


def stories_text(n_stories: int, seed: int = DEFAULT_SEED, sep: str = "\n\n") -> str:
    """All stories joined into one string with `sep` between them."""
    return sep.join(generate_stories(n_stories, seed))
