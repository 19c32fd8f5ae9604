"""Every check of a patching request, made before any compute: tokens, the prompt pair, the metric,
layers, direction; and the token checks every analysis shares (as_tokens, one_sequence). Each failure is
one CircuitlabError line."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from circuitlab.analysis.patching.metrics import Metric
from circuitlab.analysis.patching.targets import get_target
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.model import model_device, model_dtype
from circuitlab.model.hooks import act_name
from circuitlab.model.tokens import check_tokens

if TYPE_CHECKING:
    from circuitlab.model import Transformer

DIRECTIONS = ("denoise", "noise")


def as_tokens(model: Transformer, tokens: torch.Tensor | Sequence, what: str = "tokens") -> torch.Tensor:
    """tokens [batch, pos] or [pos] -> LongTensor [batch, pos] on the model's device, checked."""
    return check_tokens(tokens, model.cfg, what).long().to(model_device(model))


def one_sequence(model: Transformer, tokens: torch.Tensor | Sequence, who: str) -> torch.Tensor:
    """tokens [pos] or [1, pos] -> LongTensor [pos] on the model's device, checked as as_tokens does;
    a batch of several is a one-line error naming `who` (the analysis reads one sequence)."""
    t = torch.as_tensor(tokens)
    if t.dim() == 2 and t.shape[0] != 1:
        raise CircuitlabError(f"{who} reads one sequence; got a batch of {t.shape[0]} (pass tokens[i])")
    return as_tokens(model, t, f"{who}'s tokens")[0]


def check_pair(model: Transformer, clean, corrupt) -> tuple[torch.Tensor, torch.Tensor]:
    """Both prompts as token tensors [batch, pos] of the same shape, or a CircuitlabError."""
    clean, corrupt = as_tokens(model, clean, "clean tokens"), as_tokens(model, corrupt, "corrupted tokens")
    if clean.shape != corrupt.shape:
        raise CircuitlabError(
            f"clean and corrupted prompts must have the same shape [batch, pos] so that positions line up; got "
            f"clean {list(clean.shape)} and corrupted {list(corrupt.shape)} tokens (reword one prompt to match)")
    return clean, corrupt


def check_metric(model: Transformer, metric: Metric, shape: tuple[int, ...]) -> None:
    """Call the metric on zero logits [batch, pos, d_vocab]: it must return one number. Costs no forward pass."""
    if not callable(metric):
        raise CircuitlabError(f"the metric must be a function of the logits, got {type(metric).__name__}")
    dummy = torch.zeros(*shape, model.cfg.d_vocab, device=model_device(model), dtype=model_dtype(model))
    try:
        out = metric(dummy)
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here is in the user's metric
        raise CircuitlabError(f"the metric failed on logits of shape {list(dummy.shape)}: "
                              f"{type(e).__name__}: {e}") from None
    numel = out.numel() if isinstance(out, torch.Tensor) else (1 if isinstance(out, (int, float)) else 0)
    if numel != 1:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CircuitlabError(f"the metric must return a scalar (one number) but returned {got} for logits "
                              f"{list(dummy.shape)}; reduce it, e.g. with .mean()")


def check_layers(model: Transformer, layers: Sequence[int] | None) -> list[int]:
    n = model.cfg.n_layers
    if layers is None:
        return list(range(n))
    layers = [int(l) for l in layers]
    bad = [l for l in layers if not 0 <= l < n]
    if bad:
        raise CircuitlabError(f"layer(s) {bad} out of range: the model has {n} layers (0..{n - 1})")
    return layers


def check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise CircuitlabError(f"direction must be 'denoise' (clean into the corrupted run) or 'noise' "
                              f"(corrupted into the clean run), got {direction!r}")


def check_patching_request(model: Transformer, clean, corrupt, metric: Metric, targets: Sequence[str], direction: str,
                           layers: Sequence[int] | None):
    """Every check of a patching request, before any compute. Returns (targets, layers, base tokens,
    source tokens, the hook names to cache): denoising runs the corrupted prompt and takes
    activations from the clean one, noising the other way round."""
    check_direction(direction)
    clean, corrupt = check_pair(model, clean, corrupt)
    check_metric(model, metric, tuple(clean.shape))
    chosen = [get_target(model, t) for t in targets]
    layers = check_layers(model, layers)
    base_tokens, source_tokens = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
    hooks = sorted({act_name(t.hook, l) for t in chosen for l in layers})
    return chosen, layers, base_tokens, source_tokens, hooks


def check_grid(model: Transformer, n_pos: int, layers: Sequence[int] | None, positions: Sequence[int] | None
               ) -> tuple[list[int] | None, list[int] | None]:
    """The layers and positions to trace as sorted non-negative indices (None: all); a position may count from
    the end (-1: the last). Out of range: one line."""
    L = model.cfg.n_layers
    if layers is not None:
        bad = [l for l in layers if not 0 <= l < L]
        if bad:
            raise InputError(f"layer(s) {' '.join(map(str, bad))} out of range: the model has {L} layers "
                             f"(0..{L - 1})")
        layers = sorted(set(int(l) for l in layers))
    if positions is not None:
        bad = [p for p in positions if not -n_pos <= p < n_pos]
        if bad:
            raise InputError(f"position(s) {' '.join(map(str, bad))} out of range: the prompt has {n_pos} tokens "
                             f"(0..{n_pos - 1}, or -{n_pos}..-1 from the end)")
        positions = sorted(set(int(p) % n_pos for p in positions))
    return layers, positions
