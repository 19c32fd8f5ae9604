"""`circuitlab lens train`: a tuned lens for a checkpoint, trained on built-in stories or a text file, saved
beside the checkpoint, and measured against the logit lens on held-out stories.

    found = train_lens(LensTrainOptions(checkpoint="runs/demo/2l", steps=300))
    found.folder           # <checkpoint>/tuned_lens (tuned_lens.safetensors, tuned_lens.json)
    found.tuned_kl         # [point]: KL to the final distribution per layer, nats per token (found.logit_kl beside)
    add_arguments(parser, LensTrainOptions); LensTrainOptions.from_args(args)   # `lens train`'s flags (circuitlab.spec)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from circuitlab.analysis.lens import tuned
from circuitlab.checks import COUNT, POSITIVE
from circuitlab.spec import Options, option

if TYPE_CHECKING:
    from circuitlab.model import Transformer

STATE_FILE = "training_state.safetensors"  # inside the output folder while training; removed at the end


@dataclass(frozen=True)
class LensTrainOptions(Options):
    """What `circuitlab lens train` takes, declared once (circuitlab.spec): its flags, their rules and defaults
    (training's own: steps, lr, batch size, sequence length and save interval are analysis/lens/tuned.py's)."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    out: str | Path | None = option(None, help="folder for the lens (default: <checkpoint>/tuned_lens; beside a "
                                               "checkpoint folder when given one: <checkpoint>-tuned_lens)")
    steps: int = option(tuned.STEPS, COUNT, help="optimizer steps (default {default})")
    lr: float = option(tuned.LR, POSITIVE, help="Adam's peak learning rate (default {default})")
    batches: int = option(16, COUNT, help="distinct token batches, cycled through (default {default})")
    init: str = option(tuned.INITS[0], choices=tuned.INITS,
                       help="the translators' start: identity (Belrose et al.) or lstsq (least squares onto the last "
                            "residual: far fewer steps are needed on a deep model; default {default})")
    batch_size: int = option(tuned.BATCH_SIZE, COUNT, help="sequences per batch (default {default})")
    seq_len: int = option(tuned.SEQ_LEN, COUNT, help="tokens per sequence (default {default}, capped by the context)")
    text: str | None = option(None, help="a UTF-8 text file to train on (default: built-in stories the demo "
                                         "did not train on)")
    save_every: int = option(tuned.SAVE_EVERY, COUNT, help="write the resumable training state every N steps")
    resume: bool = option(False, help="continue the unfinished training in --out")
    overwrite: bool = option(False, help="replace a lens (or an unfinished training) in --out")
    progress: bool = option(True, flag="--no-progress", help="no progress bar (and no estimate before the work)")


@dataclass
class LensTrainResult:
    folder: Path
    lens: object                     # the TunedLens
    labels: list[str]                # the points read (the lens's labels without the final one)
    logit_kl: list[float]            # KL to the final distribution per point on held-out stories (nats per token)
    tuned_kl: list[float]


