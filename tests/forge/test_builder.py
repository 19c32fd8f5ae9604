"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI.

(Its tests of other modules moved with issue 38: tests/commands/test_forge.py, tests/forge/test_adder.py,
tests/forge/test_compare.py, tests/forge/test_examples.py.)"""
import copy
import math

import pytest
import torch

from circuitlab import CircuitlabError, Transformer
from circuitlab.cli import main
from circuitlab.forge import (EOS, Forge, ResidualLayout, attention_agreement, build_adder, build_carry_adder,
                              build_induction_model, build_post_adder, build_previous_token_model, compare_adders,
                              ov_alignment, principal_angles)
from circuitlab.forge.adder import parse_operand
from circuitlab.forge.compare import ov_subspace, used_heads


# ---------------------------------------------------------------- builder
def test_layout_names_coordinates_and_errors():
    layout = ResidualLayout({"one": 1, "tok": 3, "out": 2})
    assert layout.d_model == 6 and layout.names == ["one", "tok", "out"]
    assert layout.coords("tok") == [1, 2, 3] and layout["out"] == slice(4, 6)
    v = layout.vector(one=1, out=[2, 3])
    assert v.tolist() == [1, 0, 0, 0, 2, 3]
    assert layout.describe(v) == {"one": 1.0, "tok": [0.0, 0.0, 0.0], "out": [2.0, 3.0]}
    with pytest.raises(CircuitlabError, match="did you mean 'tok'"):
        layout["toks"]
    with pytest.raises(CircuitlabError, match="size 3"):
        layout.vector(tok=1.0)
    with pytest.raises(CircuitlabError, match="positive integer size"):
        ResidualLayout({"x": 0})


def test_forge_writes_each_block_into_the_fused_weights():
    layout = ResidualLayout({"x": 2, "y": 1, "z": 3})
    f = Forge(layout, n_layers=1, n_heads=2, d_head=4, d_vocab=5, n_ctx=4)
    M = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    h = f.head(0, 1)
    h.q("x", M, into=[1, 3]).k("y", [5.0, 6.0], into=0).v("z", 7.0, into=1).o("z", torch.ones(2, 3), from_=[0, 2])
    model = f.model
    W_Q, W_K, W_V, W_O = model.W_Q[0, 1], model.W_K[0, 1], model.W_V[0, 1], model.W_O[0, 1]  # [d_model, d_head]...
    assert torch.equal(W_Q[0:2][:, [1, 3]], M) and W_Q.abs().sum() == M.sum()
    assert W_K[2].tolist() == [5.0, 6.0, 0.0, 0.0] and W_K.abs().sum() == 11
    assert torch.equal(W_V[3:6, 1:4], 7.0 * torch.eye(3)) and W_V.abs().sum() == 21
    assert torch.equal(W_O[[0, 2]][:, 3:6], torch.ones(2, 3)) and W_O.abs().sum() == 6
    # head 0 untouched; embeddings and unembedding set on their subspaces only
    assert model.W_Q[0, 0].abs().sum() == 0 and model.W_O[0, 0].abs().sum() == 0
    f.embed(3, x=[1, -1], y=2)
    f.unembed(4, z=[1, 2, 3])
    assert model.W_E[3].tolist() == [1, -1, 2, 0, 0, 0]
    assert model.W_U[:, 4].tolist() == [0, 0, 0, 1, 2, 3]


def test_forge_v_only_heads_and_mlp_neurons():
    layout = ResidualLayout({"one": 1, "a": 1, "b": 1})
    f = Forge(layout, n_layers=1, n_heads=1, d_head=3, use_attn_out=False, d_mlp=2, d_vocab=4, n_ctx=3)
    f.head(0).v("a", 2.0, into="b")                 # V-only: z = 2·a lands in "b"
    with pytest.raises(CircuitlabError, match="no W_O"):
        f.head(0).o("a", 1.0)
    f.mlp(0).neuron(1, read={"a": 1.0, "one": -1.0}, write={"one": 5.0})
    model = f.model
    assert model.W_OV[0, 0][1, 2] == 2.0 and model.W_OV[0, 0].abs().sum() == 2.0
    x = layout.vector(one=1, a=3)[None, None]
    torch.testing.assert_close(model.blocks[0].mlp(x), layout.vector(one=5 * (3 - 1))[None, None])
    with pytest.raises(CircuitlabError, match="d_head is 3"):
        f.head(0).q("a", [1.0, 1.0], into=2)
    with pytest.raises(CircuitlabError, match="positional='learned'"):
        f.pos(0, a=1)
    with pytest.raises(CircuitlabError, match="head must be"):
        f.head(0, 1)
