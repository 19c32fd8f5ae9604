"""Tests for circuitlab.data: tokenizers, stories, synthetic tasks, sources, packing, batches.

(Split out of the flat test_data module, issue 38.)"""
import pytest

from circuitlab.data import generate_stories, stories_text
from circuitlab.errors import ConfigError


def test_stories_deterministic_and_seeded():
    a, b, c = generate_stories(50, seed=1), generate_stories(50, seed=1), generate_stories(50, seed=2)
    assert a == b
    assert a != c
    assert generate_stories(80, seed=1)[:50] == a  # a bigger corpus extends a smaller one
    assert stories_text(3, seed=1) == "\n\n".join(a[:3])


def test_stories_shape_names_repeat_and_pool_is_large():
    items = generate_stories(2000, seed=0, return_names=True)
    names = set()
    for text, story_names in items:
        assert 1 <= len(story_names) <= 2
        for name in story_names:
            assert text.count(name) >= 2, (name, text)
        names.update(story_names)
    assert len(names) > 1000
    texts = [t for t, _ in items]
    assert sum(t.startswith("Once upon a time") for t in texts) > len(texts) / 3
    assert len({t.split(",")[0].split(" ")[0] for t in texts}) >= 3  # several openings
    n_sentences = [t.count(".") + t.count("?") + t.count("!") for t in texts]
    assert min(n_sentences) >= 3 and max(n_sentences) <= 10


def test_stories_bad_size():
    with pytest.raises(ConfigError):
        generate_stories(-1)
