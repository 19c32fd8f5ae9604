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
positions the same way (and, for reference, the same features zeroed).
Writes report.md, report.html and results.json; every sentence of the report is computed from the numbers
in results.json (GraphFinding.sentences, GraphsDemoResult.summary).

    result = run_graphs_demo(GraphsDemoOptions(out=Path("runs/graphs")))
    result.summary()                  # the report's sentences
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import InputError
from circuitlab.experiments.demo_budget import (StageClock, budget_dict, budget_sentence, fresh_out,
                                                train_or_reuse)
from circuitlab.training.interrupts import continue_on_interrupt

KINDS = ("per-layer", "clt")
RESUME = "run_graphs_demo(...) with resume=True"   # how a Python caller continues a stopped demo
N_ABLATED = 10         # features steered by each graph's intervention (those the graph says raise the logit most)
STEER = -1.0           # ...to this multiple of their activation: each one's contribution reversed
CONFIRMS = 0.5         # the intervention confirms the story when it removes at least this share of p(target)...
CONTROL_AT_MOST = 0.5  # ...and the control removes at most this share of what the intervention removed
PREDICTED = 0.05       # below this p(target) the model does not predict the target: no story about it can be tested
NAME_TEMPLATE = ("Once upon a time, there was a little girl named {name}. {name} liked to play in the park "
                 "every day. One day, {name}")
PHRASES = (("once-upon-a-time", "Once upon a time"),
           ("best-friends", "Once upon a time, there was a boy named Tom. Tom had a friend named Bo. "
                            "From that day on, Tom and Bo were best friends"))


@dataclass
class GraphsDemoOptions:
    """Sizes of the demo; the defaults fit the 3-minute budget on a 150 GFLOP/s machine (see docs/graphs.md)."""

    out: Path = Path("runs/graphs")
    model_steps: int = 600
    segment_steps: int = 300      # first steps on tiled random segments only (induction heads form there)
    model_batch: int = 64         # sequences of 64 tokens per model step
    d_mlp: int = 512
    transcoders: str = "clt"       # or "per-layer" (docs/graphs.md compares them on this model)
    d_sae: int = 1024             # features per layer
    k: int = 16                   # active features per token and layer (TopK)
    transcoder_steps: int = 400
    transcoder_batch: int = 1024  # activation rows per transcoder step
    n_names: int = 12             # made-up names tried for the name prompt (the best-completed one is shown)
    dashboard_tokens: int = 4096  # held-out story tokens for the viewer's feature cards (0: none)
    n_stories: int = 6000
    seed: int = 0
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.transcoders not in KINDS:
            raise InputError(f"transcoders must be one of {', '.join(KINDS)}, got {self.transcoders!r}")


@dataclass
class Ablation:
    """One intervention: features steered to `scale` x their activation at their positions and p(target)
    before and after, in the replacement model and in the real model (attention free), with a control of as
    many other active features at the same layers and positions; p_zeroed: the same features zeroed instead."""

    features: list[str]
    p_before: float
    p_replacement: float
    p_model: float
    p_control: float
    control: list[str] = field(default_factory=list)
    top_after: str = ""           # the real model's top prediction after the intervention
    scale: float = STEER
    p_zeroed: float | None = None

    @property
    def drop(self) -> float:
        """Share of p(target) the intervention removes in the real model."""
        return 1 - self.p_model / self.p_before if self.p_before > 0 else 0.0

    @property
    def control_drop(self) -> float:
        return 1 - self.p_control / self.p_before if self.p_before > 0 else 0.0

    @property
    def confirms(self) -> bool:
        return self.drop >= CONFIRMS and self.control_drop <= CONTROL_AT_MOST * self.drop


