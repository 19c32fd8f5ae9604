"""Hand-built adders: the reference post's 2-digit design, and an exact n-digit + m-digit adder.

Token format (shared with circuitlab.data.synthetic.AdditionTask): digits 0..9 are tokens 0..9,
EOS is token 10. A problem is [digits of a, digits of b, EOS], each number written most
significant digit first and zero-padded to the width the model was built for; the answer is
max(n_a, n_b) + 1 digits, most significant first.

build_post_adder()   the post's design: 2 layers, one V-only head each, d_model 3. The EOS
                     residual ends at [units sum, tens sum, 1]; the answer 10·x1 + x0 is read off
                     it in Python, carries included.
build_carry_adder()  everything in the model: it writes the answer digits as tokens, read through
                     the unembedding (argmax), carries computed by attention and two MLPs, for
                     any digit counts n and m.

`circuitlab forge adder` from Python (its flags are AdderOptions, declared once: circuitlab.spec):
    for text in run_adder(AdderOptions(a="17", b="25", explain=True)):
        print(text)
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from circuitlab.atomic import json_text
from circuitlab.checks import COUNT, DEFAULT_SEED, INT
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.forge.adder_base import (CHECK_SAMPLES, D_VOCAB, EOS, EXHAUSTIVE_LIMIT,  # noqa: F401
                                         MAX_DIGITS, Adder, AdderCheck, TokenAdder, add_digits, digits_of,
                                         digits_to_str, parse_operand)
from circuitlab.forge.carry_adder import CarryAdder, build_carry_adder
from circuitlab.forge.post_adder import PostAdder, build_post_adder
from circuitlab.spec import Options, option


def build_adder(design: str = "carry", n_digits_a: int = 2, n_digits_b: int | None = None) -> Adder:
    """build_post_adder() for design "post" (2 + 2 digits only), else build_carry_adder(n, m)."""
    m = n_digits_a if n_digits_b is None else n_digits_b
    if design == "post":
        if (n_digits_a, m) != (2, 2):
            raise CircuitlabError(f"the post's design adds two 2-digit numbers; for {n_digits_a}+{m} digits "
                                  "use the carry design")
        return build_post_adder()
    if design == "carry":
        return build_carry_adder(n_digits_a, m)
    raise CircuitlabError(f"unknown adder design {design!r}; choose post or carry")


@dataclass(frozen=True)
class AdderOptions(Options):
    """What `circuitlab forge adder` takes, declared once (circuitlab.spec): each flag's default, rule and help.
    a and b are text (parse_operand reads them against the digit counts); the digit counts' bounds are the
    builder's (build_carry_adder). check() adds what no field's rule holds: --check or --a/--b, both or neither of
    --a/--b, --explain only with them."""

    design: str = option("auto", choices=("auto", "post", "carry"),
                         help="post: the reference post's design (2+2 digits only); carry: the exact adder; "
                              "auto (default): post for 2+2 digits, carry otherwise")
    digits: int = option(2, INT, arg=int, help="digits of a (default {default})")
    digits_b: int | None = option(None, INT, arg=int, help="digits of b (default: same as --digits)")
    check_all: bool = option(False, flag="--check",
                             help="count correct answers: every input up to 3+3 digits, else --samples random pairs")
    samples: int = option(CHECK_SAMPLES, COUNT, help="random pairs checked beyond 3+3 digits")
    seed: int = option(DEFAULT_SEED, INT, arg=int, help="seed of the random pairs")
    a: str | None = option(None, help="first number")
    b: str | None = option(None, help="second number")
    explain: bool = option(False, help="with --a/--b: each token's residual and where the heads attend")
    json: bool = option(False, help="print the --check result as JSON")

    def check(self, error: type[Exception] = InputError) -> AdderOptions:
        """One line for what was asked wrongly (in the command's words), then every field's rule."""
        if not self.check_all and self.a is None and self.b is None:
            raise error("give --check, or two numbers with --a and --b")
        if (self.a is None) != (self.b is None):
            raise error("give both --a and --b")
        if self.explain and self.a is None:
            raise error("--explain walks through one sum: give --a and --b")
        return super().check(error)

    @property
    def digit_counts(self) -> tuple[int, int]:
        """(digits of a, digits of b): b's count is a's unless given."""
        return self.digits, self.digits if self.digits_b is None else self.digits_b

    @property
    def design_name(self) -> str:
        """The design built: auto is post for 2+2 digits, carry otherwise."""
        if self.design != "auto":
            return self.design
        return "post" if self.digit_counts == (2, 2) else "carry"


def run_adder(opts: AdderOptions) -> Iterator[str]:
    """What `circuitlab forge adder` prints, as it is ready: the check's result (or its JSON), then the sum (or
    its walk-through)."""
    opts = opts.check()
    n, m = opts.digit_counts
    adder = build_adder(opts.design_name, n, m)
    if opts.check_all:
        result = adder.check(samples=opts.samples, seed=opts.seed)
        yield json_text(result.to_dict(), indent=2) if opts.json else str(result)
    if opts.a is not None and opts.b is not None:
        a = parse_operand(opts.a, "a", n, f" (use --digits {len(opts.a.strip())})")
        b = parse_operand(opts.b, "b", m, f" (use --digits-b {len(opts.b.strip())})")
        yield adder.explain(a, b) if opts.explain else f"{a} + {b} = {adder.add(a, b)}"


__all__ = ["Adder", "AdderCheck", "AdderOptions", "CarryAdder", "D_VOCAB", "EOS", "PostAdder", "TokenAdder", "add_digits",
           "build_adder", "build_carry_adder", "build_post_adder", "digits_of", "parse_operand", "run_adder"]
