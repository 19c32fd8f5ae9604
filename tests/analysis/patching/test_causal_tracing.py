"""Causal tracing: the batched sweep == one restoration at a time with plain hooks (float64), the endpoints
(no noise: nothing to restore; everything restored: the clean run), and the planted fact found where it was
planted."""
import json

import pytest
import torch

import helpers

from circuitlab import ModelConfig
from circuitlab.analysis.patching.causal_tracing import (KINDS, average_causal_trace, causal_trace, default_window,
                                                restoration_sweep, restore_everything, subject_span, trace_run,
                                                window_layers)
from circuitlab.analysis.patching.noise import Noise, corrupt_positions
from circuitlab.analysis.patching.metrics import probability
from circuitlab.errors import InputError
from circuitlab.forge import build_planted_fact_model
from circuitlab.model.hooks import act_name

pytestmark = pytest.mark.usefixtures("one_thread")

RESTORES = {"hidden": "resid_post", "mlp": "mlp_out", "attn": "attn_out", "hidden_no_mlp": "resid_post",
            "hidden_no_attn": "resid_post"}
FROZEN = {"hidden_no_mlp": "mlp_out", "hidden_no_attn": "attn_out"}


@pytest.fixture(scope="module")
def planted():
    return build_planted_fact_model()


def gpt2_float64(n_layers=3, preset="gpt2-tiny", **extra):
    cfg = ModelConfig.from_preset(preset, n_layers=n_layers, d_model=32, n_heads=4, d_mlp=64, d_vocab=40,
                                  n_ctx=16, **extra)
    return helpers.random_model(cfg, seed=0).double()


def naive_trace(model, tokens, corrupted, metric, kind, window):
    """One full forward per restored state, with plain hooks: the definition, no batching and no shortcuts."""
    _, clean = model.run_with_cache(tokens[None])
    with model.hooks(corrupted.hooks()):
        _, corrupt = model.run_with_cache(corrupted.tokens)
    L, T = model.cfg.n_layers, tokens.shape[0]
    out = torch.empty(L, T, dtype=torch.float64)
    for l in range(L):
        layers = window_layers(l, window, L) if kind in ("mlp", "attn") else [l]
        for p in range(T):
            def restore(act, hook, p=p):
                act = act.clone()
                act[:, p] = clean[hook.name][0, p]
                return act

            def freeze(act, hook):
                return corrupt[hook.name].clone()
            hooks = [(act_name(RESTORES[kind], j), restore) for j in layers]
            if kind in FROZEN:
                hooks += [(act_name(FROZEN[kind], j), freeze) for j in range(l + 1, L)]
            with torch.no_grad():
                logits = model.run_with_hooks(corrupted.tokens, fwd_hooks=corrupted.hooks() + hooks)
            out[l, p] = float(metric(logits))
    return out


@pytest.mark.parametrize("noise, kinds, llama", [
    (Noise(samples=3), KINDS, False), (Noise("uniform", samples=2, seed=4), ["mlp"], False),
    (Noise("replace", replacements=((5, 6), (7, 8), (9, 1))), ["hidden_no_mlp"], False),
    (Noise(samples=2), ["attn", "hidden_no_attn"], True)])  # rotary, grouped-query attention, SwiGLU
def test_batched_sweep_equals_one_restoration_at_a_time_with_hooks(noise, kinds, llama):
    """Every kind (hidden, mlp, attn, both severed) and noise kind: batched == naive to 1e-8 in float64;
    chunks of 3 restorations give the same numbers."""
    model = gpt2_float64(preset="llama-tiny", n_kv_heads=2) if llama else gpt2_float64()
    tokens = torch.randint(0, 40, (6,), generator=torch.Generator().manual_seed(3))
    corrupted = corrupt_positions(model, tokens, [2, 3], noise)
    with torch.no_grad():
        metric = probability(int(model(tokens[None])[0, -1].argmax()))
    run = trace_run(model, tokens, corrupted, metric)
    for kind in kinds:
        window = 2 if kind in ("mlp", "attn") else 1
        batched = restoration_sweep(model, run, kind, window, progress=False)
        threes = restoration_sweep(model, run, kind, window, batch_size=3, progress=False)
        naive = naive_trace(model, tokens, corrupted, metric, kind, window)
        torch.testing.assert_close(batched, naive, atol=1e-8, rtol=0, msg=kind)
        torch.testing.assert_close(threes, naive, atol=1e-8, rtol=0, msg=kind)
        assert (batched - run.corrupt_value).abs().max() > 1e-4, f"{kind}: nothing restored anything (vacuous)"


