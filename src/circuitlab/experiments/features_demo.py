"""The features demo (`circuitlab sae demo`): features in superposition, found in a model we train.

Trains a 1-layer transformer with a 512-neuron MLP on the built-in stories (the shape of Towards
Monosemanticity's model, at the scale of a laptop), trains a sparse dictionary on its MLP activations
(blocks.0.mlp.hook_post), measures it (explained variance, L0, dead features, CE-loss recovered when
spliced in), builds dashboards on held-out stories, and compares how token-specific the features are
with how token-specific the MLP's own neurons are. Writes report.md, report.html and results.json; every
sentence of the report is computed from the numbers in results.json.

    result = run_features_demo(FeaturesDemoOptions(out=Path("runs/features")))
    result.summary()              # the report's sentences
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.checks import COUNT, DEFAULT_SEED
from circuitlab.dictionaries.metrics import loss_kept
from circuitlab.experiments.demo_budget import (StageClock, budget_dict, budget_sentence, check_model_plan,
                                                fresh_out, resume_out, train_or_reuse)
from circuitlab.spec import Options, option
from circuitlab.training.interrupts import continue_on_interrupt

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SEQ_LEN = 64    # the demo model's sequences: its training, the dictionary's activations, the held-out text
HOOK = "blocks.0.mlp.hook_post"
SPECIFIC = 0.8  # a unit is "token-specific" when at least this share of its top contexts end in one token



@dataclass(frozen=True)
class FeaturesDemoOptions(Options):
    """Sizes of the demo; the defaults fit the 3-minute budget on a 150 GFLOP/s machine (see docs). The options
    (out, model_steps, dictionary_steps, resume, progress) are `circuitlab sae demo`'s flags; the other sizes are
    the Python API's alone."""

    out: str = option("runs/features", help="output directory (an existing one is kept, renamed)")
    model_steps: int = option(600, COUNT, help="training steps of the 1-layer model (default {default})")
    model_batch: int = 64         # sequences of 64 tokens per model step
    d_mlp: int = 512
    d_sae: int = 2048
    k: int = 16                   # active features per token (TopK)
    dictionary_steps: int = option(500, COUNT, help="training steps of the dictionary (default {default})")
    dictionary_batch: int = 4096  # activations per dictionary step
    dashboard_tokens: int = 32_768
    shown: int = 8                # features written up in the report
    n_stories: int = 6000         # the built-in stories the model trains on (the induction demo's corpus)
    seed: int = DEFAULT_SEED
    progress: bool = option(True, flag="--no-progress", help="no progress bars")
    resume: bool = option(False, help="continue an interrupted demo in --out: a finished model is reused, the rest "
                                      "resumes")   # an earlier (interrupted or finished) features demo in out

    def __post_init__(self) -> None:   # a Path is text here
        if isinstance(self.out, PurePath):
            object.__setattr__(self, "out", str(self.out))


RESUME = "run_features_demo(...) with resume=True"   # how a Python caller continues a stopped demo


@dataclass
class UnitFinding:
    """A feature (or neuron) in words: its strongest contexts' most common final token and that token's
    share of them, its density, and the tokens its output promotes."""

    index: int
    density: float
    max_act: float
    top_token: str
    top_share: float
    contexts: int
    promoted: list[str] = field(default_factory=list)

    def sentence(self, kind: str = "Feature") -> str:
        where = (f"{round(self.top_share * self.contexts)} of its {self.contexts} strongest contexts end in "
                 f"{self.top_token!r}")
        promoted = f"; it most raises the logits of {', '.join(repr(t) for t in self.promoted[:3])}" if self.promoted else ""
        return f"{kind} {self.index} is active on {self.density:.2%} of tokens; {where}{promoted}."


