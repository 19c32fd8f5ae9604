"""The demo: watch induction heads form.

Trains a 2-layer attention-only model on the built-in stories mixed with tiled random segments,
and a 1-layer one for contrast; finds the induction heads and the previous-token head they build
on; writes checkpoints, metrics, results.json, figures and a report to the output directory, and
returns a DemoResult (results.json is its to_dict()).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch

from circuitlab.analysis.heads import HeadClasses
from circuitlab.analysis.patching.metrics import GAP_FLOOR, gap_within_noise
from circuitlab.atomic import atomic_write_text, json_text, set_aside
from circuitlab.checks import COUNT
from circuitlab.names import head_name, parse_head
from circuitlab.methods.base import MethodResult
from circuitlab.experiments.demo_budget import work_gflops
from circuitlab.perf import REFERENCE_GFLOPS, scaled_seconds
from circuitlab.spec import Options, option
from circuitlab.training import RunConfig, read_metrics
from circuitlab.training.outputs import check_writable
from circuitlab.training.config_files import resolve_config
from circuitlab.training.phase import phase_change


@dataclass(frozen=True)
class DemoOptions(Options):
    """What `circuitlab demo` takes, declared once (circuitlab.spec): each flag's default, rule and help (its
    flags are these fields, in this order); run_induction_demo checks them before any work."""

    out: str | Path = option("runs/demo", help="output directory (an existing one is kept, renamed)")
    steps_2l: int | None = option(None, COUNT, flag="--steps", metavar="STEPS",
                                  help="training steps of the 2-layer model (default: configs/demo.yaml)")
    steps_1l: int = option(300, COUNT, help="training steps of the 1-layer model")
    resume: bool = option(False, help="continue an interrupted demo in --out: finished models are reused, the rest "
                                      "resumes")
    progress: bool = option(True, flag="--no-progress", help="no progress bars")


RESUME = "run_induction_demo(...) with resume=True"   # how a Python caller continues a stopped demo


@dataclass
class ModelFindings:
    """One trained model: its training, every head's scores and labels, the induction heads with the
    evidence behind each label (HeadLabel strings), and the phase change."""

    n_layers: int
    steps: int
    tokens_seen: int
    final_train_loss: float
    best_val_loss: float
    repeat_loss: float
    heads: list[dict[str, Any]]          # {"head", "layer", "index", "induction_score", "prev_token_score", ...}
    induction_heads: list[str]
    induction_evidence: list[str]
    rejected: list[str]
    previous_token_heads: list[str]
    phase_change: dict[str, Any] | None
    train_seconds: float
    induction_by_period: dict[str, Any] | None = None  # PeriodSweep.to_dict(): [r, r] at every period 4..n_ctx/2
    classes: HeadClasses | None = field(default=None, repr=False)  # the labels themselves (not in JSON)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "classes"}


@dataclass
class DemoResult:
    """What the demo found; results.json is to_dict(). report/ renders the same dict (report.md, report.html)."""

    models: dict[str, ModelFindings]
    analysis: dict[str, MethodResult] = field(default_factory=dict)
    causal_evidence: dict[str, Any] | None = None   # see causal_evidence(); None for a 1-layer-only run
    figures: dict[str, str] = field(default_factory=dict)   # title -> PNG file name in the output folder
    wall_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"models": {k: m.to_dict() for k, m in self.models.items()},
                             "analysis": {k: a.to_dict() for k, a in self.analysis.items()}}
        if self.causal_evidence is not None:
            d["causal_evidence"] = self.causal_evidence
        d["figures"] = dict(self.figures)
        if self.wall_seconds:
            d["wall_seconds"] = dict(self.wall_seconds)
        return d

    def _repr_html_(self) -> str:
        from circuitlab.report.html import markdown_lite
        from circuitlab.report.markdown import demo_narrative

        return markdown_lite("\n".join(demo_narrative(self.to_dict())))


def run_induction_demo(opts: DemoOptions) -> DemoResult:
    """Train both models into opts.out and analyse them. With opts.resume, continue an earlier demo there: each
    model's run must be of the asked steps (checked before any training), a finished one is reused, an
    interrupted one resumes; the analysis and the report are made again."""
    from circuitlab.analysis.heads.induction import training_probes
    from circuitlab.experiments.demo_budget import check_model_plan, resume_out, train_or_reuse
    from circuitlab.training.interrupts import continue_on_interrupt

    opts = opts.check()   # one line for a bad option, before anything is read or trained
    base = RunConfig.load(resolve_config("demo"))
    plan = [("2l", 2, opts.steps_2l or base.train.steps, "--steps"), ("1l", 1, opts.steps_1l, "--steps-1l")]
    out = Path(opts.out)
    check_writable(out, "the demo")
    if opts.resume:
        resume_out(out, _is_demo_output, "demo")
        for name, _, steps, flag in plan:
            check_model_plan(out / name, steps, flag, out)
        if (out / "results.json").is_file():
            print(f"the demo in {out} is finished: reusing its models, making the analysis and the report again")
    else:
        kept = set_aside(out, _is_demo_output, "demo")  # an earlier demo is kept renamed; other files are refused
        if kept is not None:
            print(f"moved the previous demo to {kept}")
        out.mkdir(parents=True, exist_ok=True)
    gflops_before = work_gflops()
    t0 = time.time()
    runs = {}
    for name, layers, steps, _ in plan:
        description = base.description if layers == 2 else "1-layer attention-only model, the demo's contrast"
        cfg = RunConfig.from_dict({**base.to_dict(), "name": f"demo-{name}", "description": description,
                                   "model": {**base.model, "preset": f"attn-only-{layers}l"}})
        cfg.train.steps = steps
        cfg.train.ckpt_every = steps
        kept_models = ", ".join(str(out / n) for n, *_ in plan if (out / n / "checkpoint").is_dir()) or None
        with continue_on_interrupt(f"preparing the {layers}-layer model's training",
                                   f"the models' checkpoints in {kept_models} are" if kept_models else None, RESUME):
            runs[name] = train_or_reuse(cfg, out / name, opts.resume, opts.progress,
                                        f"the {layers}-layer attention-only model", track=training_probes())
    train_seconds = time.time() - t0
    with continue_on_interrupt("analysing the models", f"the trained models in {out} are", RESUME):
        result = analyse_models(runs, out)
        print("writing the figures and the report")
        write_outputs(result, runs, out)
    total = time.time() - t0
    gflops = (gflops_before + work_gflops()) / 2  # the machine's speed around the run, load included
    result.wall_seconds = {"training": round(train_seconds, 1), "total": round(total, 1), "gflops": round(gflops, 1),
                           f"total_at_{REFERENCE_GFLOPS:.0f}_gflops": round(scaled_seconds(total, gflops), 1)}
    atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=2))  # now with the times
    return result


def _is_demo_output(folder: Path) -> bool:
    """A demo's folder, complete or cut short: its results or one of its two runs."""
    return any((folder / name).exists() for name in ("results.json", "report.md", "2l", "1l"))


