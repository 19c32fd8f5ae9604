"""Forge: transformers whose weights are set by hand, with known circuits.

builder    ResidualLayout (named subspaces of the residual stream) and Forge (set W_E, W_pos, W_U,
           each head's W_Q/W_K/W_V/W_O and MLP neurons on those subspaces)
examples   hand-built previous-token, induction and fixed-offset copying heads, with each head's role (test fixtures)
facts      a planted fact: a key-value memory in one MLP, read through a previous-token head (causal tracing's truth)
adder      the adders, as callers import them: adder_base.py (tokens, operands, checking, TokenAdder),
           post_adder.py (the reference post's 2-digit adder), carry_adder.py (an exact n-digit + m-digit adder)
compare    two models on the same inputs: accuracy, attention agreement, OV principal angles

A trained adder compared with the hand-built one (`circuitlab forge compare`) is an experiment:
circuitlab.experiments.forge_compare.
"""
from circuitlab.forge.adder import (EOS, Adder, AdderCheck, CarryAdder, PostAdder, TokenAdder, build_adder,
                                    build_carry_adder, build_post_adder)
from circuitlab.forge.builder import Forge, ResidualLayout
from circuitlab.forge.compare import (AdderComparison, AttentionAgreement, OVAlignment, attention_agreement,
                                      compare_adders, ov_alignment, ov_subspace, principal_angles)
from circuitlab.forge.examples import (HandBuilt, build_induction_model, build_positional_copy_model,
                                       build_previous_token_model)
from circuitlab.forge.facts import PlantedFacts, build_planted_fact_model

__all__ = ["EOS", "Adder", "AdderCheck", "AdderComparison", "AttentionAgreement", "CarryAdder", "Forge",
           "HandBuilt", "OVAlignment", "PlantedFacts", "PostAdder", "ResidualLayout", "TokenAdder",
           "attention_agreement", "build_adder", "build_carry_adder", "build_induction_model",
           "build_planted_fact_model", "build_positional_copy_model", "build_post_adder", "build_previous_token_model",
           "compare_adders", "ov_alignment", "ov_subspace", "principal_angles"]
