"""Next-token sampling: temperature, top-k, top-p (nucleus), the one check of those options that
`Transformer.generate`, `circuitlab generate` and `circuitlab steer` share, and GenerateOptions: what
`circuitlab generate` takes, declared once (circuitlab.spec).

    add_arguments(parser, GenerateOptions); GenerateOptions.from_args(args)     # generate's flags
    GenerateOptions(checkpoint="runs/demo/2l", top_p=0.9).check()             # the same rules from Python
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from circuitlab.checks import COUNT, DEFAULT_SEED, INT, SHARE, Number
from circuitlab.errors import InputError
from circuitlab.spec import Options, option, options_of

if TYPE_CHECKING:
    import argparse

# The temperature's rule (the options classes that take one declare it); check_sampling says it with what 0 means.
TEMPERATURE = Number(float, low=0.0)
TOP_K = COUNT    # check_sampling says these two with "or left out for no limit"
TOP_P = SHARE
# generate's samples are drawn together: one batch of NUM rows, whose KV cache is held at once
NUM = Number(int, low=1, high=1024, why="the samples are generated as one batch, their KV cache held at once")
DEFAULT_TEMPERATURE = 0.8   # generate's own (steer's is SteerOptions.temperature)


def check_sampling(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   cli: bool = False) -> None:
    """An InputError naming the first option out of range. cli: name the options as the command line
    spells them (--top-k instead of top_k)."""
    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if cli else option

    if TEMPERATURE.problem(temperature) is not None:
        raise InputError(f"{name('temperature')} must be a finite number >= 0 (0 = greedy decoding), "
                         f"got {temperature!r}")
    if top_k is not None and TOP_K.problem(top_k) is not None:
        raise InputError(f"{name('top_k')} must be a whole number >= 1 (or left out for no limit), got {top_k!r}")
    if top_p is not None and TOP_P.problem(top_p) is not None:
        raise InputError(f"{name('top_p')} must be in (0, 1] (or left out for no limit), got {top_p!r}")


@dataclass(frozen=True)
class GenerateOptions(Options):
    """What `circuitlab generate` takes, declared once: each flag's default, rule and help. Temperature, top-k
    and top-p are read as plain numbers and refused in check_sampling's words (shared with steer and
    Transformer.generate), naming them as the command line or Python spells them. prompt None: none given (as
    the empty text: a new document)."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    prompt: str | None = option(None, help="text to continue (default: none, a new document from the end-of-text token)")
    max_tokens: int = option(60, COUNT, help="")
    temperature: float = option(DEFAULT_TEMPERATURE, TEMPERATURE, arg=float, help="0 = greedy")
    top_k: int | None = option(None, TOP_K, arg=int, help="")
    top_p: float | None = option(None, TOP_P, arg=float, help="")
    seed: int = option(DEFAULT_SEED, INT, arg=int, help="")
    num: int = option(1, NUM, help=f"number of samples (at most {NUM.high}, drawn as one batch)")

    def check(self, error: type[Exception] = InputError) -> GenerateOptions:
        """The sampling options in check_sampling's words, then every field's rule."""
        self.check_sampling(cli=False, error=error)
        return super().check(error)

    def check_sampling(self, cli: bool, error: type[Exception] = InputError) -> None:
        try:
            check_sampling(self.temperature, self.top_k, self.top_p, cli=cli)
        except InputError as e:   # a config's error class (from_dict) where one is asked for
            raise error(str(e)) from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GenerateOptions:
        """The command's options, the sampling ones refused in its spellings first (--top-k)."""
        cls(**{f.name: getattr(args, f.name) for f, _ in options_of(cls)}).check_sampling(cli=True)
        return super().from_args(args)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [batch, d_vocab] -> token ids [batch]. temperature 0 means greedy (argmax)."""
    check_sampling(temperature, top_k, top_p)
    if not bool(torch.isfinite(logits).all()):
        raise InputError("the model's logits are not finite (NaN or inf): its weights or its inputs (e.g. a "
                         "steering vector) hold NaN or inf values")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (always keep the first)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