def write_outputs(result: DemoResult, runs: dict, out: Path) -> None:
    """results.json, report.md and report.html (interactive, self-contained) into out."""
    from circuitlab.report import load_run, write_demo_report
    from circuitlab.report.markdown import demo_markdown

    results = result.to_dict()
    (out / "results.json").write_text(json_text(results, indent=2))
    (out / "report.md").write_text(demo_markdown(results))
    data = {}
    for name, r in runs.items():
        data[name] = load_run(r.out_dir, name, model=r.model, tokenizer=r.tokenizer)
        data[name].classes = result.models[name].classes
    write_demo_report(out, results, data)


def analyse_models(runs: dict, out: Path) -> DemoResult:
    """Label every head (behaviour + weight evidence), draw the figures, run the circuit analyses."""
    from circuitlab.analysis.heads.detectors import induction_by_period
    from circuitlab.analysis.heads import classify_heads
    from circuitlab.methods import REGISTRY
    from circuitlab.analysis.heads import attention_view
    from circuitlab.viz.heads import attention_patterns_figure
    from circuitlab.viz.training import induction_by_period_figure, training_curves_figure

    result = DemoResult(models={})
    curves = {name: read_metrics(r.out_dir) for name, r in runs.items()}
    for name, r in runs.items():
        model = r.model
        print(f"analysing the {model.cfg.n_layers}-layer model: every head's behaviour and weights")
        classes = classify_heads(model)
        print(f"analysing the {model.cfg.n_layers}-layer model: induction at every period")
        sweep = induction_by_period(model, batch=32, seed=99, exclude=[r.tokenizer.eos_id])
        repeat_loss = float(sweep.loss_second.mean())  # loss on the second copy of [r, r], all periods
        copying = classes.copying
        assert copying is not None  # this model's weights are read (no architecture assumption is broken)
        heads = []
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                heads.append({"head": head_name(layer, head), "layer": layer, "index": head,
                              "induction_score": round(float(classes.scores["induction"][layer, head]), 4),
                              "prev_token_score": round(float(classes.scores["previous_token"][layer, head]), 4),
                              "copying_score": round(float(copying.scores[layer, head]), 4),
                              "labels": classes.labels_of(layer, head)})
        induction = [lab for lab in classes.labels if lab.label == "induction"]
        result.models[name] = ModelFindings(
            n_layers=model.cfg.n_layers, steps=r.steps, tokens_seen=r.tokens_seen,
            final_train_loss=round(r.final_loss, 4), best_val_loss=round(r.best_val_loss, 4),
            repeat_loss=round(repeat_loss, 4), heads=heads,
            induction_heads=[lab.name for lab in induction],
            induction_evidence=[str(lab) for lab in induction],
            rejected=[str(lab) for lab in classes.rejected],
            previous_token_heads=[head_name(l, h) for l, h in classes.heads_with("previous-token")],
            phase_change=phase_change(curves[name]), train_seconds=round(r.seconds, 1),
            induction_by_period=sweep.to_dict(), classes=classes)
    print("drawing the training curves and induction by period")
    figures = {"training_curves": "training_curves.png", "induction_by_period": "induction_by_period.png"}
    training_curves_figure(curves, {name: m.phase_change for name, m in result.models.items()}).save_png(
        out / figures["training_curves"])
    induction_by_period_figure({name: m.induction_by_period for name, m in result.models.items()
                                if m.induction_by_period is not None}).save_png(  # set for every model above
        out / figures["induction_by_period"])
    two = runs.get("2l")
    if two is not None:
        found = result.models["2l"]
        show = found.previous_token_heads[:1] + found.induction_heads[:3]
        if show:
            gen = torch.Generator().manual_seed(7)
            segment = torch.randint(0, two.tokenizer.vocab_size, (12,), generator=gen)
            view = attention_view(two.model, segment.repeat(3), two.tokenizer, found.classes)
            attention_patterns_figure(view, "Attention on a random 12-token segment repeated 3 times",
                                      heads=show).save_png(out / "induction_patterns.png")
            figures["attention_patterns"] = "induction_patterns.png"
        # QK/OV circuits of the induction head, K-composition, copying; a logit lens on a story.
        # Causal tests of the same circuit: patching and path patching on induction prompts (clean:
        # r + r[:k]; corrupt: the earlier copy of the last token replaced), mean-ablation of heads.
        experiments = [(name, partial(REGISTRY[name].run, options=REGISTRY[name].options_from({})))
                       for name in ("circuits", "logit_lens", "patching")]
        experiments += [("ablation", partial(REGISTRY["ablation"].run, options=REGISTRY["ablation"].options_from({}),
                                             group=found.induction_heads or None))]
        for experiment, run in experiments:
            print(f"running {experiment} on the 2-layer model")
            found_exp = run(two.model, two.tokenizer, out)
            result.analysis[experiment] = found_exp
            for fig in found_exp.figures:
                figures[f"{experiment}: {fig}"] = fig
        result.causal_evidence = causal_evidence(found.to_dict(), {k: a.to_dict() for k, a in result.analysis.items()})
    result.figures = figures
    return result


