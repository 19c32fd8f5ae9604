"""The training loop: AdamW, warmup + cosine, clipping, accumulation, optional bf16 autocast,
eval, metrics tracked by the caller's probes, atomic resumable checkpoints, DDP under torchrun.

    result = train(RunConfig.load("configs/demo.yaml"), "runs/demo")

Resuming continues the identical loss curve: batches are a function of (seed, split, step),
and the checkpoint holds the optimizer, the RNG and the step.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.atomic import old_copy
from circuitlab.data import build_data
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.model import Transformer
from circuitlab.perf import ThreadGovernor, transformer_step_flops
from circuitlab.spec import Options, option
import circuitlab.training.distributed as D
from circuitlab.training.checkpoint import (find_checkpoint, is_checkpoint, load_checkpoint, load_training_state,
                                            save_checkpoint)
from circuitlab.training.outputs import check_writable
from circuitlab.training.run_log import METRICS_FILE, truncate_metrics
from circuitlab.training.config import RunConfig
from circuitlab.training.config_files import resolve_config
from circuitlab.training.schedule import lr_at
from circuitlab.training.sinks import open_sinks
from circuitlab.training.interrupts import interrupted_message, stop_after_step_on_ctrl_c
from circuitlab.training.tracking import Probe, run_probes


class TrainingDiverged(CircuitlabError):
    pass


RESUME = "train(..., resume=True)"  # how a Python caller continues an interrupted run


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: the step in progress was finished and saved; the message says how to go on."""


@dataclass(frozen=True)
class TrainOptions(Options):
    """What `circuitlab train` takes, declared once (circuitlab.spec): each flag's default, rule and help; train()'s
    keyword defaults read it."""

    config: str | Path = option(None, required=True, help="a YAML run config, or the name of one in configs/")
    overrides: tuple[str, ...] = option((), repeat=True, flag="--set", metavar="KEY=VALUE",
                                        help="override a config field, e.g. train.lr=3e-4 or model.n_layers=1 "
                                             "(repeatable); train.log=tensorboard (or wandb, or tensorboard,wandb) also "
                                             "logs there besides metrics.jsonl")
    out: str | Path | None = option(None, help="run directory (default runs/<config name>)")
    resume: bool = option(False, help="continue from the run directory's checkpoint")
    progress: bool = option(True, flag="--no-progress", help="no progress bar")

    def load_config(self) -> RunConfig:
        """The run config (a path, or a name in configs/ or the bundled ones) with the overrides applied."""
        return RunConfig.load(resolve_config(str(self.config)), list(self.overrides))

    def out_folder(self, run: RunConfig) -> str:
        """--out, or runs/<the config's name>."""
        return str(self.out) if self.out else f"runs/{run.name}"


@dataclass
class TrainResult:
    out_dir: Path
    model: Transformer
    tokenizer: Any
    steps: int
    tokens_seen: int
    final_loss: float
    best_val_loss: float
    seconds: float


def train(run: RunConfig, out_dir: str | Path, resume: bool = TrainOptions.resume,
          progress: bool = TrainOptions.progress,
          stop_at: int | None = None, track: Sequence[Probe] = ()) -> TrainResult:
    """Train run's model into out_dir (checkpoint/, best/, metrics.jsonl, run.yaml).

    A new run needs an absent or empty out_dir; resume continues its checkpoint. Ctrl-C finishes
    the current step, saves a checkpoint and raises TrainingInterrupted (a KeyboardInterrupt).

    track: probes (model, data) -> dict of JSON-able values, run at step 0 and every
    train.track_every steps into metrics.jsonl (e.g. circuitlab.analysis.heads.induction.training_probes).

    stop_at: stop (with a checkpoint) after this many steps, as if interrupted; the schedule
    still follows train.steps, so a later resume continues the same curve.

    CPU threads: train.threads, else $CIRCUITLAB_THREADS, else one for a small step, else re-decided between steps
    by the cores other processes leave free (circuitlab.perf.ThreadGovernor);
    torch's count is restored on return.
    """
    before = torch.get_num_threads()
    try:
        return _train(run, out_dir, resume=resume, progress=progress, stop_at=stop_at, track=track)
    finally:
        torch.set_num_threads(before)  # train.threads (or the choice by work size) only while training


# What one training process may hold (floats; float32 = 4 bytes): refused in one line before anything is
# allocated, naming the setting, rather than a traceback from the allocator or the out-of-memory killer.
# parameters: with gradients and Adam's two moments, 4 floats each, within the memory budget (circuitlab.memory);
# activations one micro-batch keeps for its backward pass: a share of it


def params_limit() -> int:
    """Parameters a training process may hold: 16 bytes each (weights, gradients, Adam's two moments) in the budget."""
    return memory.budget_bytes() // 16


