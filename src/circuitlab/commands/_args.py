"""argparse value types shared by the commands: a bad value is the parser's one-line error
("argument --num: must be a whole number >= 1, got '0'"). They are the rules of circuitlab.checks, so the
command line, the config files, the Python API and the explorer agree."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from circuitlab.checks import COUNT, FINITE

if TYPE_CHECKING:
    from circuitlab.spec import Options

positive_int = COUNT.arg    # a whole number >= 1 (counts: samples, steps, tokens)
finite_float = FINITE.arg   # a number that is not NaN or infinite


def add_dtype_arguments(p, what: str = "the model and its dictionaries") -> None:
    """--dtype (storage) and --compute-dtype, the one setting pair of model/storage.py: weights held in half
    precision while the arithmetic runs in float32 on a CPU."""
    from circuitlab.model.storage import DTYPES

    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help=f"hold {what} in this dtype (default: as stored; bfloat16 halves the memory of "
                        "float32 files)")
    p.add_argument("--compute-dtype", choices=list(DTYPES), default=None,
                   help="compute in this dtype (default: float32 on a CPU, each half-precision weight upcast as a "
                        "layer uses it; the storage dtype on a GPU)")


def memory_size(text: str) -> int:
    """--memory: a size such as 8G (circuitlab.memory.parse_size); one line when bad or more than the machine."""
    import argparse

    from circuitlab.errors import ConfigError
    from circuitlab.memory import parse_size

    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--memory ")) from None


def add_memory_arguments(p, estimate: bool = True) -> None:
    """--memory SIZE (the budget every size limit of the command is a share of) and --estimate (say what the
    work will hold and take, then stop)."""
    p.add_argument("--memory", type=memory_size, default=None, metavar="SIZE",
                   help="the memory budget, e.g. 8G (default: 70%% of the memory available now); every size limit is "
                        "a share of it; more than the machine has is refused")
    if estimate:
        p.add_argument("--estimate", action="store_true",
                       help="print what the work will hold at its peak and roughly how long it will take, then stop")


def add_option_parts(p: Any, cls: type[Options], *parts: tuple[str, ...] | Callable[[Any], None]) -> None:
    """cls's flags (declared once, beside its pipeline) in --help's order, with the flags the spec does not declare
    written between them: each part a tuple of cls's field names, or a function adding hand-written flags."""
    from circuitlab.spec import add_arguments as add_options, only

    for part in parts:
        if callable(part):
            part(p)
        else:
            add_options(p, only(cls, part, cls.__name__))