def test_no_noise_restores_nothing_and_the_whole_state_restores_everything():
    model = gpt2_float64()
    tokens = torch.randint(0, 40, (6,), generator=torch.Generator().manual_seed(1))
    metric = probability(7)
    quiet = trace_run(model, tokens, corrupt_positions(model, tokens, [1, 2], Noise(samples=2), nu=0.0), metric)
    assert quiet.clean_value == pytest.approx(quiet.corrupt_value, abs=1e-12)
    for kind in KINDS:
        values = restoration_sweep(model, quiet, kind, 2, progress=False)
        assert (values - quiet.corrupt_value).abs().max() < 1e-12, kind
    same = trace_run(model, tokens, corrupt_positions(model, tokens, [1, 2], Noise("replace", replacements=(
        tuple(tokens[1:3].tolist()),))), metric)  # replacing the subject by itself
    assert (restoration_sweep(model, same, "hidden", progress=False) - same.corrupt_value).abs().max() < 1e-12
    noisy = trace_run(model, tokens, corrupt_positions(model, tokens, [1, 2], Noise(samples=3)), metric)
    assert abs(noisy.clean_value - noisy.corrupt_value) > 1e-3
    for l in range(model.cfg.n_layers):  # the whole prompt's hidden state restored: indirect = total effect
        assert restore_everything(model, noisy, l) == pytest.approx(noisy.clean_value, abs=1e-10)


def test_the_planted_fact_is_found_where_it_was_planted(planted):
    tok = planted.tokenizer
    trace = causal_trace(planted.model, tok.encode("we met Al at"), "Al", tokenizer=tok, window=1,
                         kinds=["hidden", "mlp", "attn", "hidden_no_mlp"], noise=Noise(samples=5), progress=False)
    s, e = trace.subject
    last, T = len(trace.tokens) - 1, len(trace.tokens)
    assert trace.answer_str == "1" and trace.clean_value > 0.99 and trace.corrupt_value < 0.1
    peak = trace.peak("mlp")
    assert (peak["layer"], peak["pos"]) == (planted.fact_layer, e - 1) and peak["share"] > 0.95
    share = {k: trace.indirect_effect(k) / trace.total_effect for k in trace.values}
    others = [l for l in range(5) if l != planted.fact_layer]
    assert share["mlp"][others].abs().max() < 1e-6  # empty MLPs: restoring them changes nothing
    assert share["hidden"][planted.mover_layer:, last].min() > 0.999  # any hidden state after the fact layer
    assert share["hidden"][:planted.mover_layer, last].abs().max() < 0.01
    assert share["hidden"][:planted.fact_layer + 1, e - 1].min() > 0.95  # the subject's last token, early
    # Severed: with the later MLPs frozen, restoring the subject's last token before the memory gives nothing.
    assert share["hidden_no_mlp"][:planted.fact_layer, e - 1].max() < 0.05
    assert share["hidden_no_mlp"][planted.fact_layer, e - 1] > 0.95
    assert trace.peak("attn")["layer"] == planted.mover_layer and trace.peak("attn")["pos"] == last
    assert T == 12
    json.dumps(trace.to_dict())
    # Moved, the memory is found at its new layer: nothing about the layer is assumed.
    moved = build_planted_fact_model(n_layers=4, fact_layer=1)
    found = causal_trace(moved.model, tok.encode("so Cy is"), "Cy", tokenizer=tok, window=1, kinds=["mlp"],
                         noise=Noise(samples=5), progress=False)
    assert found.answer_str == "3" and found.peak("mlp")["layer"] == 1 and found.peak("mlp")["share"] > 0.95


def test_average_over_prompts_and_replacement(planted):
    tok = planted.tokenizer
    prompts = [p for p, _, _ in planted.prompts()[::5]]  # one template per fact
    subjects = [s for _, s, _ in planted.prompts()[::5]]
    avg = average_causal_trace(planted.model, prompts, subjects, tokenizer=tok, kinds=["mlp"], window=1,
                               noise=Noise(samples=4), progress=False)
    assert len(avg.traces) == 4 and avg.total_effect > 0.8
    peak = avg.peak("mlp")
    assert (peak["layer"], peak["category"]) == (planted.fact_layer, "last subject token") and peak["share"] > 0.9
    assert {t.noise["nu"] for t in avg.traces} == {avg.noise["nu"]}  # one std, measured over all subjects
    json.dumps(avg.to_dict())
    from circuitlab.methods.causal_tracing import average_trace_figure  # also registers the Jupyter displays

    figure = average_trace_figure(avg.to_dict())
    assert figure.panels[0].heatmap.y[2] == "last subject token" and figure.to_plotly() is not None
    assert "plotly" in avg._repr_html_() and "plotly" in avg.traces[0]._repr_html_()
    # Symmetric token replacement: "Bo" in place of "Al" makes the answer "2"; the memory restores "1".
    swap = causal_trace(planted.model, tok.encode("we met Al at"), "Al", tokenizer=tok, kinds=["mlp"], window=1,
                        noise=Noise("replace", replacements=(tuple(tok.encode("Bo")),)), progress=False)
    assert swap.corrupt_value < 0.01 and swap.peak("mlp")["layer"] == planted.fact_layer


