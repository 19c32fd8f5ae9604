"""The graphs demo (`circuitlab graph demo`): attribution graphs of a model we train, each story tested.

Trains a 2-layer transformer with MLPs on the built-in stories (a curriculum of tiled random segments
first, so that induction heads form), trains one cross-layer transcoder (or a transcoder per MLP), and
builds the attribution graph of three predictions with a known mechanism:

    name    a made-up name repeated from earlier in the story ("... named Kilomo. ... One day, Kilo" -> "mo"):
            only the earlier mention can tell the model how the name goes on;
    phrase  "Once upon a" -> " time" and "... were best" -> " friends": fixed phrases the model memorised.

For each graph it measures the replacement and completeness scores, which prompt positions the
prediction's influence comes from, which features carry it, and runs ONE intervention that tests the
story: the features the graph says raise the predicted token's logit most (Graph.logit_effects: signed,
through later features) are steered to -1x their activation, in the replacement model and in the real
model (attention free), beside a control that steers as many other active features at the same layers and
positions the same way (and, for reference, the same features zeroed). Each graph is methods/graph.py's
explain() (its intervention: graphs/verify.py); the prompts are made here (name_prompt, phrase_prompt).
Writes report.md, report.html and results.json; every sentence of the report is computed from the numbers
in results.json (GraphFinding.sentences, GraphsDemoResult.summary).

    result = run_graphs_demo(GraphsDemoOptions(out=Path("runs/graphs")))
    result.summary()                  # the report's sentences
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from circuitlab.checks import COUNT, DEFAULT_SEED
from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import InputError
from circuitlab.experiments.demo_budget import (StageClock, budget_dict, budget_sentence, fresh_out,
                                                train_or_reuse)
from circuitlab.graphs.options import DEFAULTS
from circuitlab.graphs.verify import PREDICTED
from circuitlab.methods.graph import GraphFinding, PromptSpec, document_start, explain, target_probability
from circuitlab.spec import Options, option
from circuitlab.training.interrupts import continue_on_interrupt

if TYPE_CHECKING:
    from circuitlab.model import Transformer

KINDS = ("clt", "per-layer")   # the transcoders the demo trains: one cross-layer transcoder, or one per MLP
RESUME = "run_graphs_demo(...) with resume=True"   # how a Python caller continues a stopped demo
NAME_TEMPLATE = ("Once upon a time, there was a little girl named {name}. {name} liked to play in the park "
                 "every day. One day, {name}")
PHRASES = (("once-upon-a-time", "Once upon a time"),
           ("best-friends", "Once upon a time, there was a boy named Tom. Tom had a friend named Bo. "
                            "From that day on, Tom and Bo were best friends"))



@dataclass(frozen=True)
class GraphsDemoOptions(Options):
    """Sizes of the demo; the defaults fit the 3-minute budget on a 150 GFLOP/s machine (see docs/graphs.md). The
    options (out, resume, transcoders, model_steps, transcoder_steps, progress) are `circuitlab graph demo`'s
    flags; the other sizes are the Python API's alone."""

    out: str = option("runs/graphs", help="output directory (an earlier graphs demo there is kept, renamed; default "
                                          "{default})")
    model_steps: int = option(600, COUNT, help="training steps of the model (default {default})")
    segment_steps: int = 300      # first steps on tiled random segments only (induction heads form there)
    model_batch: int = 64         # sequences of 64 tokens per model step
    d_mlp: int = 512
    # one CLT or a transcoder per MLP (docs/graphs.md compares them on this model)
    transcoders: str = option("clt", choices=KINDS, help="one TopK cross-layer transcoder (default) or a TopK "
                                                         "transcoder per MLP")
    d_sae: int = 1024             # features per layer
    k: int = 16                   # active features per token and layer (TopK)
    transcoder_steps: int = option(400, COUNT, help="training steps of the transcoders (default {default})")
    transcoder_batch: int = 1024  # activation rows per transcoder step
    n_names: int = 12             # made-up names tried for the name prompt (the best-completed one is shown)
    dashboard_tokens: int = DEFAULTS.dashboard_tokens  # held-out story tokens for the viewer's feature cards (0: none)
    n_stories: int = 6000
    seed: int = DEFAULT_SEED
    resume: bool = option(False, help="continue an interrupted demo in --out: finished stages are reused, the rest "
                                      "resumes")
    progress: bool = option(True, flag="--no-progress", help="no progress bars")

    def __post_init__(self) -> None:   # a Path is text here (run_graphs_demo checks every option before any work)
        if isinstance(self.out, PurePath):
            object.__setattr__(self, "out", str(self.out))


