"""The old import paths of the family classes (pretrained/families.py, llama_like.py, family_base.py before the
one-module-per-family package) still work for one release, each with a DeprecationWarning naming the new one."""
import importlib
import sys

import pytest

from circuitlab.pretrained.families.gemma2 import Gemma2
from circuitlab.pretrained.families.gpt2 import GPT2
from circuitlab.pretrained.families.base import Family


def test_the_old_class_paths_warn_and_give_the_same_classes():
    from circuitlab.pretrained import families

    with pytest.warns(DeprecationWarning, match="families.GPT2 moved to circuitlab.pretrained.families.gpt2.GPT2"):
        assert families.GPT2 is GPT2
    with pytest.raises(AttributeError):
        families.NoSuchFamily  # noqa: B018


@pytest.mark.parametrize("old, name, new", [("circuitlab.pretrained.llama_like", "Gemma2", Gemma2),
                                            ("circuitlab.pretrained.family_base", "Family", Family)])
def test_the_old_modules_warn_and_give_the_same_objects(old, name, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to circuitlab.pretrained.families"):
        module = importlib.import_module(old)
    assert getattr(module, name) is new