def test_other_metrics(planted):
    tok = planted.tokenizer
    diff = causal_trace(planted.model, tok.encode("so Bo is"), "Bo", "2", tokenizer=tok, kinds=["mlp"], window=1,
                        metric="logit_diff", wrong="3", noise=Noise(samples=2), progress=False)
    assert diff.metric == "logit_diff" and diff.clean_value == pytest.approx(10.0, abs=1e-4)  # out = 10 x one-hot
    assert diff.peak("mlp")["layer"] == planted.fact_layer
    logp = causal_trace(planted.model, tok.encode("so Bo is"), (3, 5), tokenizer=tok, kinds=["mlp"], window=1,
                        metric="logprob", noise=Noise(samples=2), progress=False)
    assert logp.metric == "logprob" and logp.answer_str == "2" and logp.clean_value < 0
    with pytest.raises(InputError, match="needs a wrong answer"):
        causal_trace(planted.model, tok.encode("so Bo is"), "Bo", tokenizer=tok, metric="logit_diff")
    with pytest.raises(InputError, match="outside the vocabulary"):
        causal_trace(planted.model, tok.encode("so Bo is"), "Bo", 999, tokenizer=tok)


def test_windows():
    assert default_window(48) == 10 and default_window(5) == 1 and default_window(12) == 2
    assert list(window_layers(0, 10, 48)) == list(range(0, 5))
    assert list(window_layers(20, 10, 48)) == list(range(15, 25))
    assert list(window_layers(47, 10, 48)) == list(range(42, 48))
    assert list(window_layers(3, 1, 5)) == [3]


def test_noise_has_the_asked_scale():
    model = gpt2_float64()
    tokens = torch.arange(10)
    for kind in ("gaussian", "uniform"):
        c = corrupt_positions(model, tokens, [4, 5, 6], Noise(kind, scale=2.0, samples=200, std=0.5))
        assert c.nu == 1.0 and c.offsets[:, 4:7].std().item() == pytest.approx(1.0, rel=0.03)
        assert c.offsets[:, :4].abs().max() == 0 and c.offsets[:, 7:].abs().max() == 0
    again = corrupt_positions(model, tokens, [4], Noise(samples=2, seed=9, std=1.0))
    assert torch.equal(again.offsets, corrupt_positions(model, tokens, [4], Noise(samples=2, seed=9, std=1.0)).offsets)


def test_bad_input_is_one_line(planted):
    tok, model = planted.tokenizer, planted.model
    ids = tok.encode("so Al is")
    with pytest.raises(InputError, match=r"subject 'Bo' is not in the prompt; the prompt's tokens are: 's', 'o', "):
        causal_trace(model, ids, "Bo", tokenizer=tok)
    with pytest.raises(InputError, match="window of 6 layers is wider than the model \\(5 layers\\)"):
        causal_trace(model, ids, "Al", tokenizer=tok, window=6)
    for bad in (float("nan"), float("inf"), 0.0, -1.0, 1001.0):
        with pytest.raises(InputError, match="noise scale must be a number from above 0 to 1000"):
            causal_trace(model, ids, "Al", tokenizer=tok, noise=Noise(scale=bad))
    with pytest.raises(InputError, match="give at most .* noise samples"):
        causal_trace(model, ids, "Al", tokenizer=tok, noise=Noise(samples=10**12))
    with pytest.raises(InputError, match="as many tokens as the corrupted span"):
        causal_trace(model, ids, "Al", tokenizer=tok, noise=Noise("replace", replacements=((1, 2, 3),)))
    with pytest.raises(InputError, match="needs MLPs"):
        attn_only = helpers.random_model(ModelConfig.from_preset("attn-only-2l", d_model=16, n_heads=2, d_vocab=40,
                                                                 n_ctx=16))
        causal_trace(attn_only, [1, 2, 3], (0, 1), kinds=["mlp"])
    assert subject_span([4, 5, 6, 7], [6, 7]) == (2, 4) and subject_span([4, 5, 6], (0, 2)) == (0, 2)
    with pytest.raises(InputError, match=r"subject tokens \[9\] are not in the prompt; .*: 4, 5, 6"):
        subject_span([4, 5, 6], [9])