@dataclass
class GraphsDemoResult:
    """What the demo found; to_dict() is results.json."""

    out: Path | None
    model: dict[str, Any]
    transcoders: dict[str, Any]
    graphs: list[GraphFinding]
    wall_seconds: dict[str, float]
    gflops: float
    scaled_seconds: float

    def summary(self) -> list[str]:
        """The report's findings in words, each from the numbers above."""
        md, tc = self.model, self.transcoders
        kind = ("one cross-layer transcoder" if tc["kind"] == "clt" else f"a transcoder per MLP")
        confirmed = [g.slug for g in self.graphs if g.confirmed]
        untested = [g.slug for g in self.graphs if not g.predicted]
        lines = [
            f"A {md['n_layers']}-layer transformer with {md['d_mlp']}-neuron MLPs trained for {md['steps']} steps "
            f"({md['tokens_seen']:,} tokens) on the built-in stories reached a validation loss of {md['val_loss']:.3f} nats.",
            f"Its MLPs were replaced by {kind} ({tc['architecture']}, {tc['d_sae']:,} features per layer, "
            f"k = {tc['k']}, with a linear skip), trained on {tc['tokens_trained']:,} activations: mean explained "
            f"variance {tc['explained_variance']:.1%}; with every MLP replaced at once the loss goes from "
            f"{tc['ce_loss_clean']:.3f} to {tc['ce_loss_spliced']:.3f} nats (MLPs zeroed: {tc['ce_loss_zero']:.3f}): "
            f"{_loss_kept(tc)}.",
            f"{len(confirmed)} of the {len(self.graphs)} interventions confirm their graph's story"
            + (f" ({', '.join(confirmed)})" if confirmed else "")
            + (f"; {len(untested)} could not test one ({', '.join(untested)}: the model does not predict the "
               f"target, p < {PREDICTED:g})." if untested else "."),
            budget_sentence(self),
        ]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "model": self.model, "transcoders": self.transcoders,
                "graphs": [g.to_dict() for g in self.graphs], "summary": self.summary(), **budget_dict(self)}

    def _repr_html_(self) -> str:
        from circuitlab.viz.graph_view import graphs_demo_summary_html

        return graphs_demo_summary_html(self)


def _loss_kept(tc: dict[str, Any]) -> str:
    """The share of the MLPs' contribution to the loss the transcoders keep, when the numbers can say it."""
    from circuitlab.dictionaries.metrics import loss_kept

    return loss_kept(tc["ce_loss_clean"], tc["ce_loss_spliced"], tc["ce_loss_zero"], tc["ce_loss_recovered"],
                     "the MLPs", "the MLPs'", "the transcoders")


# ---------------------------------------------------------------------------- pipeline