@dataclass
class GraphFinding:
    """One prompt's graph in numbers; sentences() says them in words."""

    slug: str
    mechanism: str                # "name" or "phrase"
    prompt: str
    target: str
    p_target: float
    rank: int                     # of the target among the model's predictions (1 = top)
    top_prediction: str
    scores: dict[str, float]      # replacement, completeness
    n_active_features: int
    pruned: dict[str, int]        # nodes, features, edges
    focus: str                    # what the focus positions are ("the earlier mentions of 'Kilomo'")
    focus_positions: list[int]
    token_share: dict[str, float]  # the token nodes' influence on the target: focus, last, other (sum 1)
    logit_inputs: dict[str, float]  # the target logit's direct inputs by kind: feature, error, token (|Â| shares)
    top_features: list[dict[str, Any]]
    top_path: str
    ablation: Ablation
    p_without_context: float | None = None   # name: p(target) with the earlier mentions cut away
    files: str = ""
    heads: dict[str, Any] | None = None      # name: the head carrying the name from its earlier mention, and why

    @property
    def predicted(self) -> bool:
        """Whether the model predicts the target enough for a story about the prediction to be tested."""
        return self.p_target >= PREDICTED

    @property
    def confirmed(self) -> bool | None:
        """Whether the intervention confirms the story; None when it cannot (the target is not predicted)."""
        return self.ablation.confirms if self.predicted else None

    def sentences(self) -> list[str]:
        """The finding in words; each verdict follows from the numbers it states, or says that nothing can be
        concluded from them (tests/test_graphs_demo.py turns every number against its verdict)."""
        s, a = self.scores, self.ablation
        out = [f"Prompt {self.prompt!r} → {self.target!r}: the model gives {self.target!r} probability "
               f"{self.p_target:.2f}" + (" (its top prediction)." if self.rank == 1 else
                                          f" (rank {self.rank}; its top prediction is {self.top_prediction!r}).")]
        if self.p_without_context is not None:
            out.append(self._context_sentence())
        out.append(f"The graph has {self.n_active_features} active features; pruned, {self.pruned['features']} "
                   f"feature nodes and {self.pruned['edges']} edges remain. Replacement score "
                   f"{s['replacement']:.2f}, completeness {s['completeness']:.2f}: "
                   f"{_replacement_verdict(s['replacement'])}.")
        out.append(self._trace_sentence())
        li = self.logit_inputs
        out.append(f"The logit's direct inputs: {li['feature']:.0%} from features, {li['error']:.0%} from error "
                   f"nodes, {li['token']:.0%} straight from token embeddings (through attention).")
        if self.top_path:
            out.append(f"Strongest path: {self.top_path}.")
        zeroed = "" if a.p_zeroed is None else f"; zeroing them instead gives {a.p_zeroed:.2f}"
        # 'still' only when the intervention left the model's top prediction where it was
        still = "still" if a.top_after == self.top_prediction else "now"
        out.append(f"Intervention: steering the {len(a.features)} features the graph says raise {self.target!r} "
                   f"most ({', '.join(a.features)}) to {a.scale:g}x their activation moves p({self.target!r}) "
                   f"from {a.p_before:.2f} to {a.p_replacement:.2f} in the replacement model and to "
                   f"{a.p_model:.2f} in the real model (attention free; {still} predicting {a.top_after!r}){zeroed}; "
                   f"steering {len(a.control)} other active features at the same layers and positions the same "
                   f"way gives {a.p_control:.2f}. {self._intervention_verdict()}")
        return out

    def _not_predicted(self) -> str:
        return (f"the model gives {self.target!r} only {self.p_target:.2f} (less than {PREDICTED:g}), so there is "
                "no prediction to explain")

    def _context_sentence(self) -> str:
        """p(target) from the last sentence alone against p with the earlier mentions."""
        p, alone = self.p_target, self.p_without_context
        head = f"Without the earlier mentions (the last sentence alone) it gives {alone:.2f}: "
        if not self.predicted:
            return head + f"nothing can be concluded about copying: {self._not_predicted()}."
        if alone < 0.5 * p:
            return head + (f"the context raises p({self.target!r}) from {alone:.2f} to {p:.2f}, so the prediction "
                           "comes from the context, not from the name's first piece alone.")
        if alone >= p:
            return head + ("the name's first piece predicts it at least as well alone, so this prompt does not "
                           "test copying from earlier.")
        return head + ("the context raises it less than twofold, so this prompt does not clearly test copying "
                       "from earlier.")

    def _trace_sentence(self) -> str:
        """Where the token nodes' influence on the target comes from: the focus positions, the last token, the rest."""
        focus, last, other = self.token_share["focus"], self.token_share["last"], self.token_share["other"]
        lead = (f"{self.focus[0].upper()}{self.focus[1:]} (positions {_positions(self.focus_positions)}) hold "
                f"{focus:.0%} of the token nodes' influence on {self.target!r}, the last token {last:.0%}")
        if not self.predicted:
            return lead + f"; nothing can be concluded about the prediction: {self._not_predicted()}."
        if self.mechanism == "name":
            most = f", though other positions hold more ({other:.0%})" if other > max(focus, last) else ""
            if focus > last:
                return lead + (": the graph traces more of the prediction to the earlier mention than to the last "
                               f"token{most}.")
            if last > focus:
                return lead + (": the graph traces more of the prediction to the last token than to the earlier "
                               f"mention{most}.")
            return lead + f": the earlier mention and the last token hold equal shares{most}."
        if focus + last > 0.5:
            return lead + ": the graph traces the prediction to the phrase itself."
        if focus + last < 0.5:
            return lead + ": most of the influence comes from outside the phrase."
        return lead + ": half of the influence comes from the phrase, half from outside it."

    def _intervention_verdict(self) -> str:
        a = self.ablation
        if not self.predicted:
            return f"Nothing can be concluded from it: {self._not_predicted()}."
        if a.confirms:
            control = (f"the control raises it" if a.control_drop < 0 else f"the control removes {a.control_drop:.0%}")
            return (f"This confirms that these features carry the prediction: they remove {a.drop:.0%} of "
                    f"p({self.target!r}), {control}.")
        if a.drop <= 0:
            return (f"This does not confirm the story: the intervention does not lower p({self.target!r}); "
                    f"{_carrier(self.logit_inputs)}.")
        if a.drop < CONFIRMS:
            return (f"This does not confirm the story: the intervention removes only {a.drop:.0%} of "
                    f"p({self.target!r}) (confirming takes {CONFIRMS:.0%}); {_carrier(self.logit_inputs)}.")
        return (f"This does not confirm the story: steering as many other active features at the same places removes "
                f"{a.control_drop:.0%} of p({self.target!r}), more than half of the {a.drop:.0%} these remove, so "
                "the graph did not single these out.")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ablation"] = {**asdict(self.ablation), "drop": round(self.ablation.drop, 4),
                         "control_drop": round(self.ablation.control_drop, 4), "confirms": self.confirmed}
        d["sentences"] = self.sentences()
        return d


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


