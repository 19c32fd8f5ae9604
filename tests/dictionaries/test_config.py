"""SparseDictionary: architectures, save/load, folding, bad input, SAELens parity.

(Split out of the flat test_dictionaries module, issue 38.)"""
import pytest
import torch

from circuitlab.dictionaries import DictionaryConfig
from circuitlab.errors import CircuitlabError, ConfigError

from dictionaries.test_sae import random_dictionary  # noqa: F401 (shared with it)


def test_bad_configs_say_what_is_wrong():
    with pytest.raises(ConfigError, match="k=40 is larger than d_sae=32"):
        DictionaryConfig("topk", d_in=8, d_sae=32, k=40)
    with pytest.raises(ConfigError, match="did you mean 'topk'"):
        DictionaryConfig("topkk", d_in=8, d_sae=32)
    with pytest.raises(ConfigError, match="skip=True needs a transcoder"):
        DictionaryConfig("relu", d_in=8, d_sae=32, skip=True)
    with pytest.raises(CircuitlabError, match="width 7 .* expects d_in=8"):
        random_dictionary().encode(torch.randn(2, 7))