def causal_evidence(found: dict[str, Any], analysis: dict[str, Any]) -> dict[str, Any]:
    """What the interventions say about the circuit the labels name: each labelled head's patching
    recovery, the paths from the previous-token head into the receiver's q, k and v, the ablation."""
    evidence: dict[str, Any] = {}
    patching = analysis.get("patching", {})
    head_out = patching.get("patching", {}).get("head_out")
    noisy = head_out is not None and gap_within_noise(head_out["clean_value"], head_out["corrupt_value"],
                                                      head_out.get("gap_noise", 0.0))
    if noisy:  # recoveries of a gap within noise are meaningless: the report says so instead
        gap = head_out["clean_value"] - head_out["corrupt_value"]
        evidence["patching_noise"] = (f"the clean - corrupted gap ({gap:+.3g}) is within noise (|gap| below "
                                      f"max({GAP_FLOOR:g}, 2 standard errors = {head_out.get('gap_noise', 0.0):.3g})), "
                                      "so recovery fractions are meaningless and none are reported")
    elif head_out and head_out["clean_value"] != head_out["corrupt_value"]:
        gap = head_out["clean_value"] - head_out["corrupt_value"]
        values = head_out["values"]
        evidence["patching_recovery"] = {
            name: round((values[layer][head] - head_out["corrupt_value"]) / gap, 4)
            for name in found["induction_heads"] + found["previous_token_heads"]
            for layer, head in [parse_head(name)]}
    paths = patching.get("path_patching")
    if paths and found["previous_token_heads"] and not noisy:
        layer, head = parse_head(found["previous_token_heads"][0])
        by_input = {}
        for inp, p in paths.items():
            gap = p["clean_value"] - p["corrupt_value"]
            if gap:
                by_input[inp] = round((p["clean_value"] - p["values"][layer][head]) / gap, 4)
        receiver = next(iter(paths.values()))["receiver"]
        evidence["path_patching"] = {"sender": found["previous_token_heads"][0], "receiver": receiver,
                                     "fraction_of_gap": by_input,
                                     "other_induction_heads": [h for h in found["induction_heads"] if h != receiver]}
    group = analysis.get("ablation", {}).get("group")
    if group:
        evidence["ablation"] = group
    return evidence