def _carrier(logit_inputs: dict[str, float]) -> str:
    """What carries a prediction that survives a feature intervention: the largest kind of the logit's input."""
    kind = max(("token", "error", "feature"), key=lambda k: logit_inputs[k])
    share = f"{logit_inputs[kind]:.0%} of the logit's direct input"
    return {"token": f"{share} comes straight from the token embeddings through attention, which steering "
                     "features does not remove",
            "error": f"{share} comes from the error nodes, what the transcoders miss",
            "feature": f"the largest share of the logit's direct input, {logit_inputs[kind]:.0%}, comes from "
                       "features"}[kind]


def _replacement_verdict(replacement: float) -> str:
    """Who carries the influence by the replacement score (the share that does not pass through error nodes)."""
    if replacement > 0.5:
        return "the transcoders' features explain most of the influence"
    if replacement < 0.5:
        return ("the error nodes (what the transcoders miss) carry most of the influence, so the features "
                "tell only part of the story")
    return "the features and the error nodes carry equal shares of the influence"


def _loss_kept(tc: dict[str, Any]) -> str:
    """The share of the MLPs' contribution to the loss the transcoders keep, when the numbers can say it."""
    from circuitlab.dictionaries.metrics import loss_kept

    return loss_kept(tc["ce_loss_clean"], tc["ce_loss_spliced"], tc["ce_loss_zero"], tc["ce_loss_recovered"],
                     "the MLPs", "the MLPs'", "the transcoders")


def _positions(pos: list[int]) -> str:
    return ", ".join(str(p) for p in pos)


# ---------------------------------------------------------------------------- pipeline


def run_graphs_demo(opts: GraphsDemoOptions) -> GraphsDemoResult:
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
        "train": {"steps": steps, "batch_size": opts.model_batch, "seq_len": 64, "lr": 1e-2, "weight_decay": 0.05,
                  "warmup_steps": min(50, steps), "eval_every": max(1, steps // 2), "eval_batches": 4,
                  "ckpt_every": max(1, steps // 6), "track_every": steps, "log_every": max(1, steps // 50),
                  "seed": opts.seed}})


