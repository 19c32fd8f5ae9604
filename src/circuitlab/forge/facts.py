"""A planted fact: a hand-built model that recalls an attribute of a two-character subject the way Meng et
al. (2022) found GPT does, so that causal tracing has a known answer.

    planted = build_planted_fact_model()          # 5 layers; the fact memory is layer 2's MLP
    planted.tokenizer.encode("we met Al at")      # a CharTokenizer (one token per character)
    planted.facts                                 # {"Al": "1", "Bo": "2", "Cy": "3", "Di": "4"}
    planted.prompts()                             # [("we met Al at", "Al", "1"), ...]

How it recalls (residual subspaces in brackets):
  embedding   tok = one-hot of the character, dense = 32 random numbers that nothing reads (real token
              embeddings are dense; they set the scale of the causal-tracing noise); positions: pos =
              one-hot, one = 1.
  layer 0     a previous-token head copies the previous character's one-hot into [prev].
  layer 2 MLP the key-value memory: for each fact, three ReLU neurons read prev[first char] + tok[second
              char] = s and make a triangle that is 1 at s = 2 (both characters there) and 0 below 1.75
              or above 2.25; it writes 10 x the triangle into [attr] (the attribute's slot) and into [flag].
  layer 3     a mover head at every position attends where [flag] is high (score 2 x flag) and copies
              [attr] into [out]; the unembedding reads [out] (logit of attribute i = out[i]).
So at the subject's last character the MLP of `fact_layer` writes the attribute, and the head of
`mover_layer` moves it to the last position: corrupting the subject and restoring that MLP's output there
restores the answer, and so does restoring any hidden state at the last position from `mover_layer` on.
Layers 1 and 4 are empty (every weight zero), so their restorations change nothing.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.errors import CircuitlabError
from circuitlab.forge.builder import Forge, ResidualLayout
from circuitlab.forge.examples import _previous_token_head
from circuitlab.model.transformer import Transformer

FACTS = {"Al": "1", "Bo": "2", "Cy": "3", "Di": "4"}
TEMPLATES = ("we met {} at", "so {} is", "then {} had", "i saw {} by", "{} was")
ALPHABET = " :.," + string.ascii_lowercase + string.ascii_uppercase + string.digits
DENSE = 32       # dense coordinates of each token embedding that nothing reads
STRENGTH = 10.0  # what the memory writes: the answer's logit in the clean run



@dataclass
class PlantedFacts:
    """A model with facts planted in one MLP, and where everything is.

    facts: subject (two characters, upper then lower case) -> attribute (one digit); fact_layer: the MLP
    holding them; mover_layer: the head moving the attribute to later positions; prev_layer: the
    previous-token head through which the memory reads the subject's first character.
    """

    model: Transformer
    layout: ResidualLayout
    tokenizer: CharTokenizer
    facts: dict[str, str]
    fact_layer: int
    mover_layer: int
    prev_layer: int = 0

    def prompts(self) -> list[tuple[str, str, str]]:
        """(prompt, subject, answer) for every fact in every template."""
        return [(t.format(s), s, a) for s, a in self.facts.items() for t in TEMPLATES]


def build_planted_fact_model(facts: dict[str, str] | None = None, n_layers: int = 5, fact_layer: int = 2,
                             n_ctx: int = 32, seed: int = DEFAULT_SEED) -> PlantedFacts:
    """The planted-fact model (module docstring). facts: subject -> attribute, each subject an upper-case then
    a lower-case letter, each attribute a digit; the head moving it sits at fact_layer + 1 < n_layers."""
    facts = dict(FACTS if facts is None else facts)
    if not 0 < fact_layer < n_layers - 1:
        raise CircuitlabError(f"fact_layer must be in 1..{n_layers - 2} (a previous-token head before it, a mover "
                              f"head after it), got {fact_layer}")
    for s, a in facts.items():
        if len(s) != 2 or not (s[0].isupper() and s[1].islower()) or len(a) != 1 or not a.isdigit():
            raise CircuitlabError(f"a planted fact maps an upper- then lower-case letter to a digit, got {s!r} -> {a!r}")
    tok = CharTokenizer(ALPHABET)
    V, F = tok.vocab_size, len(facts)
    layout = ResidualLayout({"tok": V, "dense": DENSE, "pos": n_ctx, "one": 1, "prev": V, "attr": F, "flag": 1,
                             "out": F})
    f = Forge(layout, n_layers=n_layers, n_heads=1, d_head=max(n_ctx, V), d_mlp=3 * F, d_vocab=V, n_ctx=n_ctx,
              positional="learned")
    gen = torch.Generator().manual_seed(seed)
    eye_v, eye_p, eye_f = torch.eye(V), torch.eye(n_ctx), torch.eye(F)
    for t in range(V):
        f.embed(t, tok=eye_v[t], dense=torch.randn(DENSE, generator=gen))
    for p in range(n_ctx):
        f.pos(p, pos=eye_p[p], one=1.0)
    _previous_token_head(f, 0, 0, n_ctx, V, 20.0, "prev")
    mlp = f.mlp(fact_layer)
    for i, (subject, attribute) in enumerate(facts.items()):
        first, second = tok.stoi[subject[0]], tok.stoi[subject[1]]
        # s = prev[first] + tok[second]; neurons relu(4(s - c)) for c = 1.75, 2, 2.25, summed 1, -2, 1: a
        # triangle of height 1 at s = 2 and width 0.5, so noise of a fraction of a unit switches it off.
        for j, (c, w) in enumerate(((1.75, 1.0), (2.0, -2.0), (2.25, 1.0))):
            mlp.neuron(3 * i + j, read={"prev": 4 * eye_v[first], "tok": 4 * eye_v[second], "one": -4 * c},
                       write={"attr": STRENGTH * w * eye_f[i], "flag": STRENGTH * w})
        f.unembed(tok.stoi[attribute], out=eye_f[i])
    mover = f.head(fact_layer + 1, 0)
    mover.q("one", 2.0, into=0).k("flag", 1.0, into=0)
    mover.v("attr", torch.eye(F), into=0).o("out", torch.eye(F), from_=0)
    return PlantedFacts(f.model, layout, tok, facts, fact_layer, fact_layer + 1)


__all__ = ["FACTS", "PlantedFacts", "TEMPLATES", "build_planted_fact_model"]
