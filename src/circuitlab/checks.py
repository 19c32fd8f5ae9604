"""One rule per number, shared by the command line, the config loaders, the Python API and the explorer,
so that all four accept and refuse the same values with the same one-line message.

    from circuitlab.checks import Number, COUNT, POSITIVE
    STEPS = Number(int, low=1, high=100_000, why="IG holds one gradient per step")
    steps = STEPS.check(steps, "steps")            # Python API / explorer: InputError on a bad value
    p.add_argument("--steps", type=STEPS.arg)      # CLI: argparse's one-line error, same rule
    check_fields(cfg, {"lr": POSITIVE}, "train")   # config dataclass: ConfigError naming train.lr
    PerItem(NONNEG, POSITIVE).check([2, 2, 1.5], "train.target_l0")   # one number, or one per layer

A rule refuses booleans (True is not 1 here), NaN and infinities, non-integers where a whole number is
wanted, and anything outside [low, high]. Strings are refused by check() (the explorer's JSON, Python
callers); the CLI's text and YAML's "3e-4" (read as a string by YAML 1.1) go through parse() first.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar, cast

from circuitlab.errors import ConfigError, InputError


N = TypeVar("N", int, float)  # a rule's kind: what check() returns


@dataclass(frozen=True)
class Number(Generic[N]):
    """A number rule: kind int (whole numbers) or float (any finite number), within [low, high]
    (low_open / high_open exclude the bound itself). why: said when a value passes `high` (the limit's
    reason, e.g. what would run out)."""

    kind: type[N]
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    # ------------------------------------------------------------------ the rule in words
    def rule(self) -> str:
        """"a whole number >= 1", "a finite number > 0", "a number from 0 to below 1", ..."""
        noun = "a whole number" if self.kind is int else ("a finite number" if self.low is None or self.high is None
                                                           else "a number")
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            lo_s = f"above {_fmt(lo)}" if self.low_open else _fmt(lo)
            hi_s = f"below {_fmt(hi)}" if self.high_open else _fmt(hi)
            return f"{noun} from {lo_s} to {hi_s}"
        if lo is not None:
            return f"{noun} {'>' if self.low_open else '>='} {_fmt(lo)}"
        if hi is not None:
            return f"{noun} {'<' if self.high_open else '<='} {_fmt(hi)}"
        return noun

    def problem(self, value: Any) -> str | None:
        """Why `value` breaks the rule (the text after "must be"), or None when it keeps it."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.rule()
        if self.kind is int and not isinstance(value, int):
            return self.rule()
        if isinstance(value, float) and not math.isfinite(value):
            return self.rule()
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return self.rule()
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return self.rule() + (f" ({self.why})" if self.why else "")
        return None

    # ------------------------------------------------------------------ the four entry points
    def check(self, value: Any, name: str, error: type[Exception] = InputError) -> N:
        """value if it keeps the rule (an int given for a float rule comes back as a float), else
        error(f"{name} must be <rule>, got <value>")."""
        why = self.problem(value)
        if why is not None:
            raise error(f"{name} must be {why}, got {value!r}")
        return cast(N, float(value) if self.kind is float else value)

    def read(self, text: str) -> Any:
        """The number a text means (the command line; YAML 1.1's "3e-4"), or the text itself (then refused)."""
        return _from_text(text, self.kind)

    def parse(self, text: str, name: str, error: type[Exception] = InputError) -> N:
        """A number written as text, then check()."""
        return self.check(self.read(text), name, error)

    def arg(self, text: str) -> N:
        """argparse type=: the same rule, as argparse's one-line "argument --x: must be ..." error."""
        value = _from_text(text, self.kind)
        why = self.problem(value)
        if why is not None:
            raise argparse.ArgumentTypeError(f"must be {why}, got {text!r}")
        return cast(N, float(value) if self.kind is float else value)

    def schema(self) -> dict[str, Any]:
        """The rule as a JSON-schema fragment (the explorer's OpenAPI document)."""
        out: dict[str, Any] = {"type": "integer" if self.kind is int else "number"}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return out