def step_budget() -> int:
    return memory.floats(memory.STEP_SHARE)


def check_training_size(cfg, rows: int, seq_len: int) -> None:
    """A one-line ConfigError when the model (cfg) or one micro-batch of rows x seq_len tokens would pass
    params_limit() or step_budget() (estimates from the config: circuitlab.perf)."""
    from circuitlab.perf import transformer_params, transformer_step_floats

    params = transformer_params(cfg)
    if params > params_limit():
        raise ConfigError(f"the model would have about {params:,} parameters: training holds 4 floats each "
                          f"(weights, gradients, Adam's two moments), {params * 16 / 2**30:,.1f} GiB, over the "
                          f"memory budget of {memory.gib(memory.budget_bytes())} ({memory.source()}); make it smaller (model.d_model, n_layers, "
                          "d_mlp, n_ctx (train.seq_len by default), the vocabulary)")
    need = transformer_step_floats(cfg, rows, seq_len)
    budget = step_budget()
    if need > budget:
        fit = budget // max(1, transformer_step_floats(cfg, 1, seq_len))
        fix = (f"give train.batch_size at most {fit} per process and grad_accum step (or raise train.grad_accum)"
               if fit >= 1 else "give a shorter train.seq_len")
        raise ConfigError(f"train.batch_size x train.seq_len = {rows:,} x {seq_len:,} tokens a step need about "
                          f"{need * 4 / 2**30:,.1f} GiB of activations for this model (limit "
                          f"{memory.describe(memory.STEP_SHARE)}); {fix}")


def _train(run: RunConfig, out_dir: str | Path, resume: bool = False, progress: bool = True,
           stop_at: int | None = None, track: Sequence[Probe] = ()) -> TrainResult:
    t = run.train
    out_dir = Path(out_dir)
    rank, world, device = D.setup(t.device)
    if t.batch_size % (world * t.grad_accum):
        raise CircuitlabError(f"train.batch_size ({t.batch_size}) must be divisible by "
                              f"world size x grad_accum ({world} x {t.grad_accum})")
    if not resume:
        _check_fresh(out_dir)
    ckpt = find_checkpoint(out_dir, resumable=True) if resume else None
    model, tokenizer, data = _model_and_data(run, ckpt, device, world)
    model.train()
    # the thread count by the work of one forward-backward, re-decided between steps as other processes come
    # and go (perf.ThreadGovernor; train() restores torch's count on return)
    threads = ThreadGovernor(transformer_step_flops(model.cfg, t.batch_size // world // t.grad_accum * t.seq_len,
                                                    t.seq_len), t.threads or None).start()
    optimizer = make_optimizer(model, t)
    start, tokens_seen, best_val = 0, 0, math.inf
    if ckpt is not None:
        start, tokens_seen, best_val = _restore_state(ckpt, optimizer, t.steps, out_dir)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "run.yaml").write_text(_yaml(run.to_dict()))
        truncate_metrics(out_dir, after_step=start)
    loop = _Loop(run, out_dir, model, tokenizer, data, optimizer, track, (rank, world, device), start,
                 tokens_seen, best_val, saved_step=start if ckpt is not None else None)
    if start == 0:
        loop.log({"step": 0, "tokens": 0, **run_probes(model, data, track)})
    end = min(t.steps, stop_at) if stop_at is not None else t.steps
    loss_value = loop.run(start, end, threads, progress)
    D.teardown()
    return TrainResult(out_dir, model.eval(), tokenizer, end, loop.tokens_seen, loss_value, loop.best_val,
                       time.time() - loop.t0)