def _text_batches(path: str, tokenizer, n_batches: int, batch_size: int, seq_len: int) -> list:
    """[n][batch_size, seq_len] token batches from a text file (as many as it holds, up to n_batches)."""
    import torch

    from circuitlab.errors import CircuitlabError
    from circuitlab.textfile import read_text

    ids = tokenizer.encode(read_text(path, "--text file"))
    per_batch = batch_size * seq_len
    n = min(n_batches, len(ids) // per_batch)
    if n == 0:
        raise CircuitlabError(f"{path} has {len(ids)} tokens; one batch needs {per_batch} (--batch-size × --seq-len)")
    return list(torch.tensor(ids[:n * per_batch]).view(n, batch_size, seq_len))


def lens_train_estimate(opts: LensTrainOptions, model: Transformer | None = None):
    """What train_lens(opts) would hold and take (circuitlab.memory.Estimate, timed), with the sizes checked;
    nothing is read beyond the checkpoint, nothing written (`circuitlab lens train --estimate`)."""
    from circuitlab.analysis.lens.tuned import check_lens_batches, lens_estimate
    from circuitlab.training import load_checkpoint

    opts = opts.check()
    if model is None:
        model, _, _ = load_checkpoint(str(opts.checkpoint))
    seq = min(opts.seq_len, model.cfg.n_ctx)
    check_lens_batches(model, opts.batches, opts.batch_size, seq)
    return lens_estimate(model, opts.batch_size, seq, opts.steps, opts.batches).timed()


def train_lens(opts: LensTrainOptions) -> LensTrainResult:
    """Train (or, with opts.resume, continue) a tuned lens and save it in opts.out; refuses in one line an output
    inside a checkpoint folder, an unfinished training without --resume/--overwrite, an existing lens."""
    from circuitlab.analysis.lens.tuned import (TunedLens, check_lens_batches, default_lens_dir, mean_kl_to_final,
                                                story_batches, train_tuned_lens)
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_writable, default_out, inside_checkpoint

    opts = opts.check()   # one line naming the option for a value out of range
    out = Path(opts.out) if opts.out else default_lens_dir(opts.checkpoint)
    ckpt = inside_checkpoint(out)
    if ckpt is not None:  # a checkpoint save replaces its folder as a whole: the lens would be lost
        raise CircuitlabError(f"{out} is inside the checkpoint folder {ckpt}; give another --out "
                              f"(e.g. {default_out(ckpt, 'tuned_lens')})")
    check_writable(out, "the tuned lens")
    state = out / STATE_FILE
    if opts.resume and not state.is_file():
        if TunedLens.exists(out):   # a finished training is never called unfinished
            raise CircuitlabError(f"{out} holds a finished tuned lens: nothing to resume; pass --overwrite to train "
                                  "a new one, or choose another --out")
        raise CircuitlabError(f"nothing to resume in {out} (no {STATE_FILE})")
    if not opts.resume and not opts.overwrite:
        if state.is_file():
            raise CircuitlabError(f"{out} holds an unfinished training: pass --resume to continue it, or --overwrite")
        if TunedLens.exists(out):
            raise CircuitlabError(f"{out} already holds a tuned lens: pass --overwrite to replace it, or choose --out")
    if opts.overwrite and not opts.resume:
        state.unlink(missing_ok=True)
    model, tok, _ = load_checkpoint(str(opts.checkpoint))
    if tok is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot encode training text")
    seq = min(opts.seq_len, model.cfg.n_ctx)
    check_lens_batches(model, opts.batches, opts.batch_size, seq)  # before the data is built
    if opts.progress:   # what it will hold and take, before the work
        print(lens_train_estimate(opts, model).line(), flush=True)
    if opts.text:
        batches = _text_batches(opts.text, tok, opts.batches, opts.batch_size, seq)
    else:
        batches = story_batches(tok, n_batches=opts.batches, batch_size=opts.batch_size, seq_len=seq)
    if opts.resume:
        print(f"resuming the training in {out}")
    # the options that made the data, by name: a resume with other values is refused naming them
    made_by = {"--batches": opts.batches, "--batch-size": opts.batch_size, "--seq-len": seq, "--text": opts.text}
    lens = train_tuned_lens(model, batches, steps=opts.steps, lr=opts.lr, progress=opts.progress,
                            state_file=state, save_every=opts.save_every, settings=made_by,
                            init=opts.init)
    lens.model_info["checkpoint"] = str(opts.checkpoint)
    lens.train_info.update(data=opts.text or "built-in stories (seed 1)", batches=len(batches),
                           batch_size=opts.batch_size, seq_len=seq)
    lens.save(out)
    state.unlink(missing_ok=True)
    held_out = story_batches(tok, n_batches=2, batch_size=8, seq_len=seq, seed=2)
    logit, tuned = mean_kl_to_final(model, held_out), mean_kl_to_final(model, held_out, lens)
    return LensTrainResult(out, lens, list(lens.labels[:-1]), logit.tolist(), tuned.tolist())