def train_model(opts: GraphsDemoOptions, out: Path):
    """The 2-layer model; resumes its checkpoint when opts.resume (a finished run is loaded as it is)."""
    return train_or_reuse(model_run_config(opts), out, opts.resume, opts.progress,
                          f"a 2-layer model with {opts.d_mlp}-neuron MLPs")


def train_transcoders(model, tokenizer, opts: GraphsDemoOptions, out: Path):
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
    if opts.transcoders == "clt":
        configs = [CLTConfig("topk", n_layers=L, d_model=model.cfg.d_model, d_sae=opts.d_sae, k=opts.k, skip=True,
                             base_model=base, metadata={"name": "clt"})]
        hooks = configs[0].hooks()
    else:
        configs = [DictionaryConfig("topk", d_in=model.cfg.d_model, d_sae=opts.d_sae, k=opts.k, skip=True,
                                    hook_name=f"blocks.{l}.ln2.hook_normalized", out_hook_name=f"blocks.{l}.hook_mlp_out",
                                    d_out=model.cfg.d_model, base_model=base, metadata={"name": f"transcoder-{l}"})
                   for l in range(L)]
        hooks = [h for c in configs for h in (c.hook_name, c.out_hook_name)]
    data = build_data(DataConfig.from_dict(_data_config(opts)), tokenizer=tokenizer)
    source = ModelActivations(model, hooks, data, seq_len=64, seqs_per_chunk=64, skip_positions=1)
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


@dataclass
class PromptSpec:
    """A prompt (tokens [pos]) whose next token `target` has a known mechanism; focus: the positions the
    story says the prediction comes from."""

    slug: str
    mechanism: str
    tokens: list[int]             # the document-start token (EOS, as between training documents), then the text
    target: int
    focus: str
    focus_positions: list[int]
    without_context: list[int] | None = None   # name: the last sentence alone (the same final tokens)


def demo_prompts(model, tokenizer, opts: GraphsDemoOptions) -> list[PromptSpec]:
    """The name prompt (of opts.n_names made-up names that split into several tokens the same way at every
    mention, the one the model completes with the highest probability), then the fixed phrases."""
    return [name_prompt(model, tokenizer, opts.n_names, opts.seed)] + [phrase_prompt(tokenizer, slug, text)
                                                                        for slug, text in PHRASES]


def name_prompt(model, tokenizer, n_names: int, seed: int = 0) -> PromptSpec:
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
        p = _probability(model, spec.tokens, spec.target)
        if spec.without_context is not None:
            p -= _probability(model, spec.without_context, spec.target)
        if p > best_p:
            best, best_p = spec, p
    if best is None:
        raise InputError("no made-up name splits into several tokens the same way at every mention")
    return best


def _doc_start(tokenizer) -> list[int]:
    """The token a document starts after in training (EOS ends every story), or none."""
    eos = getattr(tokenizer, "eos_id", None)
    return [] if eos is None else [eos]


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
    start = _doc_start(tokenizer)
    focus = [len(start) + i + j for i in earlier for j in range(len(piece))]
    alone = tokenizer.encode("One day," + text[-len(name) - 1:])
    return PromptSpec("name", "name", start + ids[:-1], ids[-1], f"the earlier mentions of {name!r}", focus,
                      start + alone[:-1] if alone[-len(piece):] == piece else None)


def phrase_prompt(tokenizer, slug: str, text: str) -> PromptSpec:
    ids = tokenizer.encode(text)
    phrase = text.rsplit(". ", 1)[-1]      # the phrase: the last sentence
    start = len(tokenizer.encode(text[:-len(phrase)])) if phrase != text else 0
    words = tokenizer.decode(ids[start:-2])
    doc = _doc_start(tokenizer)
    return PromptSpec(slug, "phrase", doc + ids[:-1], ids[-1], f"the phrase's earlier words {words.strip()!r}",
                      [len(doc) + i for i in range(start, len(ids) - 2)])   # the phrase before its last prompt token


@torch.no_grad()
def _probability(model, tokens: list[int], target: int) -> float:
    return float(model(torch.tensor([tokens]))[0, -1].softmax(-1)[target])


# ---------------------------------------------------------------------------- one graph