def test_interpret_causal_tracing_on_the_planted_fact(planted, tmp_path, capsys):
    """`circuitlab interpret --experiments causal_tracing` end to end: results.json, the PNG of the three
    panels (plus the severed trace) in report.md, and the interactive figure in report.html."""
    from circuitlab.cli import main
    from circuitlab.training import save_checkpoint
    from circuitlab.methods.causal_tracing import causal_trace_figure

    save_checkpoint(tmp_path / "facts", planted.model, planted.tokenizer)
    out = tmp_path / "tracing"
    assert main(["interpret", "--checkpoint", str(tmp_path / "facts"), "--experiments", "causal_tracing",
                 "--prompt", "then Di had", "--subject", "Di", "--noise-samples", "4", "--out", str(out)]) == 0
    found = json.loads((out / "results.json").read_text())["causal_tracing"]
    trace = found["trace"]
    assert trace["answer_str"] == "4" and trace["subject"] == [5, 7] and trace["window"] == 1
    assert set(trace["values"]) == {"hidden", "mlp", "attn", "hidden_no_mlp"}
    assert trace["peaks"]["mlp"]["layer"] == planted.fact_layer and trace["peaks"]["mlp"]["pos"] == 6
    assert trace["peaks"]["mlp"]["share"] > 0.95
    assert "![causal_tracing](causal_tracing.png)" in (out / "report.md").read_text()
    assert (out / "causal_tracing.png").stat().st_size > 1000
    html = (out / "report.html").read_text()
    assert "Causal tracing" in html and "MLP outputs (window of 1 layer)" in html
    spec = causal_trace_figure(trace)
    assert [p.name for p in spec.panels] == ["hidden", "mlp", "attn", "hidden_no_mlp"]
    assert spec.panels[0].heatmap.y[5:7] == ["5 D*", "6 i*"] and spec.panels[1].heatmap.scale == "Greens"
    # issue 40: a bad argument moved the previous results aside, then failed. Every one is refused first.
    before = (out / "results.json").read_text()
    base = ["interpret", "--checkpoint", str(tmp_path / "facts"), "--out", str(out)]
    n = planted.model.cfg.n_layers
    for extra, said in (
            (["--experiments", "causal_tracing", "--prompt", "then Di had", "--subject", "Di", "--window", str(n + 1)],
             f"a window of {n + 1} layers is wider than the model"),
            (["--experiments", "causal_tracing", "--prompt", "then Di had", "--subject", "Zo"], "is not in the prompt"),
            (["--experiments", "causal_tracing", "--prompt", "then Di had", "--subject", "Di", "--replace-with", "Bo"],
             "--replace-with goes with --noise replace"),
            (["--experiments", "patching", "--clean", "then Di had", "--corrupt", "then"], "token"),
            (["--experiments", "logit_lens", "--prompt", ""], "the prompt is empty")):
        capsys.readouterr()
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, (extra, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["facts", "tracing"], extra   # nothing set aside
        assert (out / "results.json").read_text() == before


@pytest.mark.slow
def test_interpret_defaults_and_all_experiments_without_a_subject(planted, tmp_path):
    from circuitlab.experiments.interpret import available_experiments

    EXPERIMENTS = available_experiments()
    short = build_planted_fact_model(n_ctx=24)  # the default story's last 24 characters hold no "Lily"
    found = EXPERIMENTS["causal_tracing"](short.model, short.tokenizer, tmp_path, {"noise_samples": 2})
    assert found.to_dict()["trace"]["subject"] == [0, 1] and any("does not fit the context" in s for s in found.summary)
    with pytest.raises(InputError, match="needs --subject"):
        EXPERIMENTS["causal_tracing"](planted.model, planted.tokenizer, tmp_path, {"prompt": "so Al is"})


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_activation_patching_with_a_noise_corruption(direction):
    """Noised(...) in place of a corrupted prompt: batched == one patch at a time with plain hooks in every
    noise run (per-prompt answers, two prompts), and the resid_post sweep is causal tracing's hidden panel."""
    from circuitlab.analysis.patching import TARGETS, Noised, logit_diff, patching_sweep

    model = gpt2_float64()
    clean = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(5))
    noised = Noised((1, 2), Noise(samples=2))
    metric = logit_diff([3, 4], [5, 6])
    res = patching_sweep(model, clean, noised, metric, ["resid_post", "head_out"], direction=direction,
                         progress=False)
    corrupted = corrupt_positions(model, clean, [1, 2], noised.noise)
    _, clean_cache = model.run_with_cache(clean)
    with model.hooks(corrupted.hooks()):
        _, noised_cache = model.run_with_cache(corrupted.tokens)
    for name in ("resid_post", "head_out"):
        t = TARGETS[name]
        naive = torch.empty_like(res[name].values)
        for l in range(model.cfg.n_layers):
            hook = act_name(t.hook, l)
            source = clean_cache[hook].repeat(2, *[1] * (clean_cache[hook].dim() - 1)) if direction == "denoise" \
                else noised_cache[hook]
            for i in range(naive.shape[1]):
                def patch(act, hook, i=i, source=source):
                    act = act.clone()
                    act[(slice(None),) + (slice(None),) * t.dims[0] + (i,)] = \
                        source[(slice(None),) + (slice(None),) * t.dims[0] + (i,)]
                    return act
                extra = corrupted.hooks() if direction == "denoise" else []
                with torch.no_grad():
                    logits = model.run_with_hooks(corrupted.tokens if direction == "denoise" else clean.repeat(2, 1),
                                                  fwd_hooks=extra + [(hook, patch)])
                naive[l, i] = sum(float(metric(chunk)) for chunk in logits.chunk(2)) / 2
        torch.testing.assert_close(res[name].values, naive, atol=1e-8, rtol=0, msg=name)
        assert (res[name].values - res[name].base_value).abs().max() > 1e-3
    if direction == "denoise":
        from circuitlab.analysis.patching import probability

        one = clean[0]
        answer = int(model(one[None])[0, -1].argmax())
        trace = causal_trace(model, one, (1, 3), answer, kinds=["hidden"], noise=noised.noise, progress=False)
        swept = patching_sweep(model, one, noised, probability(answer), ["resid_post"], progress=False)
        torch.testing.assert_close(swept["resid_post"].values, trace.values["hidden"], atol=1e-10, rtol=0)
    with pytest.raises(InputError, match="noised positions \\[7\\] must be some of the prompt's positions 0..5"):
        patching_sweep(model, clean, Noised((7,)), metric, ["resid_post"], progress=False)


