"""The technique registry of input attribution (analysis/input_attribution/techniques.py): a toy technique
registered from this file alone, with an option of its own, is in `circuitlab attribute --method`'s choices and
runs there, in the explorer's request model and its /inputs form, and in `interpret`'s options and run; the
built-ins each run through the registry; a registration that would break a front end is refused."""
import json
from dataclasses import dataclass

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.input_attribution import (AttributionOptions, Technique, attribute_inputs,
                                                   attribute_methods, attribution_estimate, attribution_options,
                                                   get_technique, register_technique, saliency, technique_names,
                                                   techniques, unregister_technique)
from circuitlab.checks import COUNT
from circuitlab.cli import build_parser, main
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.spec import Options, option, options_of
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "Lily saw a cat. Lily"
BUILTINS = ("ig", "saliency", "grad-x-input", "occlusion", "context-mixing", "shap", "lime")   # in results' order


@dataclass(frozen=True)
class ShiftOptions(Options):
    shift: int = option(1, COUNT, help="toy: positions the saliency scores move right")


def shifted_saliency(model, tokens, target=None, foil=None, pos=-1, shift=1, tokenizer=None):
    """A toy: saliency's scores [pos], moved `shift` positions right (the first ones 0)."""
    found = saliency(model, tokens, target, foil, pos, tokenizer=tokenizer)
    scores = torch.zeros_like(found.scores)
    scores[shift:] = found.scores[:-shift]
    found.scores, found.method = scores, "shifted"
    found.extra["shift"] = shift
    return found


@pytest.fixture
def shifted():
    technique = register_technique(Technique("shifted", shifted_saliency, ShiftOptions, label="shifted saliency",
                                             backward=True))
    yield technique
    unregister_technique("shifted")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("techniques")
    tokenizer = CharTokenizer.from_texts([PROMPT + " The cat was happy."])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=32))
    save_checkpoint(root / "run" / "checkpoint", model, tokenizer)
    return root, model, tokenizer


def test_the_builtins_are_registered_in_results_order_and_each_runs_through_the_registry(run):
    _, model, tokenizer = run
    assert technique_names() == BUILTINS and AttributionOptions is attribution_options()
    tokens = torch.tensor(tokenizer.encode(PROMPT))
    found = attribute_methods(model, tokens, tokenizer=tokenizer, samples=16, progress=False)
    assert list(found) == list(BUILTINS)
    for t in techniques():   # the dispatch and each technique's own run agree, with the keywords it takes
        direct = t.run(model, tokens, **t.keywords({"samples": 16}, target=found["ig"].target, baseline=None,
                                                   eos=tokenizer.eos_id, progress=False, tokenizer=tokenizer))
        assert torch.equal(direct.scores, found[t.name].scores) and direct.method == t.name, t.name
        assert attribution_estimate(model, len(tokens), t.name).parts, t.name


