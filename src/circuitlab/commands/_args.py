"""argparse value types shared by the commands: a bad value is the parser's one-line error
("argument --num: must be a whole number >= 1, got 0")."""
from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts: samples, steps, tokens)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


def finite_float(text: str) -> float:
    """A number that is not NaN or infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
