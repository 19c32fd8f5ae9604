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
"""
from __future__ import annotations

from circuitlab.errors import CircuitlabError
from circuitlab.forge.adder_base import (D_VOCAB, EOS, EXHAUSTIVE_LIMIT, MAX_DIGITS, Adder, AdderCheck,  # noqa: F401
                                         TokenAdder, add_digits, digits_of, digits_to_str, parse_operand)
from circuitlab.forge.carry_adder import CarryAdder, build_carry_adder
from circuitlab.forge.post_adder import PostAdder, build_post_adder


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


__all__ = ["Adder", "AdderCheck", "CarryAdder", "D_VOCAB", "EOS", "PostAdder", "TokenAdder", "add_digits",
           "build_adder", "build_carry_adder", "build_post_adder", "digits_of", "parse_operand"]