@dataclass(frozen=True)
class PerItem:
    """One number kept by `one`, or a non-empty list of numbers each kept by `each` (a value per layer:
    a CLT's target L0). A list comes back as a list of floats (ints) whatever sequence it came as; text
    (the command line, --set) may write the list with commas: "2,2,1.5"."""

    one: Number
    each: Number

    @property
    def kind(self) -> type:
        return self.one.kind

    def rule(self) -> str:
        each = self.each.rule()
        for one, many in (("a finite number", "finite numbers"), ("a whole number", "whole numbers"), ("a number", "numbers")):
            if each.startswith(one):
                each = many + each[len(one):]
                break
        return f"{self.one.rule()}, or a non-empty list of {each}"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return None if self.one.problem(value) is None else self.rule()
        if not value:
            return self.rule()
        for i, item in enumerate(value):
            if self.each.problem(_from_text(item, self.each.kind)) is not None:
                return f"{self.rule()} (item {i} is {item!r})"
        return None

    def check(self, value: Any, name: str, error: type[Exception] = InputError) -> Any:
        why = self.problem(value)
        if why is not None:
            raise error(f"{name} must be {why}, got {value!r}")
        if isinstance(value, (list, tuple)):
            return [self.each.check(_from_text(v, self.each.kind), name, error) for v in value]
        return self.one.check(value, name, error)

    def read(self, text: str) -> Any:
        """What a text means: a number, a comma-separated list of them, or the text itself (then refused)."""
        return [_from_text(t, self.each.kind) for t in text.split(",")] if "," in text else _from_text(text, self.kind)

    def parse(self, text: str, name: str, error: type[Exception] = InputError) -> Any:
        return self.check(self.read(text), name, error)

    def arg(self, text: str) -> Any:
        """argparse type=: the same rule, as argparse's one-line error."""
        value = self.read(text)
        why = self.problem(value)
        if why is not None:
            raise argparse.ArgumentTypeError(f"must be {why}, got {text!r}")
        return self.check(value, "value")


def _from_text(text: Any, kind: type) -> Any:
    """The number a text means, or the text itself when it means none (then refused by the rule)."""
    if not isinstance(text, str):
        return text
    s = text.strip()
    try:
        return int(s) if kind is int else float(s)
    except ValueError:
        return text


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


# The rules most options use.
COUNT = Number(int, low=1)                       # steps, samples, batches, tokens
NONNEG_INT = Number(int, low=0)                  # "0 = off" counts, positions from the start
INT = Number(int)                                # seeds, signed positions
DEFAULT_SEED = 0   # the seed of every seeded draw unless its caller says otherwise (one convention, one home)
LAST_POS = -1      # a position meaning the last one: the prediction after the last token
FINITE = Number(float)                           # coefficients
POSITIVE = Number(float, low=0.0, low_open=True)  # learning rates, temperatures > 0
NONNEG = Number(float, low=0.0)                  # weight decay, coefficients of penalties
FRACTION = Number(float, low=0.0, high=1.0)      # fractions, densities
SHARE = Number(float, low=0.0, high=1.0, low_open=True)  # a share kept: graph thresholds, logit probability
# Held-out text tokens feature dashboards are built on (a graph report's feature cards, `sae dashboards`):
# all of it is tokenised and held at once (0: none).
CARD_TOKENS = Number(int, low=0, high=4_194_304, why="the text is tokenised and held in memory at once")


def check_fields(obj: Any, rules: dict[str, Number | PerItem], where: str, error: type[Exception] = ConfigError) -> None:
    """Check a config dataclass's numeric fields against their rules, in place: a YAML string that
    reads as a number ("3e-4") becomes that number, an int for a float rule becomes a float; any other
    bad value is error("<where>.<field> must be ..., got ...")."""
    names = {f.name for f in fields(obj)}
    for name, rule in rules.items():
        if name not in names:
            raise KeyError(f"check_fields: {type(obj).__name__} has no field {name!r}")
        value = getattr(obj, name)
        if isinstance(value, str):
            value = rule.read(value)
        setattr(obj, name, rule.check(value, f"{where}.{name}", error))
