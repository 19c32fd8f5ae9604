"""Input attribution against ground truth: the hand-built adder and induction circuit, a trained
induction model, Captum's integrated gradients, and the `circuitlab attribute` command."""
import json

import pytest
import torch
from captum.attr import IntegratedGradients
from helpers import random_model
from tiny_trained import HALF, induction_model, repeated_batch

from circuitlab import CircuitlabError, ModelConfig
from circuitlab.analysis.input_attribution import (_run_embeds, attribute_inputs, context_mixing, integrated_gradients,
                                                   logit_metric, occlusion, techniques)
from circuitlab.cli import main
from circuitlab.data import CharTokenizer
from circuitlab.forge import EOS, build_carry_adder, build_induction_model
from circuitlab.training import save_checkpoint
from circuitlab.viz import tokens as _token_views  # noqa: F401  registers the Jupyter display

pytestmark = pytest.mark.usefixtures("one_thread")


def _adder_tens_case(adder, a: int, b: int):
    """Tokens up to the position that predicts the answer's tens digit, that position, the digit."""
    answer = [int(c) for c in str(a + b).zfill(3)]
    tokens = torch.tensor([a // 10, a % 10, b // 10, b % 10, EOS, answer[0]])
    return tokens, 5, answer[1]


def test_adder_tens_digit_attribution_falls_on_the_digits_that_determine_it():
    adder = build_carry_adder(2)
    # No carry into the tens (units sum <= 7) and none out (tens sum <= 8): from the all-zero problem as
    # baseline, the metric logit(d) - logit(d - 1) = 2·(a_tens + b_tens) - (2d - 1) is linear along the path,
    # so integrated gradients gives exactly 2·a_tens and 2·b_tens to the tens digits and nothing to the rest.
    for a, b in [(23, 41), (52, 13), (30, 44), (16, 71)]:
        tokens, pos, tens = _adder_tens_case(adder, a, b)
        baseline = torch.tensor([0, 0, 0, 0, EOS, 0])
        ig = integrated_gradients(adder.model, tokens, target=tens, foil=tens - 1, pos=pos, baseline=baseline)
        expected = torch.tensor([2.0 * (a // 10), 0, 2.0 * (b // 10), 0, 0, 0])
        assert torch.allclose(ig.scores, expected, atol=1e-4), (a, b, ig.scores)
        assert ig.completeness_error < 1e-5
    # Occlusion (a digit replaced by 0) matters exactly where zeroing it changes the tens digit: always the
    # tens digits (when nonzero), the units digits only when they make the carry.
    for a, b in [(23, 41), (27, 45), (58, 36), (90, 19)]:
        tokens, pos, tens = _adder_tens_case(adder, a, b)
        # logit(0) is identically 0 in this design, so contrast with another digit
        occ = occlusion(adder.model, tokens, target=tens, foil=(tens + 5) % 10, pos=pos, replacement=0)
        for i in range(4):
            digits = tokens[:4].clone()
            digits[i] = 0
            changed = ((10 * digits[0] + digits[1] + 10 * digits[2] + digits[3]) // 10) % 10 != tens
            assert (abs(float(occ.scores[i])) > 1e-3) == bool(changed), (a, b, i, occ.scores)


def _induction_cases(model, tokens: torch.Tensor, half: int, offsets=range(1, 6)):
    for i, k in enumerate(offsets):
        seq = tokens[i % len(tokens)]
        p = half + k  # repeated token; its earlier occurrence is k, whose next token (k + 1) is the answer
        yield seq[:p + 1], p, k + 1, int(seq[p + 1])


@pytest.mark.parametrize("which", ["hand-built", "trained"])
def test_induction_answer_token_gets_the_most_attribution(which):
    if which == "hand-built":
        model, half = build_induction_model(d_vocab=20, n_ctx=32).model, 8
        tokens = torch.stack([torch.randperm(20, generator=torch.Generator().manual_seed(s))[:half] for s in range(5)])
        tokens = torch.cat([tokens, tokens], dim=1)
    else:
        model, half = induction_model(), HALF
        tokens = repeated_batch(5, torch.Generator().manual_seed(1))
    for seq, p, answer_pos, answer in _induction_cases(model, tokens, half):
        for technique in techniques():   # every registered one, by what it is
            method = technique.name
            if technique.surrogate:
                continue  # sampled: tests/analysis/test_input_attribution_shap.py, with the number of samples it takes
            if technique.no_target is not None:   # context mixing
                # The last layer (the induction head's) moves the answer token in more than any other source.
                mixing = technique.run(model, seq, pos=p).per_layer[-1].clone()
                mixing[p] = -1
                assert int(mixing.argmax()) == answer_pos, (which, method, mixing)
                continue
            result = attribute_inputs(model, seq, method, target=answer, pos=p)
            assert result.top(1)[0][0] == answer_pos, (which, method, result.scores)


def test_integrated_gradients_equals_captum_and_is_complete():
    model = random_model(ModelConfig.from_preset("gpt2-tiny", d_model=32, n_heads=2, d_vocab=50, n_ctx=16), scale=2.0)
    tokens = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(0))
    baseline = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(1))
    for base, base_embeds in (("zeros", torch.zeros(12, 32)), (5, model.W_E[5].detach().expand(12, -1)),
                              (baseline, model.W_E[baseline].detach())):
        ours = integrated_gradients(model, tokens, target=7, foil=3, baseline=base, steps=40, batch_size=16)
        metric = logit_metric(7, 3, 11)
        captum = IntegratedGradients(lambda e: metric(_run_embeds(model, tokens, e)))
        theirs = captum.attribute(model.embed(tokens).detach()[None], baselines=base_embeds[None], n_steps=40,
                                  method="gausslegendre")
        assert torch.allclose(ours.scores, theirs[0].sum(-1), atol=1e-4)
        assert ours.completeness_error < 0.01
        json.dumps(ours.to_dict())


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_shortcut_path_equals_the_full_forward(preset):
    # target/foil run the blocks up to pos and the unembedding at pos alone; a metric function runs the
    # whole forward: the same numbers, later positions exactly 0 (learned positions; rotary + GQA)
    cfg = ModelConfig.from_preset(preset, d_model=32, n_heads=4, d_vocab=40, n_ctx=16)
    model = random_model(cfg, scale=2.0).double()
    tokens = torch.randint(0, 40, (12,), generator=torch.Generator().manual_seed(2))
    full = logit_metric(7, 3, 6)
    for method in [t.name for t in techniques() if t.no_target is None and not t.surrogate]:   # deterministic
        short = attribute_inputs(model, tokens, method, target=7, foil=3, pos=6)
        long = attribute_inputs(model, tokens, method, metric=full, pos=6)
        assert torch.allclose(short.scores, long.scores, atol=1e-9), method
        assert short.metric_value == pytest.approx(long.metric_value, abs=1e-9)
        assert (short.scores[7:] == 0).all()
    assert all(p.requires_grad for p in model.parameters())  # frozen only while attributing


def test_metric_function_and_result_display():
    model = induction_model()
    seq = repeated_batch(1, torch.Generator().manual_seed(3))[0]

    def answer_log_prob(logits):  # any function of the logits, [batch, pos, d_vocab] -> [batch]
        return logits[:, -1].log_softmax(dim=-1)[:, int(seq[HALF])]

    result = integrated_gradients(model, seq, metric=answer_log_prob, steps=16)
    assert result.target is None and result.completeness_error < 0.01
    html = result._repr_html_()
    assert html.count("<span title=") == len(seq) and "http" not in html  # offline: nothing fetched
    mixing = context_mixing(model, seq)
    assert mixing.per_layer.shape == (2, len(seq))
    assert torch.allclose(mixing.per_layer.sum(-1), torch.ones(2)) and abs(float(mixing.scores.sum()) - 1) < 1e-5
    assert "layer 1" in mixing._repr_html_()


def test_bad_inputs_raise_one_line_errors():
    model = induction_model()
    seq = repeated_batch(1, torch.Generator().manual_seed(3))[0]
    for kwargs, message in [(dict(target=99), "target must be a token id"), (dict(target=3, foil=3), "foil is the"),
                            (dict(steps=0), "steps must be a whole number from 1"), (dict(baseline=seq[:4]), "same length"),
                            (dict(pos=40), "outside the sequence"), (dict(baseline="ones"), "unknown baseline")]:
        with pytest.raises(CircuitlabError, match=message):
            integrated_gradients(model, seq, **kwargs)
    with pytest.raises(CircuitlabError, match="at least one token"):
        integrated_gradients(model, seq[:0])
    with pytest.raises(CircuitlabError, match="span must be"):
        occlusion(model, seq, span=0)
    with pytest.raises(CircuitlabError, match="unknown attribution method"):
        attribute_inputs(model, seq, "shapley")


def test_attribute_command(tmp_path, capsys):
    tok = CharTokenizer("abcdefghijklmnopqrstuvw")  # 23 characters + EOS: the trained model's 24 ids
    save_checkpoint(tmp_path / "ckpt", induction_model(), tok)
    args = ["attribute", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "hqcbmjadhqcbm"]
    assert main(args + ["--target", "j", "--foil", "a", "--out", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "completeness error" in out and "target 'j' vs foil 'a'" in out
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["method"] == "ig" and max(range(13), key=lambda i: saved["scores"][i]) == 5  # the 'j' after 'm'
    assert main(args + ["--method", "occlusion", "--out", str(tmp_path / "a.html")]) == 0
    assert "<span" in (tmp_path / "a.html").read_text()
    for bad in (["--target", "jj"], ["--target", "j", "--foil", "j"], ["--steps", "0"], ["--baseline", "ab"],
                ["--method", "context-mixing", "--target", "j"]):
        try:
            code = main(args + bad)
        except SystemExit as e:  # argparse's refusals exit 2 themselves
            code = e.code
        assert code == 2
    assert main(["attribute", "--checkpoint", str(tmp_path / "ckpt"), "--prompt", ""]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 6