@dataclass
class FeaturesDemoResult:
    """What the demo found; to_dict() is results.json."""

    out: Path
    model: dict[str, Any]
    dictionary: dict[str, Any]
    metrics: dict[str, float]
    specificity: dict[str, float]
    features: list[UnitFinding]
    wall_seconds: dict[str, float]
    gflops: float
    scaled_seconds: float

    def summary(self) -> list[str]:
        """The report's findings in words, each from the numbers above."""
        m, d, s, md = self.metrics, self.dictionary, self.specificity, self.model
        lines = [
            f"A 1-layer transformer with a {md['d_mlp']}-neuron MLP trained for {md['steps']} steps "
            f"({md['tokens_seen']:,} tokens) on the built-in stories reached a validation loss of {md['val_loss']:.3f} nats.",
            f"A {d['architecture']} dictionary of {d['d_sae']:,} features (k = {d['k']}) trained on "
            f"{d['tokens_trained']:,} of its MLP activations explains {m['explained_variance']:.1%} of their variance "
            f"with {m['l0']:.1f} features active per token.",
        ]
        if "ce_loss_recovered" in m:
            kept = loss_kept(m["ce_loss_clean"], m["ce_loss_spliced"], m["ce_loss_zero"], m["ce_loss_recovered"],
                             "the MLP", "the MLP's", "the dictionary")
            lines.append(f"Spliced in place of the MLP activations (without the error term) it takes the loss from "
                         f"{m['ce_loss_clean']:.3f} to {m['ce_loss_spliced']:.3f} nats, against "
                         f"{m['ce_loss_zero']:.3f} when the MLP is zeroed: {kept}.")
        lines.append(f"On {s['tokens']:,} held-out tokens, {s['dead_fraction']:.1%} of the features never fire.")
        verdict = ("more" if s["features_specific"] > s["neurons_specific"] else
                   "less" if s["features_specific"] < s["neurons_specific"] else "as")
        lines.append(f"{s['features_specific']:.0%} of the features that fire are token-specific (at least "
                     f"{SPECIFIC:.0%} of their {s['contexts']} strongest contexts end in one token), against "
                     f"{s['neurons_specific']:.0%} of the MLP's {md['d_mlp']} neurons: the features are {verdict} "
                     "monosemantic than the neurons by this measure.")
        lines.append(budget_sentence(self))
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "model": self.model, "dictionary": self.dictionary, "metrics": self.metrics,
                "specificity": self.specificity, "features": [asdict(f) for f in self.features],
                "summary": self.summary(), **budget_dict(self)}

    def _repr_html_(self) -> str:
        import html

        return "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.summary()) + "</ul>"


# ---------------------------------------------------------------------------- pipeline


def run_features_demo(opts: FeaturesDemoOptions) -> FeaturesDemoResult:
    from circuitlab.dictionaries.features import feature_dashboards, text_batches

    opts = opts.check()   # the options' rules, before any work
    out = _prepare(opts)
    clock = StageClock()
    saved = f"the model's checkpoint in {out / 'model'} is" if (out / "model" / "checkpoint").is_dir() else None
    with continue_on_interrupt("preparing the model's training", saved, RESUME):
        run = _train_model(opts, out / "model")
    clock.lap("model")
    model, tokenizer = run.model.eval(), run.tokenizer
    with continue_on_interrupt("training the dictionary", f"the model in {out / 'model'} is", RESUME):
        sae, found, folder, trained_on, data = _train_dictionary(model, tokenizer, opts, out / "dictionary")
    clock.lap("dictionary")
    with continue_on_interrupt("making the dashboards and the report", f"the model and the dictionary in {out} are",
                               RESUME):
        metrics = _metrics(model, sae, found, data)
        held_out = text_batches(tokenizer, n_tokens=opts.dashboard_tokens, seq_len=SEQ_LEN, batch_size=32)
        dash = feature_dashboards(model, sae, held_out, k=10, tokenizer=tokenizer, progress=opts.progress)
        dash.save(folder / "dashboards")  # where `circuitlab serve --dictionary` looks for them
        features = [_finding(dash, f) for f in range(sae.cfg.d_sae)]
        neurons = _neuron_findings(model, held_out, tokenizer, k=10)
        alive = [f for f in features if f.density > 0]
        specificity = {"tokens": dash.n_tokens, "contexts": 10, "dead_fraction": dash.summary()["dead_fraction"],
                       "features_specific": _share(f.top_share >= SPECIFIC for f in alive),
                       "neurons_specific": _share(n.top_share >= SPECIFIC for n in neurons if n.contexts)}
        shown = pick_readable(alive, opts.shown)
        result = FeaturesDemoResult(
            out, {"d_mlp": opts.d_mlp, "steps": run.steps, "tokens_seen": run.tokens_seen,
                  "val_loss": round(run.best_val_loss, 4), "params": model.num_params()},
            {"architecture": sae.cfg.architecture, "d_sae": sae.cfg.d_sae, "k": opts.k, "hook_name": HOOK,
             "tokens_trained": trained_on, "folder": str(folder)}, metrics, specificity, shown, *clock.finish())
        write_features_report(result, dash)
    return result