def run_graphs_demo(opts: GraphsDemoOptions) -> GraphsDemoResult:
    opts = opts.check()   # the options' rules, before any work
    out = _prepare(opts)
    clock = StageClock()
    # a stop (Ctrl-C, the termination signal) in a stage says what is kept and the command that continues;
    # the training loops say it themselves, with their step and checkpoint
    model_saved = f"the model's checkpoint in {out / 'model'} is" if (out / "model" / "checkpoint").is_dir() else None
    with continue_on_interrupt("preparing the model's training", model_saved, RESUME):
        run = train_model(opts, out / "model")
    clock.lap("model")
    model, tokenizer = run.model.eval(), run.tokenizer
    with continue_on_interrupt("training the transcoders", f"the model in {out / 'model'} is", RESUME):
        tc, tc_info = train_transcoders(model, tokenizer, opts, out / "transcoders")
    clock.lap("transcoders")
    graphs = []
    with continue_on_interrupt("making the graphs", f"the model and the transcoders in {out} are", RESUME):
        specs = demo_prompts(model, tokenizer, opts)
        for i, spec in enumerate(specs):
            print(f"graph {i + 1} of {len(specs)}: {spec.slug}")
            graphs.append(explain(model, tc, tokenizer, spec, out / "graphs", progress=opts.progress,
                                  dashboard_tokens=opts.dashboard_tokens))
    clock.lap("graphs")
    result = GraphsDemoResult(
        out, {"n_layers": model.cfg.n_layers, "d_mlp": opts.d_mlp, "steps": run.steps, "tokens_seen": run.tokens_seen,
              "val_loss": round(run.best_val_loss, 4), "params": model.num_params()},
        tc_info, graphs, *clock.finish())
    write_graphs_report(result)
    return result


def _prepare(opts: GraphsDemoOptions) -> Path:
    """The out folder: with resume, an earlier (maybe interrupted) graphs demo there, its whole plan checked
    against what is on disk before any training (check_resume); otherwise an empty folder, an earlier graphs
    demo being kept renamed and other files refused. The options that decide each stage's result are recorded
    (OPTIONS_FILE) for a later --resume to compare."""
    out = Path(opts.out)
    if opts.resume:
        if not (out / "model").is_dir():
            raise InputError(f"--resume: {out} holds no graphs demo to continue (no model/ folder); drop --resume")
        check_resume(opts, out)
    else:
        out = fresh_out(out, _is_graphs_demo_output, "graphs demo")
    atomic_write_text(out / OPTIONS_FILE, json_text(stage_options(opts), indent=2) + "\n")
    return out


OPTIONS_FILE = "options.json"
# The options that decide each training stage's result, by the folder the stage writes (the graphs are remade
# on every run, so theirs are free to change), with the flag that sets each from the command line.
STAGE_OPTIONS = {
    "model": {"model_steps": "--model-steps", "segment_steps": "segment_steps", "model_batch": "model_batch",
              "d_mlp": "d_mlp", "n_stories": "n_stories", "seed": "seed"},
    "transcoders": {"transcoders": "--transcoders", "transcoder_steps": "--transcoder-steps", "d_sae": "d_sae",
                    "k": "k", "transcoder_batch": "transcoder_batch"},
}


def stage_options(opts: GraphsDemoOptions) -> dict[str, dict[str, Any]]:
    """{stage: {option: value}} of STAGE_OPTIONS (what options.json holds)."""
    return {stage: {k: getattr(opts, k) for k in names} for stage, names in STAGE_OPTIONS.items()}


def _saved_step(folder: Path, stage: str) -> int | None:
    """The step of a stage's checkpoint in `folder` (the model's trainer state, the transcoders' state.json)."""
    from circuitlab.dictionaries.train import CHECKPOINT, STATE
    from circuitlab.training.checkpoint import read_trainer_state

    try:
        if stage == "model":
            if not (folder / "checkpoint").is_dir():
                return None
            return int((read_trainer_state(folder / "checkpoint") or {})["step"])
        state = folder / CHECKPOINT / STATE
        return int(json.loads(state.read_text())["step"]) if state.is_file() else None
    except (KeyError, ValueError, OSError, TypeError) as e:
        raise InputError(f"--resume: {folder}'s checkpoint is damaged ({e}); drop --resume to start over") from None