def _model_and_data(run: RunConfig, ckpt: Path | None, device: Any, world: int) -> tuple[Transformer, Any, Any]:
    """(model, tokenizer, data): the checkpoint's model and tokenizer (a resumed run keeps its saved tokenizer)
    or a new model seeded by train.seed; the micro-batch checked against the memory budget before allocating."""
    t = run.train
    model = tokenizer = None
    if ckpt is not None:
        model, tokenizer, _ = load_checkpoint(ckpt, device)
    with D.rank_zero_first():
        data = build_data(run.data, tokenizer=tokenizer)
    if model is None:
        tokenizer = data.tokenizer
        cfg = run.model_config(tokenizer.vocab_size)
        check_training_size(cfg, t.batch_size // world // t.grad_accum, t.seq_len)   # before allocating
        torch.manual_seed(t.seed)
        model = Transformer(cfg).to(device)
    else:
        check_training_size(model.cfg, t.batch_size // world // t.grad_accum, t.seq_len)
    return model, tokenizer, data


def _restore_state(ckpt: Path, optimizer: torch.optim.Optimizer, steps: int, out_dir: Path) -> tuple[int, int, float]:
    """(step, tokens seen, best validation loss) of the checkpoint, its optimizer state loaded into optimizer."""
    state = load_training_state(ckpt, optimizer)
    start, tokens_seen, best_val = state["step"], state["tokens_seen"], state["best_val_loss"]
    best_val = math.inf if best_val is None else best_val   # no evaluation yet: written as null (strict JSON)
    if start >= steps:
        raise CircuitlabError(f"{out_dir} already finished {start} steps; raise train.steps to continue")
    return start, tokens_seen, best_val


class _Loop:
    """The steps of one training run and what they carry between them: the tokens seen, the best validation
    loss, the step of the last checkpoint (for an interrupt's message), the metric sinks (rank 0 only)."""

    def __init__(self, run: RunConfig, out_dir: Path, model: Transformer, tokenizer: Any, data: Any,
                 optimizer: torch.optim.Optimizer, track: Sequence[Probe], where: tuple[int, int, Any], start: int,
                 tokens_seen: int, best_val: float, saved_step: int | None) -> None:
        self.config, self.t, self.out_dir = run, run.train, out_dir
        self.model, self.tokenizer, self.data, self.optimizer, self.track = model, tokenizer, data, optimizer, track
        self.rank, self.world, self.device = where
        self.tokens_seen, self.best_val, self.saved_step = tokens_seen, best_val, saved_step
        t = self.t
        self.ddp_model = D.wrap(model, self.device)
        self.tokens_per_step = t.batch_size * t.seq_len
        self.micro = t.batch_size // self.world // t.grad_accum
        self.autocast = (torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16)
                         if t.bf16 else contextlib.nullcontext())
        self.run_dict = run.to_dict()
        self.sinks = (open_sinks(out_dir, t.log, run.name, self.run_dict, resume_step=start)
                      if self.rank == 0 else None)
        self.end = t.steps
        self.t0 = time.time()
        self.bar: Any = None

    def log(self, record: dict[str, Any]) -> None:
        if self.sinks is not None:
            self.sinks.write(record)

    def checkpoint(self, step_done: int) -> None:
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            _diverged(self.out_dir, step_done, "a weight", float("nan"))
        if self.rank == 0:
            save_checkpoint(self.out_dir / "checkpoint", self.model, self.tokenizer, self.run_dict, self.optimizer,
                            {"step": step_done, "tokens_seen": self.tokens_seen, "best_val_loss": self.best_val})
        self.saved_step = step_done

    def run(self, start: int, end: int, threads: ThreadGovernor, progress: bool) -> float:
        """Steps start..end-1; the last step's loss. Ctrl-C finishes the step in progress, saves and raises
        TrainingInterrupted; the sinks are closed whatever happens."""
        t = self.t
        self.bar = tqdm(total=t.steps, initial=start, disable=not progress or self.rank != 0, desc=self.config.name,
                        unit="step")
        self.t0, loss_value = time.time(), float("nan")
        self.end = end
        step = start
        # DDP ranks would see a Ctrl-C at different steps and wait on each other: there, Ctrl-C stops at once
        on_ctrl_c = contextlib.nullcontext(threading.Event()) if self.world > 1 else stop_after_step_on_ctrl_c()
        try:
            with on_ctrl_c as interrupted:
                for step in range(start, end):
                    if interrupted.is_set():
                        self.bar.close()
                        if step > start:  # the state in memory is that of a complete step: keep it
                            self.checkpoint(step)
                        raise TrainingInterrupted(interrupted_message(step, self.saved_step,
                                                                      self.out_dir / "checkpoint", RESUME))
                    threads.step()
                    loss_value = self.one_step(step)
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C, mid-step: the last checkpoint is as it was
            raise TrainingInterrupted(interrupted_message(step, self.saved_step, self.out_dir / "checkpoint",
                                                          RESUME)) from None
        finally:
            self.bar.close()
            if self.sinks is not None:
                self.sinks.close()
        return loss_value

    def one_step(self, step: int) -> float:
        """Train step `step` (0-based); log, evaluate and save as scheduled. Returns the loss."""
        t, model, optimizer = self.t, self.model, self.optimizer
        lr = lr_at(step, t.lr, t.warmup_steps, t.steps, t.min_lr_frac)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = self.data.get_batch("train", step, t.batch_size, t.seq_len, self.rank, self.world).to(self.device)
        loss_sum = torch.zeros((), device=self.device)
        for i, chunk in enumerate(batch.split(self.micro)):
            sync = i == t.grad_accum - 1
            with (contextlib.nullcontext() if sync else D.no_sync(self.ddp_model)), self.autocast:
                loss = D.loss(self.ddp_model, chunk) / t.grad_accum
            loss.backward()
            loss_sum += loss.detach()
        loss_value = D.mean(loss_sum).item()
        # clip_grad_norm_ with an infinite bound just measures the norm
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or math.inf).item()
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            self.bar.close()
            _diverged(self.out_dir, step, "loss" if not math.isfinite(loss_value) else "gradient norm",
                      loss_value if not math.isfinite(loss_value) else grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.tokens_seen += self.tokens_per_step
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.1e}")
        self.after_step(step + 1, loss_value, lr, grad_norm)
        return loss_value

    def after_step(self, done: int, loss_value: float, lr: float, grad_norm: float) -> None:
        """What is due after `done` steps: the metrics record, evaluation (and best/), the probes, checkpoint/."""
        t = self.t
        record: dict[str, Any] = {}
        if done % t.log_every == 0 or done == t.steps:
            record.update(loss=round(loss_value, 5), lr=lr, grad_norm=grad_norm,
                          elapsed=round(time.time() - self.t0, 2))
        if done % t.eval_every == 0 or done == t.steps:
            val = validation_loss(self.model, self.data, t, self.rank, self.world, self.device)
            record.update(val_loss=round(val, 5), val_ppl=round(math.exp(min(val, 50)), 3))
            if val < self.best_val:
                self.best_val = val
                if self.rank == 0:
                    save_checkpoint(self.out_dir / "best", self.model, self.tokenizer, self.run_dict)
        if self.track and (done % t.track_every == 0 or done == t.steps):
            record.update(run_probes(self.model, self.data, self.track))
        if record:
            self.log({"step": done, "tokens": self.tokens_seen, **record})
        if done % t.ckpt_every == 0 or done == self.end:
            self.checkpoint(done)


