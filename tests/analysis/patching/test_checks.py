"""The checks of a patching or tracing request, made before any compute: here the grid a causal trace is narrowed
to (check_grid): sorted non-negative layers and positions, positions counted from the end, out of range one line."""
import pytest

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.patching.checks import check_grid
from circuitlab.errors import InputError


def test_check_grid_normalises_and_refuses_in_one_line():
    model = Transformer(ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=16, n_heads=2, d_vocab=20,
                                                n_ctx=8))
    assert check_grid(model, 5, None, None) == (None, None)
    assert check_grid(model, 5, [2, 0, 2], [-1, 0, 4, -5]) == ([0, 2], [0, 4])
    with pytest.raises(InputError, match=r"^layer\(s\) 3 out of range: the model has 3 layers \(0..2\)$"):
        check_grid(model, 5, [3], None)
    with pytest.raises(InputError, match=r"^position\(s\) 5 -6 out of range: the prompt has 5 tokens"):
        check_grid(model, 5, None, [5, -6, 1])