def _prepare(opts: FeaturesDemoOptions) -> Path:
    """The out folder: a fresh one (an earlier features demo kept renamed) or, with resume, the earlier demo,
    its plan checked before any training: the model's run of --model-steps, the dictionary's of at most
    --dictionary-steps (the trainer refuses other settings when it loads it)."""
    import json

    from circuitlab.dictionaries.train import CHECKPOINT, STATE
    from circuitlab.errors import InputError

    if not opts.resume:
        return fresh_out(Path(opts.out), _is_features_demo_output, "features demo")
    out = resume_out(Path(opts.out), _is_features_demo_output, "features demo")
    check_model_plan(out / "model", opts.model_steps, "--model-steps", out)
    state = out / "dictionary" / CHECKPOINT / STATE
    if state.is_file():
        step = int(json.loads(state.read_text()).get("step", 0))
        if step > opts.dictionary_steps:
            raise InputError(f"cannot resume {out}: its dictionary trained {step} steps, more than --dictionary-steps "
                             f"{opts.dictionary_steps}; resume with --dictionary-steps {step}, or drop --resume")
    if (out / "results.json").is_file():
        print(f"the features demo in {out} is finished: reusing its model and dictionary, making the dashboards "
              "and the report again")
    return out


def _is_features_demo_output(folder: Path) -> bool:
    """A features demo's folder, complete or cut short: its results or one of its two training folders."""
    return any((folder / name).exists() for name in ("results.json", "report.md", "model", "dictionary"))