def _diverged(out_dir: Path, step: int, what: str, value: float) -> None:
    last = "checkpoint/ is kept" if (out_dir / "checkpoint").exists() else "no checkpoint was written yet"
    raise TrainingDiverged(f"training diverged: {what} became {value} at step {step}; stopped without saving "
                           f"({last}). Try a lower train.lr, or train.grad_clip=1.0")


def make_optimizer(model: Transformer, t) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on biases and norm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2))


@torch.no_grad()
def validation_loss(model: Transformer, data, t, rank: int = 0, world: int = 1, device: str = "cpu") -> float:
    """Mean val loss over t.eval_batches fixed batches (the same ones every time)."""
    model.eval()
    total = torch.zeros((), device=device)
    for i in range(t.eval_batches):
        total += model.loss(data.get_batch("val", i, t.batch_size, t.seq_len, rank, world).to(device))
    model.train()
    return D.mean(total).item() / t.eval_batches


def _check_fresh(out_dir: Path) -> None:
    """A new run starts in an absent or empty folder: never over another run's files (nor its
    checkpoint.old, which may be the only copy a crash left)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CircuitlabError(f"{out_dir} is a file; give a folder for the run with --out")
    check_writable(out_dir, "the run")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    held = [p.name for p in sorted(out_dir.iterdir())]
    if any(is_checkpoint(p) for p in (out_dir / "checkpoint", old_copy(out_dir / "checkpoint"))):
        done = _finished_steps(out_dir)
        if done is not None:   # a finished run is never called unfinished
            raise CircuitlabError(f"{out_dir} already holds a checkpoint of a finished run ({done} steps); choose "
                                  "another --out, or raise train.steps and pass --resume to train it on")
        raise CircuitlabError(f"{out_dir} already holds a checkpoint; pass --resume to continue it, "
                              "or choose another --out")
    if any(is_checkpoint(out_dir / name) for name in held):
        raise CircuitlabError(f"{out_dir} holds a model ({', '.join(n for n in held if is_checkpoint(out_dir / n))}) "
                              "but no checkpoint to resume; choose another --out, or move the folder away")
    # A run that stopped before its first save leaves only these; starting it again loses nothing.
    unsaved = {"run.yaml", METRICS_FILE}
    others = [n for n in held if n not in unsaved and not n.startswith((".checkpoint.tmp-", ".best.tmp-"))]
    if others:
        raise CircuitlabError(f"{out_dir} already holds other files ({', '.join(others[:4])}); "
                              "choose a new or empty --out")


def _finished_steps(out_dir: Path) -> int | None:
    """The steps of the run in out_dir when its checkpoint reached the run's own train.steps, else None."""
    from circuitlab.training.checkpoint import read_checkpoint_meta, read_trainer_state

    import warnings

    try:
        with warnings.catch_warnings():   # a checkpoint.old is warned about where it is used, not here
            warnings.simplefilter("ignore")
            step = int((read_trainer_state(out_dir) or {})["step"])
            planned = int(read_checkpoint_meta(out_dir)["run"]["train"]["steps"])
    except (CircuitlabError, KeyError, TypeError, ValueError):
        return None
    return step if step >= planned else None


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