@pytest.mark.parametrize("kind", ["hidden", "mlp", "hidden_no_mlp"])
def test_a_narrowed_trace_equals_the_full_one_where_it_traces(kind):
    """float64: tracing only some layers and positions gives the full sweep's values there (the restored layer,
    the restored position, the first position after it) and NaN elsewhere; positions before the subject are the
    corrupted value; counted from the end, -1 is the last position."""
    model = gpt2_float64(n_layers=4)
    tokens = torch.randint(0, 40, (7,), generator=torch.Generator().manual_seed(2))
    run = trace_run(model, tokens, corrupt_positions(model, tokens, [2, 3], Noise(samples=3)), probability(5))
    full = restoration_sweep(model, run, kind, 2, progress=False)
    part = restoration_sweep(model, run, kind, 2, progress=False, layers=[1, 3], positions=[0, 3, 4, 6])
    rows, cols = [1, 3], [0, 3, 4, 6]
    torch.testing.assert_close(part[rows][:, cols], full[rows][:, cols], atol=1e-12, rtol=0)
    assert (part[rows][:, 0] == run.corrupt_value).all()
    mask = torch.ones_like(part, dtype=torch.bool)
    mask[torch.tensor(rows)[:, None], torch.tensor(cols)[None]] = False
    assert part[mask].isnan().all()
    trace = causal_trace(model, tokens, (2, 4), 5, kinds=[kind], window=2, noise=Noise(samples=3), progress=False,
                         layers=[3, 1], positions=[-1, 3])
    assert trace.values[kind][[1, 3]][:, [3, 6]].isfinite().all() and trace.values[kind].isnan().sum() == 28 - 4
    assert trace.peak(kind)["layer"] in (1, 3) and trace.peak(kind)["pos"] in (3, 6)
    with pytest.raises(InputError, match=r"^position\(s\) 7 out of range: the prompt has 7 tokens"):
        causal_trace(model, tokens, (2, 4), positions=[7])
    with pytest.raises(InputError, match=r"^layer\(s\) 4 out of range: the model has 4 layers"):
        causal_trace(model, tokens, (2, 4), layers=[4])
