"""argparse value types shared by the commands: a bad value is the parser's one-line error
("argument --num: must be a whole number >= 1, got '0'"). They are the rules of circuitlab.checks, so the
command line, the config files, the Python API and the explorer agree."""
from __future__ import annotations

from circuitlab.checks import COUNT, FINITE

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
