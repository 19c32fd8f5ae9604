"""What input attribution takes, declared once (circuitlab.spec): the methods, the number rules and every
default of `circuitlab attribute`'s options. The command's flags (commands/attribute.py: add_arguments and
from_args) and the analysis functions' keyword defaults (DEFAULTS.seed, DEFAULT_STEPS, ...) all read them.

    opts = AttributionOptions(checkpoint="runs/demo/2l", prompt="Lily saw a cat. Lily", method="shap").check()
    add_arguments(parser, AttributionOptions)     # --checkpoint/--model, --prompt, --method, --steps, ...
    AttributionOptions.from_args(args)            # the parsed command line, checked
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from circuitlab.checks import COUNT, DEFAULT_SEED, INT, LAST_POS, POSITIVE, Number
from circuitlab.errors import InputError
from circuitlab.spec import Options, option

METHODS = ("ig", "saliency", "grad-x-input", "occlusion", "context-mixing", "shap", "lime")
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


@dataclass(frozen=True)
class AttributionOptions(Options):
    """`circuitlab attribute`: what is explained (checkpoint, prompt, target, foil, pos), by which method and how
    (steps, baseline, span, samples, seed, kernel_width, exact, paired), and where the result goes (out)."""

    checkpoint: str | None = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    prompt: str | None = option(None, required=True, help="the text whose last token's prediction is explained")
    target: str | None = option(None, help="the predicted token to explain (one token; default: the model's top "
                                           "prediction)")
    foil: str | None = option(None, help="explain target against this token (logit difference)")
    method: str = option("ig", choices=METHODS, help="")
    pos: int = option(LAST_POS, INT, help="the position whose prediction is explained (default: last)")
    # Gauss-Legendre nodes; completeness error on the demo model: docs/attribution.md
    steps: int = option(32, STEPS["gausslegendre"],
                        help=f"integrated gradients: points on the path (default {{default}}, at most "
                             f"{STEPS['gausslegendre'].high}; run in chunks that fit memory)")
    baseline: str | None = option(None, help="what a removed token becomes (ig, shap, lime): 'zeros', 'mean' (the "
                                             "mean token embedding), 'eos' (the EOS token), 'token:N' (token id N), "
                                             "a prompt of the same number of tokens, or (shap, lime) 'delete' (taken "
                                             "out of the sequence). Default: zeros for ig, mean for shap/lime")
    span: int = option(1, COUNT, help="occlusion: tokens replaced at a time")
    # KernelSHAP ranks the hand-built induction answer first on every test case from 1024 (docs/attribution.md)
    samples: int = option(1024, SAMPLES, help=f"shap, lime: coalitions evaluated, one forward pass each, batched "
                                               f"(default {{default}}; {SAMPLES.low} to {SAMPLES.high})")
    seed: int = option(DEFAULT_SEED, SEED, help="shap, lime: seed of the coalitions drawn (default {default})")
    kernel_width: float = option(1.0, KERNEL_WIDTH, help="lime: width of the exponential kernel on the cosine "
                                                         "distance from the prompt (default {default}, as Captum's)")
    exact: bool = option(False, help=f"shap: enumerate every coalition (exact Shapley values; at most "
                                      f"{EXACT_MAX_POSITIONS} positions)")
    paired: bool = option(False, help="shap: draw each coalition with its complement (fewer samples for the same "
                                      "ranking; not Captum's sampling)")
    out: str | None = option(None, help="write the result: .html (tokens shaded) or .json")

    def check(self, error: type[Exception] = InputError) -> "AttributionOptions":
        """Each field's rule, then what holds between fields: an output file .html or .json, no target or foil
        for context mixing (it reads attention), the 'delete' baseline only where tokens may leave (shap, lime)."""
        checked = super().check(error)
        if checked.out and PurePath(checked.out).suffix not in OUT_SUFFIXES:
            raise error(f"--out {checked.out}: give a file name ending in .html (tokens shaded) or .json")
        if checked.method == "context-mixing" and (checked.target is not None or checked.foil is not None):
            raise error("context mixing reads attention, not a target: drop --target/--foil")
        if checked.method == "ig" and checked.baseline == "delete":
            raise error("--baseline delete is for shap and lime (a path of embeddings needs the same positions): "
                        "give zeros, mean, eos, token:N or a prompt")
        return checked

    def method_keywords(self) -> dict[str, Any]:
        """The keywords of attribute_inputs(..., self.method) these options set, beside the tokens' own (target,
        foil, baseline, start_token, replacement: the command reads them with its tokenizer)."""
        kw: dict[str, Any] = {"pos": self.pos}
        if self.method == "ig":
            kw["steps"] = self.steps
        if self.method in ("shap", "lime"):
            kw.update(samples=self.samples, seed=self.seed)
        if self.method == "lime":
            kw["kernel_width"] = self.kernel_width
        if self.method == "shap":
            kw.update(exact=self.exact, paired=self.paired)
        if self.method == "occlusion":
            kw["span"] = self.span
        return kw


DEFAULTS = AttributionOptions()   # what the analysis functions' keywords default to
DEFAULT_STEPS, DEFAULT_SAMPLES, DEFAULT_KERNEL_WIDTH = DEFAULTS.steps, DEFAULTS.samples, DEFAULTS.kernel_width