def check_resume(opts: GraphsDemoOptions, out: Path) -> None:
    """Refuse, before any training, a --resume whose stages would not continue what `out` holds: a stage that
    holds work (a checkpoint or results) must be resumed with the options it started with (options.json),
    a checkpoint cannot hold more steps than asked, and the model cannot train on under transcoders trained
    on it. Says what a finished demo reuses."""
    recorded: dict[str, dict[str, Any]] = {}
    if (out / OPTIONS_FILE).is_file():
        try:
            recorded = json.loads((out / OPTIONS_FILE).read_text())
        except ValueError as e:
            raise InputError(f"--resume: {out / OPTIONS_FILE} is damaged ({e}); drop --resume to start over") from None
    asked = stage_options(opts)
    held = {stage: (out / stage).is_dir() and any((out / stage).iterdir()) for stage in STAGE_OPTIONS}
    changed = [f"{STAGE_OPTIONS[stage][k]} ({recorded[stage][k]!r} -> {v!r})"
               for stage, values in asked.items() if held[stage] and isinstance(recorded.get(stage), dict)
               for k, v in values.items() if k in recorded[stage] and recorded[stage][k] != v]
    if changed:
        raise InputError(f"cannot resume {out} with other settings: {', '.join(changed)}; resume with the settings "
                         "it started with, or drop --resume to start a new demo (the earlier one is kept renamed)")
    steps = {"model": opts.model_steps, "transcoders": opts.transcoder_steps}
    flag = {"model": "--model-steps", "transcoders": "--transcoder-steps"}
    saved = {stage: _saved_step(out / stage, stage) for stage in STAGE_OPTIONS}
    for stage, step in saved.items():
        if step is not None and step > steps[stage]:
            raise InputError(f"cannot resume {out}: its {stage} trained {step} steps, more than {flag[stage]} "
                             f"{steps[stage]}; resume with {flag[stage]} {step}, or drop --resume to start a new demo")
    if held["transcoders"] and saved["model"] is not None and saved["model"] < opts.model_steps:
        raise InputError(f"cannot resume {out}: its transcoders were trained on the model at step {saved['model']}, "
                         f"and training the model on to {opts.model_steps} would leave them behind; resume with "
                         f"--model-steps {saved['model']}, or drop --resume to start a new demo")
    if (out / "results.json").is_file():
        print(f"the graphs demo in {out} is finished: reusing its model and transcoders, making the graphs and the "
              "report again")


def _is_graphs_demo_output(folder: Path) -> bool:
    """A graphs demo's folder, complete or cut short: its results or one of its stages' folders."""
    return any((folder / name).exists() for name in ("results.json", "report.md", "model", "transcoders", "graphs",
                                                     OPTIONS_FILE))


SEQ_LEN = 64   # the demo model's sequences: its training and its transcoders' activations
MODEL_LR = 1e-2   # the demo model's peak learning rate


def _data_config(opts: GraphsDemoOptions) -> dict[str, Any]:
    return {"source": "stories", "n_stories": opts.n_stories, "tokenizer": "bpe", "vocab_size": 512}