def _train_model(opts: FeaturesDemoOptions, out: Path):
    from circuitlab.training import RunConfig

    steps = opts.model_steps
    cfg = RunConfig.from_dict({
        "name": "features-model", "description": f"1-layer transformer with a {opts.d_mlp}-neuron MLP (features demo)",
        "model": {"preset": "gpt2-tiny", "n_layers": 1, "d_model": 128, "n_heads": 4, "d_mlp": opts.d_mlp},
        "data": _data_config(opts),
        "train": {"steps": steps, "batch_size": opts.model_batch, "seq_len": SEQ_LEN, "lr": 3e-3,
                  "warmup_steps": min(50, steps), "eval_every": max(1, steps // 3), "eval_batches": 4, "ckpt_every": steps, "track_every": steps,
                  "log_every": max(1, steps // 50), "seed": opts.seed}})
    return train_or_reuse(cfg, out, opts.resume, opts.progress, f"a 1-layer model with a {opts.d_mlp}-neuron MLP")


def _train_dictionary(model: Transformer, tokenizer, opts: FeaturesDemoOptions, out: Path):
    """A TopK dictionary on the MLP activations with the dictionaries trainer. Returns the dictionary (raw
    activations in and out), its held-out metrics, its folder and the activations it trained on."""
    from circuitlab.data import build_data
    from circuitlab.data.dataset import DataConfig
    from circuitlab.dictionaries import DictionaryConfig, base_model_id
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    data = build_data(DataConfig.from_dict(_data_config(opts)), tokenizer=tokenizer)  # the model's own corpus (cached tokens)
    source = ModelActivations(model, [HOOK], data, seq_len=SEQ_LEN, seqs_per_chunk=64)
    cfg = DictionaryConfig("topk", d_in=opts.d_mlp, d_sae=opts.d_sae, k=opts.k, hook_name=HOOK,
                           base_model=base_model_id(model, "features-model"), metadata={"name": "mlp-topk"})
    train = DictTrainConfig(steps=opts.dictionary_steps, batch_size=opts.dictionary_batch, lr=4e-4,
                            lr_warmup_steps=min(50, opts.dictionary_steps), dead_after=min(200, opts.dictionary_steps),
                            eval_batches=2, log_every=max(1, opts.dictionary_steps // 20), seed=opts.seed)
    trainer = DictionaryTrainer([cfg], train, ActivationStore(source, opts.dictionary_batch, seed=opts.seed),
                                ActivationStore(source, opts.dictionary_batch, split="val"))
    print(f"training a TopK dictionary of {opts.d_sae} features (k={opts.k}) on {HOOK} for {opts.dictionary_steps} steps")
    result = trainer.fit(out, progress=opts.progress)
    return result.dictionaries[0], result.metrics[0], result.folders[0], result.steps * opts.dictionary_batch, data


def _metrics(model: Transformer, sae, found, data) -> dict[str, float]:
    """The dictionary's held-out numbers, and the loss with it spliced in (no error term) against the MLP zeroed."""
    from circuitlab.dictionaries.metrics import spliced_loss

    tokens = data.get_batch("val", 0, 32, 64)
    spliced = spliced_loss(model, sae, tokens)
    return {"explained_variance": round(found.explained_variance, 4), "l0": round(found.l0, 2),
            "cosine": round(found.cosine, 4), "l2_ratio": round(found.l2_ratio, 4), "dead_fraction": round(found.dead_frac, 4),
            "ce_loss_clean": round(spliced.ce_clean, 4), "ce_loss_spliced": round(spliced.ce_spliced, 4),
            "ce_loss_zero": round(spliced.ce_zero, 4), "ce_loss_recovered": round(spliced.ce_recovered, 4),
            "kl": round(spliced.kl, 5)}


def _data_config(opts: FeaturesDemoOptions) -> dict[str, Any]:
    return {"source": "stories", "n_stories": opts.n_stories, "tokenizer": "bpe", "vocab_size": 512}


def _share(flags) -> float:
    flags = list(flags)
    return round(sum(flags) / len(flags), 4) if flags else 0.0


def _finding(dash, feature: int) -> UnitFinding:
    i = dash.index(feature)
    contexts = dash.contexts(feature)
    counts = Counter(c["tokens"][c["at"]] for c in contexts)
    top, n = counts.most_common(1)[0] if counts else ("", 0)
    logits = dash.logit_tokens(feature)
    return UnitFinding(feature, round(float(dash.density[i]), 6), round(float(dash.max_act[i]), 4), top,
                       round(n / len(contexts), 4) if contexts else 0.0, len(contexts),
                       [t["token"] for t in logits["promoted"][:5]] if logits else [])


def _neuron_findings(model: Transformer, batches: list[torch.Tensor], tokenizer, k: int) -> list[UnitFinding]:
    """The same token-specificity measure for every neuron of the MLP (its k strongest contexts)."""
    from circuitlab.analysis.logit_attribution import top_activating_inputs

    found = top_activating_inputs(model, batches, 0, list(range(model.cfg.mlp_dim)), k=k, context=0)
    out = []
    for n, (values, contexts) in enumerate(zip(found.values.tolist(), found.contexts)):
        last = [tokenizer.decode([c[-1]]) for v, c in zip(values, contexts) if v > 0]
        counts = Counter(last)
        top, m = counts.most_common(1)[0] if counts else ("", 0)
        out.append(UnitFinding(n, 0.0, round(max(values), 4), top, round(m / len(last), 4) if last else 0.0, len(last)))
    return out


def pick_readable(features: list[UnitFinding], n: int) -> list[UnitFinding]:
    """Up to n features a person can read: token-specific ones first (most specific, then most frequent),
    one per top token, then the most frequent of the rest; features active on under 0.05% of tokens or on
    over 20% are left out."""
    usable = [f for f in features if 5e-4 <= f.density <= 0.2 and f.contexts >= 5]
    usable.sort(key=lambda f: (-(f.top_share >= SPECIFIC), -f.top_share, -f.density))
    chosen, tokens = [], set()
    for f in usable:
        if f.top_token in tokens:
            continue
        chosen.append(f)
        tokens.add(f.top_token)
        if len(chosen) == n:
            break
    return chosen


# ---------------------------------------------------------------------------- report


def write_features_report(result: FeaturesDemoResult, dash) -> None:
    """report.md, report.html and results.json in result.out."""
    from circuitlab.report.features import write_dashboards_report

    out = result.out
    lines = ["# circuitlab features demo", ""] + [f"{s}" for s in result.summary()] + ["", "## Features", ""]
    lines += [f"- {f.sentence()}" for f in result.features]
    lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4g} |" for k, v in result.metrics.items()]
    lines += ["", "Dashboards of every feature: `circuitlab serve --checkpoint "
              f"{out / 'model'} --dictionary {result.dictionary['folder']}` (report.html shows the features above)."]
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=2))
    write_dashboards_report(out, dash, [f.index for f in result.features], metrics=result.metrics,
                            summary=result.summary(), notes={f.index: f.sentence() for f in result.features},
                            title="circuitlab features demo")
