"""argparse value types shared by the commands: a bad value is the parser's one-line error
("argument --num: must be a whole number >= 1, got '0'"). They are the rules of circuitlab.checks, so the
command line, the config files, the Python API and the explorer agree."""
from __future__ import annotations

from circuitlab.checks import COUNT, FINITE

positive_int = COUNT.arg    # a whole number >= 1 (counts: samples, steps, tokens)
finite_float = FINITE.arg   # a number that is not NaN or infinite
