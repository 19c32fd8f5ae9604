"""Noise corruption: the corrupted runs are the clean prompt with some positions' token embeddings
disturbed, instead of a second prompt (causal tracing, Meng et al. 2022).

    noise = Noise()                                         # Gaussian, nu = 3 x the embeddings' std, 10 samples
    run = corrupt_positions(model, tokens, [3, 4], noise)   # tokens [pos] -> Corrupted: [samples, pos] rows
    with model.hooks(run.hooks()):                          # the noise is added at hook_embed
        logits = model(run.tokens)                          # [samples, pos, d_vocab]

Kinds:
  gaussian  N(0, nu^2) added to every coordinate of the chosen positions' token embeddings (the paper's);
  uniform   U(-a, a) with a = nu * sqrt(3): the same standard deviation, bounded;
  replace   symmetric token replacement (Zhang & Nanda 2023): the chosen tokens are replaced by other
            tokens of the same length (`replacements`, one sequence per sample), so the corrupted inputs
            stay on the model's input distribution; no noise is added.
nu = scale (k, default 3) x std, where std is the standard deviation of the token embeddings' coordinates
of the corrupted tokens (the paper measures it over the subjects of its data set; embedding_std), unless
given. Gaussian and uniform noise can push activations off the distribution the model was trained on
(a 3-sigma vector is far from any token's embedding): a restored state then competes with states no real
input produces. Replacement avoids that, at the price of choosing the replacements.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import circuitlab.memory as memory
from circuitlab.checks import COUNT, POSITIVE, Number, DEFAULT_SEED
from circuitlab.errors import InputError
from circuitlab.model import model_device, model_dtype

if TYPE_CHECKING:
    from circuitlab.model import Transformer

NOISE_KINDS = ("gaussian", "uniform", "replace")
# k in nu = k x std: past a few the noise already swamps the embeddings (the paper's is 3); far past, the
# corrupted activations overflow float32 and every value is NaN.
SCALE = Number(float, low=0.0, low_open=True, high=1000.0, why="the noise already swamps the embeddings; "
                                                               "more only overflows")


# Floats the corrupted runs may hold at once: every run is in the batch of one forward pass, whose cache the
# restorations read (causal tracing, noised patching). Bounds the noise samples (or replacements) x prompts.
# A share of the memory budget (circuitlab.memory: the memory available now, or --memory).


def runs_budget() -> int:
    return memory.floats(memory.RUNS_SHARE)


def run_floats(cfg, n_pos: int) -> int:
    """Floats one corrupted run of n_pos positions holds: its cached activations at every layer (residual
    stream, keys and values, attention and MLP outputs), its logits and the noise added to it."""
    per_layer = 6 * cfg.d_model + (2 * cfg.mlp_dim if cfg.has_mlp else 0) + cfg.n_heads * n_pos
    return n_pos * (cfg.n_layers * per_layer + 2 * cfg.d_vocab + 4 * cfg.d_model)


def check_runs(cfg, runs: int, prompts: int, n_pos: int) -> None:
    """A one-line InputError, before anything is drawn, when runs x prompts corrupted runs of n_pos positions
    would pass runs_budget(), saying how many runs fit."""
    need = runs * prompts * run_floats(cfg, n_pos)
    budget = runs_budget()
    if need > budget:
        fit = max(0, budget // (prompts * run_floats(cfg, n_pos)))
        per = f" x {prompts} prompts" if prompts > 1 else ""
        raise InputError(f"{runs:,} noise runs{per} of {n_pos} tokens hold {need * 4 / 2**30:,.1f} GiB of "
                         f"activations at once (limit {memory.describe(memory.RUNS_SHARE)}: every run is in one "
                         "batch); "
                         f"give at most {fit} noise samples (or replacements)")


@dataclass(frozen=True)
class Noise:
    """How the corrupted runs are made.

    kind: "gaussian", "uniform" or "replace" (see the module docstring). scale: k in nu = k x std.
    samples: corrupted runs averaged (gaussian and uniform; replace has one run per replacement).
    seed: the noise's random seed (the same seed gives the same noise). std: the embeddings' standard
    deviation (default: measured, embedding_std). replacements: for "replace", token id sequences, each
    as long as the corrupted span.
    """

    kind: str = "gaussian"
    scale: float = 3.0
    samples: int = 10
    seed: int = DEFAULT_SEED
    std: float | None = None
    replacements: tuple[tuple[int, ...], ...] = field(default_factory=tuple)

    def check(self, n_positions: int | None = None, d_vocab: int | None = None) -> "Noise":
        """This noise, or a one-line InputError for a kind, scale, sample count, std or replacement that
        cannot be used (n_positions: the corrupted span's length, for the replacements)."""
        if self.kind not in NOISE_KINDS:
            raise InputError(f"noise kind must be one of {', '.join(NOISE_KINDS)}, got {self.kind!r}")
        SCALE.check(self.scale, "the noise scale")
        if self.std is not None:
            POSITIVE.check(self.std, "the embeddings' std")
        COUNT.check(self.samples, "noise samples")
        if self.kind == "replace":
            if not self.replacements:
                raise InputError("symmetric token replacement needs replacements: other subjects as long as "
                                 "this one (e.g. --replace-with NAME ...)")
            for r in self.replacements:
                if n_positions is not None and len(r) != n_positions:
                    raise InputError(f"a replacement must be as many tokens as the corrupted span ({n_positions}); "
                                     f"got {len(r)} tokens {list(r)}")
                if d_vocab is not None and any(not 0 <= int(t) < d_vocab for t in r):
                    raise InputError(f"replacement tokens {list(r)} are outside the vocabulary [0, {d_vocab})")
        return self

    @property
    def n_runs(self) -> int:
        return len(self.replacements) if self.kind == "replace" else self.samples

    def describe(self, nu: float) -> dict:
        if self.kind == "replace":
            return {"kind": "replace", "replacements": [list(r) for r in self.replacements]}
        return {"kind": self.kind, "scale": self.scale, "nu": round(nu, 6), "samples": self.samples,
                "seed": self.seed}


@dataclass
class Corrupted:
    """The corrupted runs of one prompt: tokens [samples, pos] (the prompt, or with replacements) and
    offsets [samples, pos, d_model] added to hook_embed (None when nothing is added); nu: the noise's
    standard deviation (0.0 for replacement); first: the first corrupted position (attention is causal, so
    every state before it is the clean run's)."""

    tokens: torch.Tensor
    offsets: torch.Tensor | None
    nu: float
    first: int = 0

    def hooks(self) -> list:
        """Forward hooks that add the noise (empty for replacement)."""
        if self.offsets is None:
            return []
        offsets = self.offsets

        def add(x: torch.Tensor, hook) -> torch.Tensor:
            return x + offsets.to(x.dtype)
        return [("hook_embed", add)]


@torch.no_grad()
def embedding_std(model: Transformer, tokens: torch.Tensor | Sequence) -> float:
    """The standard deviation of the token embeddings' coordinates (what hook_embed carries) of `tokens`
    (any shape): the paper takes it over the subjects of its prompts."""
    flat = torch.as_tensor(tokens).long().flatten().to(model_device(model))
    return float(model.token_embeddings(flat).double().std())


def corrupt_positions(model: Transformer, tokens: torch.Tensor, positions: Sequence[int], noise: Noise,
                      nu: float | None = None) -> Corrupted:
    """The corrupted runs of tokens [pos] or [batch, pos] with `positions` disturbed by `noise`: rows
    [runs * batch, pos], run-major (row r * batch + b is prompt b in run r), each with its own noise draw.

    nu: the noise's standard deviation (default noise.scale x (noise.std or the std measured on the
    tokens at `positions`)); passing 0.0 gives uncorrupted runs (a check that restoring changes nothing).
    More runs x prompts than runs_budget() holds are refused in one line (check_runs) before anything is drawn.
    """
    tokens = torch.as_tensor(tokens).long()
    rows = tokens if tokens.dim() == 2 else tokens[None]  # [batch, pos]
    B, T = rows.shape
    check_runs(model.cfg, noise.n_runs, B, T)
    positions = list(positions)
    device = model_device(model)
    if noise.kind == "replace":
        out = rows.repeat(noise.n_runs, 1)
        out[:, positions] = torch.tensor(noise.replacements, dtype=torch.long).repeat_interleave(B, dim=0)
        return Corrupted(out.to(device), None, 0.0, min(positions))
    if nu is None:
        std = noise.std if noise.std is not None else embedding_std(model, rows[:, positions])
        nu = noise.scale * std
    S, D = noise.samples, model.cfg.d_model
    gen = torch.Generator().manual_seed(noise.seed)
    if noise.kind == "gaussian":
        draw = torch.randn(S, B, len(positions), D, generator=gen)
    else:  # uniform on [-a, a] has std a / sqrt(3)
        draw = (torch.rand(S, B, len(positions), D, generator=gen) * 2 - 1) * math.sqrt(3)
    offsets = torch.zeros(S, B, T, D, dtype=torch.float64)
    offsets[:, :, positions] = draw.double() * nu
    dtype = model_dtype(model)
    return Corrupted(rows.repeat(S, 1).to(device), offsets.view(S * B, T, D).to(device, dtype), float(nu),
                     min(positions))


@dataclass(frozen=True)
class Noised:
    """A corruption for activation patching in place of a corrupted prompt: the clean prompts with the token
    embeddings at `positions` disturbed by `noise` (activation_patching(model, clean, Noised([3, 4]), ...)).
    Every patch is then applied in each of the noise's runs, and the metric averaged over them."""

    positions: tuple[int, ...]
    noise: Noise = field(default_factory=Noise)

    def check(self, n_pos: int, d_vocab: int) -> list[int]:
        """The positions as a sorted list within [0, n_pos), with the noise checked; else a one-line InputError."""
        pos = sorted({int(p) for p in ([self.positions] if isinstance(self.positions, int) else self.positions)})
        if not pos or any(not 0 <= p < n_pos for p in pos):
            raise InputError(f"noised positions {list(self.positions)} must be some of the prompt's positions "
                             f"0..{n_pos - 1}")
        self.noise.check(len(pos), d_vocab)
        return pos


def averaged_over_runs(metric, runs: int):
    """metric over logits [runs * batch, pos, d_vocab] (run-major): the mean of metric over each run's batch,
    so a metric written for [batch, ...] (answers per prompt) reads every run alike. Keeps its name and
    declared positions."""
    def averaged(logits: torch.Tensor):
        return sum(metric(chunk) for chunk in logits.chunk(runs)) / runs
    averaged.__name__ = getattr(metric, "__name__", "metric")
    if getattr(metric, "positions", None) is not None:
        setattr(averaged, "positions", getattr(metric, "positions"))
    return averaged
