"""What a run contributes: the report labels a small model's heads itself, and leaves a large one's to the heads
experiment (classify_heads took some 200 s of SmolLM2's 220 s report), saying so."""
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.report import RunData, build_sections
from circuitlab.report.html import render_html
from circuitlab.report.runs import MOST_HEADS_LABELLED, compute_heads


def model(n_heads: int) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("attn-only-2l", d_model=2 * n_heads, n_heads=n_heads, d_vocab=32, n_ctx=16)
    return Transformer(cfg).eval()


def test_a_small_models_heads_are_labelled_here():
    run = RunData("small", model=model(2))
    compute_heads(run)
    assert run.unlabelled is None and run.heads is not None and len(run.heads) == 4 and run.classes is not None


def test_a_large_models_heads_are_left_to_the_heads_experiment(monkeypatch):
    import circuitlab.analysis.heads as heads

    def refuse(*args, **kwargs):
        raise AssertionError("classify_heads must not run in the report of a model this size")

    monkeypatch.setattr(heads, "classify_heads", refuse)
    big = model(MOST_HEADS_LABELLED // 2 + 1)  # 2 layers: one head over the bound
    run = RunData("big", model=big)
    sections = {s.id: s for s in build_sections([run])}
    assert run.heads is None and "--experiments heads" in (run.unlabelled or "")
    page = render_html(list(sections.values()))
    assert "not labelled here" in page and "--experiments circuits" in page
    assert {"heads", "attention", "circuits"} <= set(sections)  # the viewer still shows every head
    assert all(isinstance(p, str) for p in sections["circuits"].parts)  # a note, no arbitrary head's circuits


def test_the_bound_is_inclusive():
    run = RunData("edge", model=model(MOST_HEADS_LABELLED // 2))
    compute_heads(run)
    assert run.unlabelled is None and len(run.heads or []) == MOST_HEADS_LABELLED