def test_a_toy_technique_registered_here_is_in_the_command_line_and_runs_there(shifted, run, tmp_path, capsys):
    root, model, tokenizer = run
    assert "shifted" in technique_names() and get_technique("shifted") is shifted
    parser = build_parser()
    args = parser.parse_args(["attribute", "--checkpoint", "x", "--prompt", "p", "--method", "shifted", "--shift", "2"])
    opts = attribution_options().from_args(args)
    assert (opts.method, opts.shift) == ("shifted", 2) and opts.method_keywords() == {"pos": -1, "shift": 2}
    with pytest.raises(SystemExit):
        parser.parse_args(["attribute", "--checkpoint", "x", "--prompt", "p", "--shift", "0"])   # its rule, COUNT
    assert "argument --shift: must be a whole number >= 1" in capsys.readouterr().err
    out = tmp_path / "shifted.json"
    assert main(["attribute", "--checkpoint", str(root / "run"), "--prompt", PROMPT, "--method", "shifted",
                 "--shift", "3", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    plain = saliency(model, torch.tensor(tokenizer.encode(PROMPT))).scores
    assert saved["method"] == "shifted" and saved["shift"] == 3
    assert saved["scores"][:3] == [0, 0, 0] and saved["scores"][3:] == pytest.approx(plain[:-3].tolist(), abs=1e-5)
    assert attribute_inputs(model, torch.tensor(tokenizer.encode(PROMPT)), "shifted", shift=1).method == "shifted"


def test_a_toy_technique_registered_here_is_in_the_explorer_and_its_form(shifted, run):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from circuitlab.serve import create_app

    root, _, _ = run
    client = TestClient(create_app(root / "run"))
    form = client.get("/api/attribute/form").json()
    assert [m["name"] for m in form["methods"]] == [*BUILTINS, "shifted"] and form["methods"][-1]["label"] == \
        "shifted saliency"
    assert form["options"]["shift"]["default"] == 1 and form["options"]["shift"]["minimum"] == 1
    assert form["takes"]["shift"] == ["shifted"]
    assert form["takes"]["samples"] == [t.name for t in techniques() if t.surrogate]   # shap, lime
    one = client.post("/api/attribute", json={"prompt": PROMPT, "method": "shifted", "shift": 2}).json()
    assert list(one["methods"]) == ["shifted"] and one["methods"]["shifted"]["scores"][:2] == [0, 0]
    every = client.post("/api/attribute", json={"prompt": PROMPT, "samples": 8}).json()
    assert list(every["methods"]) == [*BUILTINS, "shifted"]
    bad = client.post("/api/attribute", json={"prompt": PROMPT, "method": "shifted", "shift": 0})
    assert bad.status_code == 422 and bad.json()["detail"] == "shift must be a whole number >= 1, got 0"
    schema = client.get("/api/openapi.json").json()["components"]["schemas"]["AttributeRequest"]["properties"]
    assert "shift" in schema and "shifted" in schema["method"]["enum"]


def test_a_toy_technique_registered_here_is_in_interprets_options_and_run(shifted, run, tmp_path):
    from circuitlab.methods import REGISTRY

    root, model, tokenizer = run
    method = REGISTRY["input_attribution"]
    assert "shift" in {f.name for f, _ in options_of(method.options)}
    args = build_parser().parse_args(["interpret", "--checkpoint", "x", "--shift", "2", "--samples", "8"])
    assert (args.shift, args.samples) == (2, 8)   # interpret's flags: every registered technique's options
    found = method.run_with(model, tokenizer, tmp_path, {"prompt": PROMPT, "shift": 2, "samples": 8})
    assert list(found.methods) == [*BUILTINS, "shifted"] and found.methods["shifted"]["shift"] == 2
    assert found.methods["shap"]["samples"] == 8 and any(line.startswith("shifted: ") for line in found.summary)


def test_a_registration_that_would_break_a_front_end_is_refused():
    @dataclass(frozen=True)
    class Clashing(Options):
        samples: int = option(5, COUNT, help="another meaning of samples")

    @dataclass(frozen=True)
    class Shared(Options):
        prompt: str | None = option(None, help="a shared input's name")

    for bad, said in [(Technique("ig", saliency), "already registered"), (Technique("all", saliency), "'all'"),
                      (Technique("toy", saliency, Clashing), "declared otherwise"),
                      (Technique("toy", saliency, Shared), "shared input")]:
        with pytest.raises(ConfigError, match=said):
            register_technique(bad)
    assert technique_names() == BUILTINS
    with pytest.raises(CircuitlabError, match="unknown attribution method 'lasso'; choose one of ig, saliency"):
        attribute_inputs(None, torch.zeros(1), "lasso")


def test_a_techniques_check_refuses_before_any_method_runs(run, tmp_path, capsys):
    """interpret --exact on a prompt longer than exact Shapley values allow: one line, exit 2, before the first
    method runs and with no output folder; the same check as kernel_shap's own."""
    root, _, _ = run
    out = tmp_path / "interp"
    argv = ["interpret", "--checkpoint", str(root / "run"), "--experiments", "logit_lens", "input_attribution",
            "--prompt", f"{PROMPT} {PROMPT}", "--exact", "--out", str(out)]
    assert main(argv) == 2
    said = capsys.readouterr()
    assert "exact Shapley values enumerate 2^32 coalitions" in said.err   # the last n_ctx tokens and "running" not in said.out
    assert not out.exists()
    with pytest.raises(CircuitlabError, match="at most 16 positions"):
        get_technique("shap").check({"samples": 64, "exact": True}, 41)