def explain(model, tc, tokenizer, spec: PromptSpec, out: Path | None, progress: bool = True,
            dashboard_tokens: int = 0) -> GraphFinding:
    """The graph of spec's target logit, its numbers, and the intervention that tests it; the graph's files
    (graph/, graph.json for Neuronpedia's viewer, graph.svg, report.* with the interactive viewer) in
    out/<slug> when out is given; dashboard_tokens: held-out tokens for the viewer's feature cards."""
    from circuitlab.experiments.graph_experiment import GraphResult, graph_feature_cards, write_graph_run
    from circuitlab.graphs import attribute
    from circuitlab.graphs.attribution_graph import normalized

    tokens = torch.tensor(spec.tokens)
    prompt = tokenizer.decode(spec.tokens[len(_doc_start(tokenizer)):])   # the text, without the document start
    target = tokenizer.decode([spec.target])
    graph = attribute(model, tc, tokens, targets=[spec.target], tokenizer=tokenizer, prompt=prompt,
                      progress=progress, verbose=False)
    pruned = graph.prune(0.8, 0.98)
    with torch.no_grad():
        probs = model(tokens[None])[0, -1].softmax(-1)
    p = float(probs[spec.target])
    rank = int((probs > probs[spec.target]).sum()) + 1
    infl = graph.node_influence()
    tok_infl = infl[graph.token_start:graph.logit_start].clamp(min=0)
    total = float(tok_infl.sum()) or 1.0
    last = graph.n_pos - 1
    focus = sum(float(tok_infl[i]) for i in spec.focus_positions) / total
    share = {"focus": round(focus, 4), "last": round(float(tok_infl[last]) / total, 4)}
    share["other"] = round(max(0.0, 1 - share["focus"] - share["last"]), 4)
    row = normalized(graph.adjacency.double())[graph.logit_start]
    logit_inputs = {"feature": round(float(row[:graph.error_start].sum()), 4),
                    "error": round(float(row[graph.error_start:graph.token_start].sum()), 4),
                    "token": round(float(row[graph.token_start:graph.logit_start].sum()), 4)}
    feat_infl = infl[:graph.n_features]
    order = feat_infl.argsort(descending=True).tolist()
    effects = graph.logit_effects()
    # the intervention's features: those the graph says RAISE the target most (influence ranks |edges|,
    # so its top features can be ones that lower the target)
    top = [i for i in effects.argsort(descending=True).tolist() if effects[i] > 0][:N_ABLATED]
    top_features = [{"label": graph.label(i), "influence": round(float(feat_infl[i]), 4),
                     "effect": round(float(effects[i]), 4),
                     "activation": round(float(graph.feature_activations[i]), 4),
                     **dict(zip(("layer", "pos", "feature"), graph.features[i].tolist()))} for i in order[:8]]
    paths = graph.top_paths(1, pruned)
    ablation = ablate(model, tc, tokens, spec.target, graph, top, tokenizer)
    finding = GraphFinding(
        spec.slug, spec.mechanism, prompt, target, round(p, 4), rank, tokenizer.decode([int(probs.argmax())]),
        {k: round(v, 4) for k, v in graph.scores().items()}, len(graph.active_features),
        {"nodes": int(pruned.node_mask.sum()), "features": int(pruned.node_mask[:graph.n_features].sum()),
         "edges": int(pruned.edge_mask.sum())},
        spec.focus, spec.focus_positions, share, logit_inputs, top_features,
        paths[0]["words"] if paths else "", ablation,
        round(_probability(model, spec.without_context, spec.target), 4) if spec.without_context else None)
    qk = []
    if spec.mechanism == "name":
        finding.heads, qk = name_heads(model, tc, tokenizer, graph, pruned, spec, tokens)
    cards = (graph_feature_cards(model, tc, graph, pruned, tokenizer, n_tokens=dashboard_tokens)
             if dashboard_tokens else {})
    if out is not None:
        run = GraphResult(graph, pruned, finding.sentences(), {
            "prompt": prompt, "graph": graph.summary(pruned), "finding": finding.to_dict(),
            "top_paths": [{"strength": x["strength"], "words": x["words"]} for x in paths]}, cards=cards, qk=qk)
        finding.files = str(write_graph_run(run, out / spec.slug, spec.slug, overwrite=True))
    finding.view = (graph, pruned, cards)   # for report.html's viewer (not a field: not in results.json)
    return finding


