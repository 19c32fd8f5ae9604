"""AttributionOptions (analysis/input_attribution/options.py): `circuitlab attribute`'s flags, the class's defaults,
from_dict and the analysis functions' keyword defaults are one declaration; a bad value is refused by the command
line and by check() with the same rule; the checks between fields are one line each."""
import inspect

import pytest

from circuitlab.analysis.input_attribution import (DEFAULT_KERNEL_WIDTH, DEFAULT_SAMPLES, DEFAULT_STEPS, DEFAULTS,
                                                   METHODS, AttributionOptions, attribute_inputs, attribution_estimate,
                                                   context_mixing, get_technique, integrated_gradients, kernel_shap,
                                                   lime, occlusion, saliency)
from circuitlab.cli import build_parser
from circuitlab.errors import ConfigError, InputError
from circuitlab.spec import schema

REQUIRED = ["--checkpoint", "runs/x", "--prompt", "Lily saw a cat"]


def parsed(argv: list[str]):
    return build_parser().parse_args(["attribute", *argv])


def test_the_flags_the_class_and_from_dict_agree():
    assert AttributionOptions.from_args(parsed(REQUIRED)) == AttributionOptions("runs/x", "Lily saw a cat").check()
    assert AttributionOptions.from_dict({"checkpoint": "runs/x", "prompt": "Lily saw a cat"}) == \
        AttributionOptions.from_args(parsed(["--model", "runs/x", "--prompt", "Lily saw a cat"]))
    given = AttributionOptions.from_args(parsed(REQUIRED + ["--method", "shap", "--samples", "64", "--seed", "3",
                                                            "--exact", "--paired", "--kernel-width", "2",
                                                            "--pos", "-2", "--span", "2", "--steps", "8"]))
    assert (given.method, given.samples, given.seed, given.exact, given.paired) == ("shap", 64, 3, True, True)
    assert given.kernel_width == 2.0 and isinstance(given.kernel_width, float) and (given.pos, given.span) == (-2, 2)
    assert AttributionOptions.from_dict(given.to_dict()) == given
    doc = schema(AttributionOptions)   # a config's / the explorer's form of the same declaration
    assert doc["required"] == ["checkpoint", "prompt"] and doc["properties"]["samples"]["default"] == DEFAULTS.samples
    assert doc["properties"]["method"]["enum"] == list(METHODS) and doc["properties"]["seed"]["minimum"] == 0
    assert DEFAULTS.method in METHODS and (DEFAULT_STEPS, DEFAULT_SAMPLES, DEFAULT_KERNEL_WIDTH) == (
        DEFAULTS.steps, DEFAULTS.samples, DEFAULTS.kernel_width)


def test_the_analysis_keywords_default_to_the_class():
    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    for fn in (saliency, integrated_gradients, occlusion, kernel_shap, lime, context_mixing):
        assert default(fn, "pos") == DEFAULTS.pos, fn.__name__
    assert default(integrated_gradients, "steps") == DEFAULTS.steps and default(occlusion, "span") == DEFAULTS.span
    for fn in (kernel_shap, lime):   # attribute_methods passes each technique its options' defaults (techniques.py)
        assert default(fn, "samples") == DEFAULTS.samples and default(fn, "seed") == DEFAULTS.seed, fn.__name__
    assert default(lime, "kernel_width") == DEFAULTS.kernel_width
    assert default(attribute_inputs, "method") == default(attribution_estimate, "method") == DEFAULTS.method


@pytest.mark.parametrize("flag, text, value, rule", [
    ("--samples", "2", 2, "a whole number from 3 to 100000"),
    ("--steps", "2000", 2000, "a whole number from 1 to 1024"),
    ("--seed", "-1", -1, "a whole number from 0 to"),
    ("--span", "0", 0, "a whole number >= 1"),
    ("--kernel-width", "0", 0, "a finite number > 0"),
    ("--pos", "1.5", 1.5, "a whole number"),
])
def test_a_bad_value_is_refused_by_the_command_line_and_by_check_alike(flag, text, value, rule, capsys):
    with pytest.raises(SystemExit) as e:
        parsed(REQUIRED + [flag, text])
    assert e.value.code == 2 and f"argument {flag}: must be {rule}" in capsys.readouterr().err
    name = flag[2:].replace("-", "_")
    with pytest.raises(InputError, match=f"^{name} must be {rule}"):
        AttributionOptions("runs/x", "p", **{name: value}).check()
    with pytest.raises(ConfigError, match=f"^{name} must be {rule}"):
        AttributionOptions.from_dict({"checkpoint": "runs/x", "prompt": "p", name: value})


@pytest.mark.parametrize("given, said", [
    ({"checkpoint": None}, r"^checkpoint is required$"),
    ({"prompt": None}, r"^prompt is required$"),
    ({"out": "a.txt"}, r"^--out a.txt: give a file name ending in .html \(tokens shaded\) or .json$"),
    ({"method": "context-mixing", "foil": " w"}, r"^context mixing reads attention, not a target: drop --target/--foil$"),
    ({"baseline": "delete"}, r"^--baseline delete is for shap and lime \(a path of embeddings needs the same positions\)"),
    ({"method": "lasso"}, r"^method must be one of ig, saliency, "),
])
def test_checks_between_fields_are_one_line(given, said):
    with pytest.raises(InputError, match=said):
        AttributionOptions(**{"checkpoint": "runs/x", "prompt": "p", **given}).check()


def test_method_keywords_are_those_the_method_takes():
    """Each method gets the options it reads and no other (attribute_inputs passes them on as keywords)."""
    for method in METHODS:
        kw = AttributionOptions("runs/x", "p", method=method).check().method_keywords()
        takes = set(inspect.signature(get_technique(method).run).parameters)
        assert set(kw) <= takes and "pos" in kw, method
    assert AttributionOptions("m", "p", method="shap", exact=True).method_keywords() == {
        "pos": -1, "samples": 1024, "seed": 0, "exact": True, "paired": False}
    assert AttributionOptions("m", "p", method="lime").method_keywords() == {
        "pos": -1, "samples": 1024, "seed": 0, "kernel_width": 1.0}
