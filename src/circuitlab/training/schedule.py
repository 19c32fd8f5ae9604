"""Learning-rate schedule: linear warmup, then cosine decay to min_lr_frac * lr."""
from __future__ import annotations

import math


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int, min_lr_frac: float = 0.1) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return lr * (min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