def name_heads(model, tc, tokenizer, graph, pruned, spec: PromptSpec, tokens: torch.Tensor
               ) -> tuple[dict[str, Any] | None, list[Any]]:
    """The head that carries the most influence from the name's earlier mentions to the last position (head
    loadings of the pruned graph, kept in its files) and its QK attribution there: which query and key parts
    made it attend to the earlier mention. (None, []) when no pruned edge crosses from a mention."""
    from circuitlab.graphs.heads import head_loadings, strongest_heads
    from circuitlab.graphs.qk import qk_attribution

    graph.loadings = head_loadings(model, tc, graph, pruned)
    last = graph.n_pos - 1
    found = [h for h in strongest_heads(graph, 50) if h["query_pos"] == last and h["key_pos"] in spec.focus_positions]
    if not found:
        return None, []
    h = found[0]
    qk = qk_attribution(model, tc, tokens, h["layer"], h["head"], last, h["key_pos"], tokenizer=tokenizer)
    soft = qk.key_softmax()
    words = (f"L{h['layer']}H{h['head']} carries the most from the earlier mention: {h['words']}. It attends "
             f"from the last position to {qk.key_token} @{h['key_pos']} with weight {soft['prob']:.2f} (rank "
             f"{soft['rank']}); its score there {qk.score:+.3g} comes most from "
             + "; ".join(p["words"] for p in qk.top_pairs(2)) + ".")
    return {"layer": h["layer"], "head": h["head"], "query_pos": last, "key_pos": h["key_pos"],
            "loading": h["loading"], "edge": h["edge"], "qk": qk.to_dict(5), "words": words}, [qk]


def ablate(model, tc, tokens: torch.Tensor, target: int, graph, nodes: list[int], tokenizer,
           scale: float = STEER) -> Ablation:
    """Steer the feature nodes `nodes` to scale x their activation at their positions: p(target) in the
    replacement model and the real model (attention free); the same with as many other active features at
    the same (layer, position) pairs (seeded: a control at the very places the graph points to); and the
    chosen features zeroed in the real model."""
    from circuitlab.graphs import Intervention, ReplacementModel

    rm = ReplacementModel(model, tc, tokens)

    def edit(rows: list[tuple[int, int, int]], **how: float) -> list[Intervention]:
        return [Intervention(layer=l, feature=f, pos=p, **how) for l, p, f in rows]

    def p_of(logits: torch.Tensor) -> float:
        return float(logits[0, -1].softmax(-1)[target])

    chosen = [tuple(graph.features[i].tolist()) for i in nodes]
    taken, places = set(chosen), {(c[0], c[1]) for c in chosen}
    others = [tuple(r) for r in graph.active_features.tolist() if tuple(r) not in taken and (r[0], r[1]) in places]
    control = random.Random(0).sample(others, min(len(chosen), len(others)))
    base = rm.run()
    replaced = rm.run(edit(chosen, scale=scale))
    real = rm.run(edit(chosen, scale=scale), mode="model", freeze_attention=False)
    ctrl = rm.run(edit(control, scale=scale), mode="model", freeze_attention=False)
    zeroed = rm.run(edit(chosen, value=0.0), mode="model", freeze_attention=False)
    label = lambda r: f"L{r[0]} F{r[2]} @{r[1]}"  # noqa: E731
    return Ablation([label(r) for r in chosen], round(p_of(base.logits), 4), round(p_of(replaced.logits), 4),
                    round(p_of(real.logits), 4), round(p_of(ctrl.logits), 4), [label(r) for r in control],
                    tokenizer.decode([int(real.logits[0, -1].argmax())]), scale, round(p_of(zeroed.logits), 4))


# ---------------------------------------------------------------------------- report


def write_graphs_report(result: GraphsDemoResult) -> None:
    """report.md, report.html and results.json in result.out (each written atomically)."""
    from circuitlab.viz.graph_view import graphs_demo_html, graphs_demo_markdown

    out = result.out
    atomic_write_text(out / "report.md", graphs_demo_markdown(result, out))
    atomic_write_text(out / "results.json", json_text(result.to_dict(), indent=2))
    atomic_write_text(out / "report.html", graphs_demo_html(result))
