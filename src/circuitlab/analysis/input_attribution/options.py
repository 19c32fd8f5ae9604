"""What input attribution takes, declared once (circuitlab.spec): the number rules, what every technique shares
(AttributeInputs: what is explained and where the result goes) and each built-in technique's own options
(IGOptions, OcclusionOptions, ShapOptions, LimeOptions). `circuitlab attribute`'s options class is put together
from these by the technique registry (techniques.py: attribution_options), so a registered technique's options
become its flags; the analysis functions' keyword defaults (DEFAULT_STEPS, DEFAULT_SEED, ...) read them here.

    opts = AttributionOptions(checkpoint="runs/demo/2l", prompt="Lily saw a cat. Lily", method="shap").check()
    add_arguments(parser, attribution_options())   # --checkpoint/--model, --prompt, --method, --steps, ...
    attribution_options().from_args(args)          # the parsed command line, checked
"""
from __future__ import annotations

from dataclasses import dataclass

from circuitlab.checks import COUNT, DEFAULT_SEED, INT, LAST_POS, POSITIVE, Number
from circuitlab.spec import Options, option

# Limits on the path's points: Gauss-Legendre nodes come from an [n, n] eigenproblem (1024: 8 MB, 0.3 s;
# 50 000 would need 18.6 GiB), so beyond it use the midpoint (riemann) rule, whose points cost nothing.
STEPS = {"gausslegendre": Number(int, low=1, high=1024, why="Gauss-Legendre nodes solve an n x n eigenproblem; "
                                                            "rule='riemann' takes up to 100000"),
         "riemann": Number(int, low=1, high=100_000, why="more points take longer without a measurable change")}
# KernelSHAP / LIME: model evaluations (coalitions), each one forward pass of the prompt; the regression holds
# [samples, pos] float64, bounded by the memory budget too (perturbation.check_samples).
SAMPLES = Number(int, low=3, high=100_000, why="each coalition is a forward pass of the prompt; past 100000 the "
                                                 "estimate's sampling error is below anything a figure shows")
SEED = Number(int, low=0, high=2 ** 63 - 1)
KERNEL_WIDTH = POSITIVE  # LIME: width of the exponential kernel on the cosine distance (in [0, 1])
EXACT_MAX_POSITIONS = 16  # exact Shapley values enumerate 2^M coalitions: 65 534 forward passes at 16
OUT_SUFFIXES = (".html", ".json")
# The baseline option of every technique that takes one (ig's path start, the removed token of shap and lime):
# one help, so the techniques' declarations are the same option and merge into one flag.
BASELINE_HELP = ("what a removed token becomes (ig, shap, lime): 'zeros', 'mean' (the mean token embedding), 'eos' "
                 "(the EOS token), 'token:N' (token id N), a prompt of the same number of tokens, or (shap, lime) "
                 "'delete' (taken out of the sequence). Default: zeros for ig, mean for shap/lime")


@dataclass(frozen=True)
class AttributeInputs(Options):
    """What every technique shares in `circuitlab attribute`: what is explained (checkpoint, prompt, target, foil,
    pos), by which technique (method: its choices are the registry's, filled in by attribution_options) and where
    the result goes (out). The techniques' own options come between pos and out."""

    checkpoint: str | None = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    prompt: str | None = option(None, required=True, help="the text whose last token's prediction is explained")
    target: str | None = option(None, help="the predicted token to explain (one token; default: the model's top "
                                           "prediction)")
    foil: str | None = option(None, help="explain target against this token (logit difference)")
    method: str = option("ig", help="")
    pos: int = option(LAST_POS, INT, help="the position whose prediction is explained (default: last)")
    out: str | None = option(None, help="write the result: .html (tokens shaded) or .json")


@dataclass(frozen=True)
class IGOptions(Options):
    """Integrated gradients: the path's points and where it starts."""

    # Gauss-Legendre nodes; completeness error on the demo model: docs/attribution.md
    steps: int = option(32, STEPS["gausslegendre"],
                        help=f"integrated gradients: points on the path (default {{default}}, at most "
                             f"{STEPS['gausslegendre'].high}; run in chunks that fit memory)")
    baseline: str | None = option(None, help=BASELINE_HELP)


@dataclass(frozen=True)
class OcclusionOptions(Options):
    """Occlusion: how many tokens each window replaces."""

    span: int = option(1, COUNT, help="occlusion: tokens replaced at a time")


@dataclass(frozen=True)
class CoalitionOptions(Options):
    """What KernelSHAP and LIME share: what a removed token becomes, how many coalitions, drawn from which seed."""

    baseline: str | None = option(None, help=BASELINE_HELP)
    # KernelSHAP ranks the hand-built induction answer first on every test case from 1024 (docs/attribution.md)
    samples: int = option(1024, SAMPLES, help=f"shap, lime: coalitions evaluated, one forward pass each, batched "
                                               f"(default {{default}}; {SAMPLES.low} to {SAMPLES.high})")
    seed: int = option(DEFAULT_SEED, SEED, help="shap, lime: seed of the coalitions drawn (default {default})")


@dataclass(frozen=True)
class ShapOptions(CoalitionOptions, Options):
    """KernelSHAP: the coalitions' options, and whether to enumerate them all or draw them in pairs."""

    exact: bool = option(False, help=f"shap: enumerate every coalition (exact Shapley values; at most "
                                      f"{EXACT_MAX_POSITIONS} positions)")
    paired: bool = option(False, help="shap: draw each coalition with its complement (fewer samples for the same "
                                      "ranking; not Captum's sampling)")


@dataclass(frozen=True)
class LimeOptions(CoalitionOptions, Options):
    """LIME: the coalitions' options and the width of the kernel weighing them."""

    kernel_width: float = option(1.0, KERNEL_WIDTH, help="lime: width of the exponential kernel on the cosine "
                                                         "distance from the prompt (default {default}, as Captum's)")


# What the analysis functions' keywords default to.
_SHARED, _COALITIONS = AttributeInputs(), CoalitionOptions()
DEFAULT_METHOD, DEFAULT_POS = _SHARED.method, _SHARED.pos
DEFAULT_STEPS, DEFAULT_SPAN = IGOptions().steps, OcclusionOptions().span
DEFAULT_SAMPLES, DEFAULT_KERNEL_WIDTH = _COALITIONS.samples, LimeOptions().kernel_width   # the seed: DEFAULT_SEED
