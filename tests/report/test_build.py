"""The interactive figures, Jupyter display and the self-contained report.html (train, interpret, demo)."""
import json
import math
import re

import numpy as np
import pytest
import torch

import helpers

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.analysis.logit_attribution import direct_logit_attribution
from circuitlab.analysis.heads import AttentionPatterns, attention_view
from circuitlab.analysis.lens import logit_lens
from circuitlab.analysis.patching import PatchResult
from circuitlab.analysis.probing import ProbeResult
from circuitlab.cli import main
from circuitlab.report import RunData, report_for_run, write_demo_report
from circuitlab.viz import interactive as I
from circuitlab.viz import notebook as N

TINY_RUN = """\
name: tiny-report
model: {preset: attn-only-2l, d_model: 32, n_heads: 2}
data: {source: stories, n_stories: 150, tokenizer: char, random_segment_frac: 0.5, cache_dir: CACHE}
train: {steps: 6, batch_size: 8, seq_len: 32, lr: 3.0e-3, warmup_steps: 2, eval_every: 3, eval_batches: 1,
        ckpt_every: 6, track_every: 2, log_every: 1}
"""


class CharTokenizer:
    vocab_size, eos_id = 64, 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 64 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i + 32) for i in ids)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=2, d_vocab=64, n_ctx=32)).eval()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny run trained by `circuitlab train`, which writes report.html after training."""
    root = tmp_path_factory.mktemp("report")
    config = root / "tiny.yaml"
    config.write_text(TINY_RUN.replace("CACHE", str(root / "cache")))
    assert main(["train", "--config", str(config), "--out", str(root / "run"), "--no-progress"]) == 0
    return root / "run"


def outside_plotlyjs(page: str) -> str:
    from circuitlab.report.html import plotly_js

    assert page.count(plotly_js()) == 1, "plotly.js must be inlined exactly once"
    return page.replace(plotly_js(), "")


def section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', page)


def assert_self_contained(page: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "no external scripts"
    assert not re.search(r"<link[^>]*\bhref\s*=", page), "no external stylesheets"
    assert not re.search(r"https?://", outside_plotlyjs(page)), "no network references outside plotly.js"


# ---------------------------------------------------------------------------- figures


def test_attention_figure_one_trace_per_head_with_hover_tokens():
    tokens = ["The", " cat", " sat", " The", " cat", "<b>"]
    patterns = torch.softmax(torch.randn(2, 3, 6, 6), dim=-1)
    fig = I.attention_figure(tokens, patterns, labels={"L1H2": "induction"}).to_plotly()
    assert len(fig.data) == 6 and [t.name for t in fig.data] == [f"L{l}H{h}" for l in range(2) for h in range(3)]
    assert [t.visible for t in fig.data] == [True] + [False] * 5
    z = np.asarray(fig.data[4].z)  # L1H1
    assert z.shape == (6, 6)
    assert np.isnan(z[np.triu_indices(6, 1)]).all(), "keys after the query are blank"
    assert np.allclose(z[np.tril_indices(6)], patterns[1, 1][np.tril_indices(6)].numpy(), atol=1e-4)
    hover = fig.data[0].hovertemplate
    assert "query: %{y}" in hover and "key: %{x}" in hover and "weight: %{z:.3f}" in hover
    assert fig.data[0].y[1] == "␣cat (pos 1)" and fig.data[0].x[4] == "␣cat (pos 4)"  # repeated tokens stay apart
    assert fig.data[0].y[5] == "&lt;b&gt; (pos 5)"  # escaped for plotly's hover HTML
    (menu,) = fig.layout.updatemenus
    assert len(menu.buttons) == 6 and menu.buttons[5].label == "L1H2 (induction)"
    assert menu.buttons[5].args[0]["visible"] == [False] * 5 + [True]
    assert "L1H2 (induction)" in menu.buttons[5].args[1]["title.text"]
    flat = I.attention_figure(tokens, patterns.reshape(6, 6, 6), head_names=list("abcdef"), active="e").to_plotly()
    assert [t.name for t in flat.data] == list("abcdef") and [t.visible for t in flat.data][4]
    assert flat.layout.updatemenus[0].active == 4 and flat.layout.title.text == "Attention pattern: e"
    with pytest.raises(ValueError, match="head names"):
        I.attention_figure(tokens, patterns.reshape(6, 6, 6), head_names=["a"]).to_plotly()


def test_figures_from_result_objects_and_their_dicts(model):
    tokens = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0))
    lens = logit_lens(model, tokens, k=3, tokenizer=CharTokenizer())
    for spec in (I.logit_lens_figure(lens), I.logit_lens_figure(json.loads(json.dumps(lens.to_dict())))):
        fig = spec.to_plotly()
        assert np.asarray(fig.data[0].z).shape == (3, 12) and len(fig.data[0].y) == 3
    _, cache = model.run_with_cache(tokens[None])
    dla = direct_logit_attribution(model, cache, answer=3, wrong=4)
    bars = I.logit_attribution_figure(dla, n=4).to_plotly()
    assert len(bars.data[0].y) == 4 and "logit difference" in bars.layout.xaxis.title.text
    assert list(I.logit_attribution_figure(dla.to_dict(), n=4).to_plotly().data[0].y) == list(bars.data[0].y)
    two_d = PatchResult("resid_pre", ("pos",), [0, 1], torch.tensor([[0.0, 1.0, 0.5], [1.0, 0.0, 0.0]]), 1.0, 0.0)
    fig = I.patching_figure(two_d.to_dict(), tokens=["a", "b", "a"]).to_plotly()
    assert np.allclose(np.asarray(fig.data[0].z), two_d.recovery().numpy()) and len(set(fig.data[0].x)) == 3
    three_d = PatchResult("head_out_by_pos", ("pos", "head"), [0, 1], torch.rand(2, 5, 3), 2.0, 0.0)
    fig = I.patching_figure(three_d).to_plotly()
    assert len(fig.data) == 2 and np.asarray(fig.data[0].z).shape == (3, 5)  # heads down, positions across
    probe = ProbeResult("repeat", ["L0", "L1", "out"], "accuracy", torch.rand(3), torch.rand(3), torch.rand(3),
                        0.5, 10, 10)
    assert len(I.probe_figure(probe).to_plotly().data) == 3
    assert len(I.probe_figure({"x": probe.to_dict()}).to_plotly().data) == 3
    heat = I.heatmap_figure(torch.tensor([[1.0, float("nan")], [-2.0, 0.5]]), ["a", "a"], ["x", "y"], "t").to_plotly()
    assert list(heat.data[0].y) == ["a", "a #2"] and heat.data[0].zmin == -2.0 and heat.data[0].zmax == 2.0


def test_training_curves_mark_the_phase_change():
    records = [{"step": s, "tokens": 100 * s, "loss": 3.0 - 0.1 * s, "repeat_loss": 2.0,
                "induction": [[0.05], [0.05 + (0.8 if s >= 6 else 0.1 * s / 6)]], "prev_token": [[0.6], [0.1]]}
               for s in range(10)]
    fig = I.training_curves_figure({"2l": records}, {"2l": {"step": 6, "tokens": 600}}).to_plotly()
    names = [t.name for t in fig.data]
    assert "2l best induction score" in names and "2l loss on repeated tokens" in names
    best = next(t for t in fig.data if t.name == "2l best induction score")
    assert math.isclose(best.y[-1], 0.85)
    kinds = sorted(s.type for s in fig.layout.shapes)
    assert kinds.count("line") == 2 and kinds.count("rect") == 2  # a line and a band on both panels
    assert any(s.type == "line" and s.x0 == 600 for s in fig.layout.shapes)
    assert not I.training_curves_figure(records).to_plotly().layout.shapes  # no phase change given: nothing marked


# ---------------------------------------------------------------------------- Jupyter


def test_repr_html_is_the_interactive_view(model, monkeypatch):
    monkeypatch.setattr(N, "NOTEBOOK_PLOTLYJS", "once")
    N.reset_notebook()
    view = attention_view(model, "abcabc", CharTokenizer())
    assert isinstance(view, AttentionPatterns) and view.patterns.shape == (2, 2, 6, 6)
    assert view.head_names == ["L0H0", "L0H1", "L1H0", "L1H1"] and view.tokens[0] == "A"
    first, second = view._repr_html_(), view._repr_html_()
    assert all(name in first and name in second for name in view.head_names)
    assert len(first) > 1_000_000 > len(second)  # plotly.js inlined once, then reused
    assert "window.Plotly" in second and not re.search(r"<script[^>]*\bsrc", first + second)
    monkeypatch.setattr(N, "NOTEBOOK_PLOTLYJS", "always")
    assert len(view._repr_html_()) > 1_000_000
    lens = logit_lens(model, torch.arange(8), k=2)
    assert "Logit lens" in lens._repr_html_()
    patch = PatchResult("head_out", ("head",), [0, 1], torch.rand(2, 2), 1.0, 0.0)
    assert "head_out" in patch._repr_html_()
    with pytest.raises(CircuitlabError, match="tokenizer"):
        attention_view(model, "abc")


# ---------------------------------------------------------------------------- report.html


def test_train_writes_a_self_contained_report(run_dir):
    page = (run_dir / "report.html").read_text()
    assert_self_contained(page)
    assert section_ids(page) == ["model-card", "training", "heads", "attention", "circuits"]
    for missing in ("logit-lens", "attribution", "patching", "probes"):
        assert f'id="{missing}"' not in page
    assert "tokens seen" in page and "non-embedding parameters" in page and "L1H1" in page
    assert page.count("Plotly.newPlot(") >= 5


def test_report_keeps_to_what_the_directory_has(run_dir, tmp_path):
    (tmp_path / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
    page = report_for_run(tmp_path).read_text()
    assert section_ids(page) == ["model-card", "training"]
    assert_self_contained(page)
    quick = report_for_run(run_dir, tmp_path / "quick.html", analyse=False).read_text()
    assert section_ids(quick) == ["model-card", "training"]  # no model loaded: no heads, attention, circuits
    (tmp_path / "empty").mkdir()
    with pytest.raises(CircuitlabError, match="no checkpoint"):
        report_for_run(tmp_path / "empty")


def test_interpret_writes_report_html(run_dir, tmp_path):
    out = tmp_path / "interp"
    assert main(["interpret", "--checkpoint", str(run_dir), "--experiments", "logit_lens", "attribution",
                 "--prompt", "Tom saw a cat. Tom saw a", "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    ids = section_ids(page)
    assert {"model-card", "training", "logit-lens", "attribution", "attention", "circuits"} <= set(ids)
    assert "patching" not in ids and "probes" not in ids
    assert ids.index("logit-lens") < ids.index("attribution")
    assert "Tom saw a cat" in page
    # report_for_run on the interpret output rebuilds the same sections from results.json.
    assert section_ids(report_for_run(out, tmp_path / "again.html").read_text()) == ids


def test_demo_report_from_results(tmp_path):
    """The demo's report.html renders its results and its models' HeadClasses: nothing is parsed back
    from report.md or from evidence strings (a stale report.md beside it must not leak in)."""
    from circuitlab.analysis.heads import classify_heads
    from circuitlab.forge import build_induction_model

    model = build_induction_model(d_vocab=20, n_ctx=32).model
    classes = classify_heads(model)
    assert classes.heads_with("induction") == [(1, 0)]
    heads = [{"head": f"L{l}H{h}", "layer": l, "index": h, "induction_score": 0.9 if (l, h) == (1, 0) else 0.1,
              "prev_token_score": 0.8 if (l, h) == (0, 0) else 0.1, "copying_score": 0.7,
              "labels": ["induction"] if (l, h) == (1, 0) else []} for l in range(2) for h in range(2)]
    results = {"models": {"2l": {"steps": 6, "tokens_seen": 1536, "best_val_loss": 1.5, "heads": heads,
                                 "induction_heads": ["L1H0"], "induction_evidence": ["L1H0 induction: (from results)"],
                                 "rejected": [], "previous_token_heads": ["L0H0"], "phase_change": None}},
               "analysis": {}, "causal_evidence": {}}
    (tmp_path / "report.md").write_text("# demo\n\nSTALE NARRATIVE\n\n## Heads\n\n| x |\n")
    tokenizer = type("Tok20", (CharTokenizer,), {"vocab_size": 20, "encode": lambda s, t: [ord(c) % 20 for c in t]})()
    run = RunData("2l", model=model, tokenizer=tokenizer, classes=classes)
    page = write_demo_report(tmp_path, results, {"2l": run}).read_text()
    assert section_ids(page) == ["model-card", "summary", "heads", "attention", "circuits"]
    assert "STALE NARRATIVE" not in page and "## Heads" not in page
    assert "<strong>Induction heads:</strong> L1H0" in page and "(from results)" in page  # the narrative
    label = next(lab for lab in classes.labels if lab.name == "L1H0" and lab.label == "induction")
    check = label.evidence[0].to_dict()
    assert esc_text(f"{check['check']} {check['value']:.3f} (threshold") in page  # the evidence, from the classes
    assert "L1H0 QK circuit via L0H0" in page  # the labelled head and its previous-token head
    assert "2l attention: L1H0 (induction, copying)" in page  # the viewer opens on the induction head, labelled


def esc_text(s: str) -> str:
    import html

    return html.escape(s)


# ---------------------------------------------------------------------------- in a real browser


@pytest.mark.e2e
def test_report_renders_offline_in_a_browser(run_dir):
    """Headless Chromium (skipped without selenium / chromium / chromedriver): every figure draws from
    the file alone, the dropdown switches heads, hovering a cell shows query, key and weight."""
    driver = helpers.headless_chromium()  # skips, saying why, without selenium or a browser
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        driver.get((run_dir / "report.html").as_uri())
        n_figs = driver.execute_script("return document.querySelectorAll('.figure > div').length")
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script("return document.querySelectorAll('.figure .main-svg').length > 0 && "
                                       "[...document.querySelectorAll('.figure > div')].every(e => e._fullLayout)"))
        assert n_figs >= 5
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        # The attention viewer: pick L1H1 from the menu, then hover query 5, key 2.
        state = driver.execute_script("""
            const div = document.querySelector('#attention .figure > div');
            const names = div.data.map(t => t.name);
            const i = names.indexOf('L1H1');
            const args = div._fullLayout.updatemenus[0].buttons[i].args;
            return Plotly.update(div, args[0], args[1]).then(() => {
                div.scrollIntoView();
                Plotly.Fx.hover(div, {xval: 2, yval: 5});
                return {visible: div.data.map(t => t.visible), title: div.layout.title.text, names: names};
            });
        """)
        i = state["names"].index("L1H1")
        assert [v is True for v in state["visible"]] == [j == i for j in range(len(state["names"]))]
        assert "L1H1" in state["title"]
        text = WebDriverWait(driver, 10).until(lambda d: d.execute_script(
            "return [...document.querySelectorAll('#attention .hoverlayer text')].map(t => t.textContent).join(' ')"))
        assert re.search(r"L1H1.*query: .* \(pos 5\)key: .* \(pos 2\)weight: \d\.\d{3}", text), text
    finally:
        driver.quit()


def test_model_card_gives_resolved_head_and_mlp_sizes():
    from circuitlab.report.sections import model_card_section

    model = Transformer(ModelConfig.from_preset("gpt2-tiny", d_vocab=40, n_ctx=16))  # d_head, d_mlp left None
    card = "".join(p for p in model_card_section([RunData("m", model=model,
                                                          model_config=model.cfg.to_dict())]).parts
                   if isinstance(p, str))
    assert "4 heads of 32" in card and "MLP 512 (gelu_new)" in card


def test_interpret_keeps_earlier_results_apart_and_refuses_another_runs_folder(run_dir, tmp_path, capsys):
    out = tmp_path / "interp"
    args = ["interpret", "--checkpoint", str(run_dir), "--prompt", "Tom saw a cat. Tom saw a", "--out", str(out)]
    assert main([*args, "--experiments", "logit_lens", "attribution"]) == 0
    first = sorted(p.name for p in out.iterdir())
    assert main([*args, "--experiments", "logit_lens"]) == 0  # fewer experiments: no figure of the first run stays
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("interp.")]
    assert len(kept) == 1 and sorted(p.name for p in kept[0].iterdir()) == first
    assert json.loads((out / "results.json").read_text())["experiments"] == ["logit_lens"]
    assert "moved the previous results to" in capsys.readouterr().out
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "report.html").write_text("the demo's")
    assert main([*args[:-1], str(demo), "--experiments", "logit_lens"]) == 2
    assert "already holds other files (report.html)" in capsys.readouterr().err
    assert [p.name for p in demo.iterdir()] == ["report.html"]