def model_run_config(opts: GraphsDemoOptions):
    """The model's RunConfig: 2 layers, d_model 128, 4 heads, opts.d_mlp-neuron GELU MLPs, LayerNorm; the stories
    with tiled random segments (all of the first opts.segment_steps steps, then a quarter of the rows)."""
    from circuitlab.training import RunConfig

    steps = opts.model_steps
    return RunConfig.from_dict({
        "name": "graphs-model", "description": f"2-layer transformer with {opts.d_mlp}-neuron MLPs (graphs demo)",
        "model": {"preset": "gpt2-tiny", "n_layers": 2, "d_model": 128, "n_heads": 4, "d_mlp": opts.d_mlp},
        "data": {**_data_config(opts), "random_segment_frac": 0.25, "segment_len": [4, 32], "segment_dist": "log",
                 "segment_only_steps": min(opts.segment_steps, steps)},
        "train": {"steps": steps, "batch_size": opts.model_batch, "seq_len": SEQ_LEN, "lr": MODEL_LR, "weight_decay": 0.05,
                  "warmup_steps": min(50, steps), "eval_every": max(1, steps // 2), "eval_batches": 4,
                  "ckpt_every": max(1, steps // 6), "track_every": steps, "log_every": max(1, steps // 50),
                  "seed": opts.seed}})


def train_model(opts: GraphsDemoOptions, out: Path):
    """The 2-layer model; resumes its checkpoint when opts.resume (a finished run is loaded as it is)."""
    return train_or_reuse(model_run_config(opts), out, opts.resume, opts.progress,
                          f"a 2-layer model with {opts.d_mlp}-neuron MLPs")


def train_transcoders(model: Transformer, tokenizer, opts: GraphsDemoOptions, out: Path):
    """TopK skip transcoders on every MLP (each reads blocks.L.ln2.hook_normalized, writes blocks.L.hook_mlp_out),
    or one TopK cross-layer transcoder, trained from one stream of activations of the model's own corpus
    (the trainer resumes its checkpoint in `out`). Returns (Transcoders, numbers for the report)."""
    from circuitlab.data import build_data
    from circuitlab.data.dataset import DataConfig
    from circuitlab.dictionaries import CLTConfig, DictionaryConfig, base_model_id
    from circuitlab.dictionaries.metrics import spliced_loss
    from circuitlab.dictionaries.store import ActivationStore, ModelActivations
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig
    from circuitlab.graphs import Transcoders

    L = model.cfg.n_layers
    base = base_model_id(model, "graphs-model")
    configs: list[DictionaryConfig | CLTConfig]
    if opts.transcoders == "clt":
        clt = CLTConfig("topk", n_layers=L, d_model=model.cfg.d_model, d_sae=opts.d_sae, k=opts.k, skip=True,
                        base_model=base, metadata={"name": "clt"})
        configs, hooks = [clt], clt.hooks()
    else:
        per_layer = [DictionaryConfig("topk", d_in=model.cfg.d_model, d_sae=opts.d_sae, k=opts.k, skip=True,
                                      hook_name=f"blocks.{l}.ln2.hook_normalized",
                                      out_hook_name=f"blocks.{l}.hook_mlp_out", d_out=model.cfg.d_model, base_model=base,
                                      metadata={"name": f"transcoder-{l}"})
                     for l in range(L)]
        configs = [*per_layer]
        hooks = [h for c in per_layer for h in (c.hook_name, c.out_hook_name) if h is not None]  # both set
    data = build_data(DataConfig.from_dict(_data_config(opts)), tokenizer=tokenizer)
    source = ModelActivations(model, hooks, data, seq_len=SEQ_LEN, seqs_per_chunk=64, skip_positions=1)
    steps = opts.transcoder_steps
    train = DictTrainConfig(steps=steps, batch_size=opts.transcoder_batch, lr=1e-3, lr_warmup_steps=min(50, steps),
                            dead_after=min(200, steps), eval_batches=2, log_every=max(1, steps // 20),
                            ckpt_every=max(1, steps // 4), seed=opts.seed)
    trainer = DictionaryTrainer(configs, train, ActivationStore(source, opts.transcoder_batch, seed=opts.seed),
                                ActivationStore(source, opts.transcoder_batch, split="val"))
    what = "a cross-layer transcoder" if opts.transcoders == "clt" else f"{L} per-layer transcoders"
    print(f"training {what} ({opts.d_sae} TopK features per layer, k={opts.k}, with skip) for {steps} steps")
    found = trainer.fit(out, progress=opts.progress)
    dicts = found.dictionaries
    tc = Transcoders.cross_layer(model, dicts[0]) if opts.transcoders == "clt" else Transcoders.per_layer(model, dicts)
    tokens = data.get_batch("val", 0, 32, 64)
    spliced = spliced_loss(model, dicts[0] if opts.transcoders == "clt" else list(dicts), tokens)
    ev = sum(m.explained_variance for m in found.metrics) / len(found.metrics)
    l0 = sum(m.l0 for m in found.metrics) / len(found.metrics)
    info = {"kind": opts.transcoders, "architecture": "topk", "d_sae": opts.d_sae, "k": opts.k,
            "tokens_trained": found.steps * opts.transcoder_batch, "folders": [str(f) for f in found.folders],
            "explained_variance": round(ev, 4), "l0": round(l0, 2),
            "ce_loss_clean": round(spliced.ce_clean, 4), "ce_loss_spliced": round(spliced.ce_spliced, 4),
            "ce_loss_zero": round(spliced.ce_zero, 4), "ce_loss_recovered": round(spliced.ce_recovered, 4)}
    return tc, info


# ---------------------------------------------------------------------------- prompts


def demo_prompts(model: Transformer, tokenizer, opts: GraphsDemoOptions) -> list[PromptSpec]:
    """The name prompt (of opts.n_names made-up names that split into several tokens the same way at every
    mention, the one the model completes with the highest probability), then the fixed phrases."""
    return [name_prompt(model, tokenizer, opts.n_names, opts.seed)] + [phrase_prompt(tokenizer, slug, text)
                                                                        for slug, text in PHRASES]


def name_prompt(model: Transformer, tokenizer, n_names: int, seed: int = DEFAULT_SEED) -> PromptSpec:
    """Of n_names made-up names that split into several tokens the same way at every mention (NAME_TEMPLATE),
    the one the model completes most from the story (p with the earlier mentions minus p without them)."""
    from circuitlab.data.stories import make_name

    rng = random.Random(f"graphs-demo-names:{seed}")
    best, best_p = None, -1.0
    tried = 0
    while tried < n_names and tried < 1000:
        name = make_name(rng)
        while len(name) < 6:  # three syllables: several tokens
            name = make_name(rng)
        tried += 1
        spec = _name_spec(tokenizer, name)
        if spec is None or len(spec.tokens) + 1 > model.cfg.n_ctx:
            continue
        # the name the model completes FROM THE STORY: p with the earlier mentions minus p from the last
        # sentence alone (a name whose first piece predicts the rest by itself would tell no copying story)
        p = target_probability(model, spec.tokens, spec.target)
        if spec.without_context is not None:
            p -= target_probability(model, spec.without_context, spec.target)
        if p > best_p:
            best, best_p = spec, p
    if best is None:
        raise InputError("no made-up name splits into several tokens the same way at every mention")
    return best


def _name_spec(tokenizer, name: str) -> PromptSpec | None:
    """The name template cut before the last mention's final token; None when the name is one token at the
    end or is split differently at its mentions."""
    text = NAME_TEMPLATE.format(name=name)
    ids = tokenizer.encode(text)
    head = tokenizer.encode(text[:-len(name) - 1])
    if ids[:len(head)] != head:
        return None
    piece = ids[len(head):]               # the last mention's tokens
    if len(piece) < 2 or tokenizer.decode(piece).strip() != name:
        return None
    earlier = [i for i in range(len(head) - len(piece) + 1) if ids[i:i + len(piece)] == piece]
    if len(earlier) < 2:
        return None
    start = document_start(tokenizer)
    focus = [len(start) + i + j for i in earlier for j in range(len(piece))]
    alone = tokenizer.encode("One day," + text[-len(name) - 1:])
    return PromptSpec("name", "name", start + ids[:-1], ids[-1], f"the earlier mentions of {name!r}", focus,
                      start + alone[:-1] if alone[-len(piece):] == piece else None)


def phrase_prompt(tokenizer, slug: str, text: str) -> PromptSpec:
    """text cut before its last token; focus: the last sentence's words before the last prompt token."""
    ids = tokenizer.encode(text)
    phrase = text.rsplit(". ", 1)[-1]      # the phrase: the last sentence
    start = len(tokenizer.encode(text[:-len(phrase)])) if phrase != text else 0
    words = tokenizer.decode(ids[start:-2])
    doc = document_start(tokenizer)
    return PromptSpec(slug, "phrase", doc + ids[:-1], ids[-1], f"the phrase's earlier words {words.strip()!r}",
                      [len(doc) + i for i in range(start, len(ids) - 2)])   # the phrase before its last prompt token


# ---------------------------------------------------------------------------- report


def write_graphs_report(result: GraphsDemoResult) -> None:
    """report.md, report.html and results.json in result.out (each written atomically)."""
    from circuitlab.viz.graph_view import graphs_demo_html, graphs_demo_markdown

    out = result.out
    assert out is not None  # run_graphs_demo writes its report into the out folder it made
    atomic_write_text(out / "report.md", graphs_demo_markdown(result, out))
    atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=2))
    atomic_write_text(out / "report.html", graphs_demo_html(result))
