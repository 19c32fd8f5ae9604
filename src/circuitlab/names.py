"""Head names, "L{layer}H{head}" as TransformerLens and the papers write them, and the layer a hook name
("blocks.L. ...") is at: one home for writing and reading them."""
from __future__ import annotations

import re

from circuitlab.errors import CircuitlabError

_HEAD = re.compile(r"L(\d+)H(\d+)")


def head_name(layer: int, head: int) -> str:
    """(1, 0) -> "L1H0"."""
    return f"L{layer}H{head}"


def parse_head(name: str) -> tuple[int, int]:
    """"L1H0" -> (1, 0); anything else is a one-line error."""
    match = _HEAD.fullmatch(name.strip())
    if match is None:
        raise CircuitlabError(f"not a head name: {name!r} (write heads as L<layer>H<head>, e.g. L1H0)")
    return int(match.group(1)), int(match.group(2))


def layer_of(hook: str | None) -> int | None:
    """blocks.3.hook_mlp_out -> 3; None for a hook outside the blocks."""
    m = re.match(r"blocks\.(\d+)\.", hook or "")
    return int(m.group(1)) if m else None
