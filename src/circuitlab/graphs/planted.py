"""A forged model whose MLPs are sparse dictionaries of planted features: attribution graphs' ground truth.

    p = planted_path_model()
    graph = attribute(p.model, p.transcoders, p.tokens)     # errors are zero: the transcoders ARE the MLPs
    p.path                                                  # the planted path, as node specs

The residual stream has named coordinates. Token "A" (at position 1 of the prompt) turns on the early
feature (layer 0, neuron 0), which writes "mid"; a head of layer 1 attending uniformly carries "mid" to
the last position as "mid2"; the late feature (layer 1, neuron 0) reads "mid2" and writes "out"; the
unembedding reads "out" into token "Z". Decoys fire but reach no logit: layer 0 neuron 1 (on token "B")
and neuron 2 (everywhere) write "junk", read only by the layer-1 decoys, which write "junk2", which
nothing reads. Each layer's transcoder is its MLP exactly (W_enc = W_in, W_dec = W_out, ReLU).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.forge.builder import Forge, ResidualLayout
from circuitlab.graphs.transcoders import Transcoders

if TYPE_CHECKING:
    from circuitlab.model import Transformer

VOCAB = ["x", "A", "B", "Z", "y"]



@dataclass
class PlantedPath:
    model: Transformer
    transcoders: Transcoders
    tokens: torch.Tensor                 # [pos]
    path: list[tuple]                    # ("token", pos), ("feature", layer, pos, feature), ("logit", token)
    decoys: list[tuple[int, int]]        # (layer, feature) of the decoy features

    def token_strs(self) -> list[str]:
        return [VOCAB[int(t)] for t in self.tokens]


def exact_transcoders(model: Transformer) -> Transcoders:
    """ReLU transcoders equal to each layer's (ReLU, bias-free, norm-free) MLP: MLP input -> MLP output."""
    dicts = []
    for layer, block in enumerate(model.blocks):
        mlp = block.mlp
        cfg = DictionaryConfig("relu", d_in=model.cfg.d_model, d_sae=mlp.d_mlp, hook_name=f"blocks.{layer}.hook_resid_mid",
                               out_hook_name=f"blocks.{layer}.hook_mlp_out", dtype="float64")
        d = SparseDictionary(cfg)
        with torch.no_grad():
            d.W_enc.copy_(mlp.fc_in.weight.T.double())
            d.W_dec.copy_(mlp.fc_out.weight.T.double())
            d.b_enc.zero_()
            d.b_dec.zero_()
        dicts.append(d)
    return Transcoders.per_layer(model, dicts)


def planted_path_model(prompt: str = "xAxBxyx") -> PlantedPath:
    """The planted model in float64 and the prompt (letters of VOCAB; "A" must be at position 1)."""
    layout = ResidualLayout({"one": 1, "a": 1, "b": 1, "mid": 1, "mid2": 1, "out": 1, "junk": 1, "junk2": 1})
    f = Forge(layout, n_layers=2, n_heads=1, d_head=1, d_mlp=4, d_vocab=len(VOCAB), n_ctx=16)
    for i in range(len(VOCAB)):
        f.embed(i, one=1.0)
    f.embed(VOCAB.index("A"), one=1.0, a=1.0)
    f.embed(VOCAB.index("B"), one=1.0, b=1.0)
    f.mlp(0).neuron(0, read={"a": 1.0}, write={"mid": 2.0})            # planted early feature
    f.mlp(0).neuron(1, read={"b": 1.0}, write={"junk": 1.0})           # decoy on "B"
    f.mlp(0).neuron(2, read={"one": 1.0}, write={"junk": 0.5})         # decoy everywhere
    f.head(1, 0).v("mid", 1.0).o("mid2", 1.0)                          # zero scores: uniform attention
    f.mlp(1).neuron(0, read={"mid2": 4.0}, write={"out": 1.0})         # planted late feature
    f.mlp(1).neuron(1, read={"junk": 1.0}, write={"junk2": 1.0})       # decoys reaching nothing
    f.mlp(1).neuron(2, read={"one": 1.0}, write={"junk2": 1.0})
    f.unembed(VOCAB.index("Z"), out=5.0)
    f.unembed(VOCAB.index("y"), one=1.0)
    model = f.model.double()
    tokens = torch.tensor([VOCAB.index(c) for c in prompt])
    if prompt[1] != "A" or "A" in prompt[2:]:
        raise ValueError("the planted prompt has its one 'A' at position 1")
    last = len(prompt) - 1
    path = [("token", 1), ("feature", 0, 1, 0), ("feature", 1, last, 0), ("logit", VOCAB.index("Z"))]
    return PlantedPath(model, exact_transcoders(model), tokens, path, decoys=[(0, 1), (0, 2), (1, 1), (1, 2)])


class PlantedTokenizer:
    """One character per token over VOCAB (what `circuitlab graph --planted` reads its prompt with)."""

    name = "planted"

    def encode(self, text: str) -> list[int]:
        from circuitlab.errors import InputError

        bad = sorted(set(text) - set(VOCAB))
        if bad:
            raise InputError(f"the planted model's tokens are {', '.join(VOCAB)}; the prompt has {bad}")
        return [VOCAB.index(c) for c in text]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        return "".join(VOCAB[int(i)] for i in ids)

    def token_id(self, text: str, what: str = "token") -> int:
        from circuitlab.errors import InputError

        if text not in VOCAB:
            raise InputError(f"{what} {text!r} is not one token of the planted model ({', '.join(VOCAB)})")
        return VOCAB.index(text)


@dataclass
class PlantedInduction:
    """The forge's induction circuit (graphs' version: zero MLPs, exact transcoders) on a repeated sequence.

    At query_pos (the second occurrence of a token) the induction head (1, 0) attends key_pos (the token after
    its first occurrence) because the previous-token head (0, 0) wrote that token's predecessor there; it
    copies the token at key_pos, the prediction. decoys: heads that attend but write nothing."""

    model: Transformer
    transcoders: Transcoders
    tokens: torch.Tensor                 # [pos]
    query_pos: int
    key_pos: int
    induction: tuple[int, int] = (1, 0)
    previous_token: tuple[int, int] = (0, 0)
    decoys: tuple[tuple[int, int], ...] = ((0, 1), (1, 1))


def planted_induction_model(d_vocab: int = 12, n_ctx: int = 16, length: int = 6, seed: int = DEFAULT_SEED
                            ) -> PlantedInduction:
    """A random sequence of `length` distinct tokens followed by its first token again (a float64 model): at
    the last position (query_pos, that token's second occurrence) the induction head attends position 1
    (key_pos, whose previous token matches) and predicts the token there."""
    from circuitlab.forge.examples import build_induction_model

    model = build_induction_model(d_vocab=d_vocab, n_ctx=n_ctx, d_mlp=1).model.double()
    seq = torch.randperm(d_vocab, generator=torch.Generator().manual_seed(seed))[:length]
    tokens = torch.cat([seq, seq[:1]])
    return PlantedInduction(model, exact_transcoders(model), tokens, query_pos=length, key_pos=1)
