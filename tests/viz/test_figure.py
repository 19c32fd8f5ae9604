"""One definition per figure: every view is a FigureSpec, and the plotly renderer (report.html, serve,
Jupyter) and the matplotlib renderer (report.md PNGs) draw the same data from it."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.analysis.ablation import AblationResult
from circuitlab.analysis.logit_attribution import direct_logit_attribution
from circuitlab.analysis.patching.attribution_patching import AttributionCheck
from circuitlab.analysis.heads import attention_view, classify_heads
from circuitlab.analysis.lens import logit_lens
from circuitlab.analysis.patching.path import PathPatchResult
from circuitlab.analysis.patching import PatchResult
from circuitlab.analysis.probing import ProbeResult
from circuitlab.analysis.steering import SteeringSweep, SteeringVector
from circuitlab.viz import edges, features, heads, lens, patching, probing, qk_ov, steering, training
from circuitlab.viz.png import draw
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, Series, lines_figure


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=2, d_vocab=64, n_ctx=32)).eval()


def every_view(model) -> dict[str, FigureSpec]:
    tokens = torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens[None])
    classes = classify_heads(model)
    patch = PatchResult("head_out", ("head",), [0, 1], torch.rand(2, 2), 1.0, 0.0)
    by_pos = PatchResult("head_out_by_pos", ("pos", "head"), [0, 1], torch.rand(2, 4, 2), 2.0, 0.0)
    probe = ProbeResult("repeat", ["L0", "L1", "out"], "accuracy", torch.rand(3), torch.rand(3), torch.rand(3),
                        0.5, 10, 10)
    records = [{"step": s, "tokens": 100 * s, "loss": 3.0 - 0.1 * s, "repeat_loss": 2.0, "icl": -0.1 * s,
                "induction": [[0.1], [0.1 * s]], "prev_token": [[0.5], [0.1]]} for s in range(8)]
    sweep = {"periods": [4, 5, 6], "best": [0.9, 0.8, 0.7], "best_head": ["L1H0"] * 3, "loss_first": [4.0] * 3,
             "loss_second": [1.0, 1.5, 2.0]}
    steer = SteeringSweep([-1.0, 0.0, 1.0], torch.tensor([-0.2, 0.0, 0.3]), torch.tensor([3.1, 3.0, 3.2]),
                          SteeringVector(torch.ones(32), "blocks.0.hook_resid_post"))
    comp = classes.composition
    return {
        "attention": heads.attention_patterns_figure(attention_view(model, tokens, labels=classes)),
        "head scores": heads.head_scores_figure(classes.scores.scores, classes=classes),
        "training curves": training.training_curves_figure({"2l": records}, {"2l": {"step": 4, "tokens": 400}}),
        "induction by period": training.induction_by_period_figure({"2l": sweep}),
        "circuit": qk_ov.qk_ov_figure(torch.randn(4, 4), list("abca"), list("wxyz"), "QK"),
        "copying": qk_ov.copying_scores_figure(classes.copying.scores),
        "composition": qk_ov.composition_figure({m: getattr(comp, m) for m in "qkv"}, comp.baseline_mean, 0.01),
        "logit lens": lens.logit_lens_figure(logit_lens(model, tokens, k=3)),
        "logit attribution": lens.logit_attribution_figure(direct_logit_attribution(model, cache, answer=3, wrong=4)),
        "patching": patching.patching_figure(patch.to_dict()),
        "patching by position": patching.patching_figure(by_pos, tokens=list("abcd")),
        "attribution vs patching": patching.attribution_vs_patching_figure(
            AttributionCheck({"head_out": 0.9}, {"head_out": patch}, {"head_out": patch})),
        "path patching": patching.path_patching_figure(
            [PathPatchResult((1, 0), inp, torch.rand(2, 2), 1.0, 0.0) for inp in "qkv"]),
        "ablation by head": patching.ablation_figure(AblationResult("head", "mean", [0, 1], torch.rand(2, 2), 0.5)),
        "ablation by layer": patching.ablation_figure(
            AblationResult("mlp", "mean", [0, 1], torch.rand(2), 0.5).to_dict()),
        "probes": probing.probe_figure({"repeat": probe.to_dict()}),
        "steering": steering.steering_figure(steer),
        "steering from its JSON": steering.steering_figure(steer.to_dict()),
        "lines": lines_figure(["embed", "L0", "L1"], {"logit lens": [3.0, 2.0, 0.0], "tuned lens": [1.0, 0.5, 0.0]},
                              "KL by layer", category=True),
        "faithfulness": edges.faithfulness_figure({"EAP": {"fractions": [0.01, 0.1, 1.0], "n_edges": [1, 10, 100],
                                                           "faithfulness": [0.2, 0.85, 1.0], "cpr": 0.9, "cmd": 0.1}}),
        "feature density": features.density_figure(SimpleNamespace(
            all_density=torch.tensor([0.0, 0.01, 0.02, 0.5, 0.001]), n_tokens=1000, d_sae=5)),
    }


def _same(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and np.allclose(a, b, atol=1e-4, equal_nan=True)


def test_every_view_renders_both_ways_from_one_spec(model, tmp_path):
    views = every_view(model)
    assert views["patching"].save_png(tmp_path / "patching.png").read_bytes()[:4] == b"\x89PNG"
    for name, spec in views.items():
        fig, drawn = spec.to_plotly(), draw(spec)  # the PNG's artists, not rasterised (slow, and checked above)
        heatmaps = [p.heatmap for p in spec.panels if p.heatmap is not None]
        series = [s for p in spec.panels for s in p.series]
        traces = list(fig.data)
        assert len(traces) == len(heatmaps) + len(series), name
        axes = [ax for ax in drawn.axes if ax.images or ax.lines or ax.patches]  # colour bars hold none of these
        for h, trace in zip(heatmaps, traces):
            assert _same(trace.z, h.z), f"{name}: plotly heatmap differs from the spec"
        images = [ax.images[0].get_array().filled(np.nan) for ax in axes if ax.images]
        assert len(images) == len(heatmaps) and all(_same(i, h.z) for i, h in zip(images, heatmaps)), name
        for s, trace in zip(series, traces[len(heatmaps):]):
            drawn_y = trace.x if s.kind == "hbar" else trace.y
            assert _same([np.nan if v is None else v for v in drawn_y], [np.nan if v is None else v for v in s.y]), name
        lines = [line.get_ydata() for ax in axes for line in ax.lines]
        for s in series:
            if s.kind in ("line", "markers", "line+markers"):
                y = [np.nan if v is None else v for v in s.y]
                assert any(_same(drawn_y, y) for drawn_y in lines), f"{name}: {s.name!r} not drawn in the PNG"
            else:
                bars = [abs(p.get_width() if s.kind == "hbar" else p.get_height()) for ax in axes for p in ax.patches]
                assert all(any(abs(abs(v) - b) < 1e-6 for b in bars) for v in s.y), name


def test_a_menu_opens_on_its_active_panel_and_a_png_shows_every_panel(model):
    view = attention_view(model, torch.arange(6))
    spec = heads.attention_patterns_figure(view, active="L1H1", heads=["L0H0", "L1H1"])
    assert [p.name for p in spec.panels] == ["L0H0", "L1H1"] and spec.active == 1
    fig = spec.to_plotly()
    assert [t.visible for t in fig.data] == [False, True] and fig.layout.title.text == "Attention pattern: L1H1"
    assert sum(bool(ax.images) for ax in draw(spec).axes) == 2


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="labels"):
        Heatmap(np.zeros((2, 3)), ["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match="colour scale"):
        Heatmap(np.zeros((1, 1)), ["a"], ["x"], scale="Jet")
    with pytest.raises(ValueError, match="panel"):
        FigureSpec([])
    assert FigureSpec([Panel(series=[Series([1, 2], [None, 3.0])])]).to_plotly().data[0].y == (None, 3.0)
