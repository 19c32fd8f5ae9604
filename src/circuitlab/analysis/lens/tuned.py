# long module: the tuned lens in one place (translators, their two starts, resumable training, the held-out measures), read top to bottom
"""The tuned lens: one trained affine translator per layer, read through the final norm and unembedding.

    lens = train_tuned_lens(model, batches, steps=300)       # batches: token tensors [batch, pos]
    lens.save("runs/demo/2l/tuned_lens")                     # safetensors + JSON, beside the model
    both = compare_lenses(model, tokens, lens, tokenizer=tok)
    both.logit.kl_to_final.mean(-1), both.tuned.kl_to_final.mean(-1)    # [point] each

The logit lens reads the residual after layer l as if it were the last; the residual basis drifts
from layer to layer, so it is often wrong early. The tuned lens (Belrose et al. 2023) learns, for
every point but the last, x ↦ A x + b (A initialised at the identity, b at 0) so that
unembed(ln_final(A x + b)) matches the model's final distribution: the loss is KL(final ‖ lens),
summed over points and averaged over positions. The model is frozen and untouched.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.analysis.lens import LogitLens, lens_readout, logit_lens, residual_points
from circuitlab.analysis.patching.checks import one_sequence
from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.checks import COUNT, POSITIVE
from circuitlab.errors import CircuitlabError
from circuitlab.model import frozen_parameters, model_device
from circuitlab.perf import threads_for_work, transformer_step_flops
from circuitlab.training.interrupts import interrupted_message, stop_after_step_on_ctrl_c

if TYPE_CHECKING:
    from circuitlab.model import Transformer

# One training step's log-probabilities and the token batches held in memory are bounded by a training step's
# share of the memory budget (circuitlab.memory: the memory available now, or --memory): lens_budget().


def lens_budget() -> int:
    """Floats one training step may hold (the token batches, int64, count 2 floats a token)."""
    return memory.floats(memory.STEP_SHARE)


WEIGHTS_FILE, CONFIG_FILE = "tuned_lens.safetensors", "tuned_lens.json"
# Training's defaults, written once (`circuitlab lens train`'s: experiments/lens_train.LensTrainOptions reads them):
# optimizer steps, Adam's peak learning rate, the resumable state every SAVE_EVERY steps, token batches of
# BATCH_SIZE sequences of SEQ_LEN tokens.
STEPS, LR, SAVE_EVERY = 300, 1e-2, 100
BATCH_SIZE, SEQ_LEN = 16, 64


class TunedLens(nn.Module):
    """Translators for the residual points labels[:-1] ("embed", "L0", ...); the last point is the
    model's output and is read as it is. weight [point, d_model, d_model] (x @ weight + bias), bias
    [point, d_model]."""

    def __init__(self, labels: list[str], d_model: int, model_info: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.labels = list(labels)
        n = len(self.labels) - 1
        self.weight = nn.Parameter(torch.eye(d_model).repeat(n, 1, 1))
        self.bias = nn.Parameter(torch.zeros(n, d_model))
        self.model_info = model_info or {}
        self.train_info: dict[str, Any] = {}

    def translate(self, resid: torch.Tensor) -> torch.Tensor:
        """resid [point, ..., d_model] (all points, the last one the model's output) -> the same, the
        translators applied to every point but the last."""
        n = self.weight.shape[0]
        if resid.shape[0] != n + 1:
            raise CircuitlabError(f"the tuned lens has {n} translators; got {resid.shape[0]} residual points "
                                  f"(expected {n + 1})")
        shape = resid.shape
        flat = resid[:-1].reshape(n, -1, shape[-1])
        moved = torch.baddbmm(self.bias[:, None, :].to(flat.dtype), flat, self.weight.to(flat.dtype))
        return torch.cat([moved.reshape(n, *shape[1:-1], shape[-1]), resid[-1:]])

    def save(self, folder: str | Path) -> Path:
        """folder/tuned_lens.safetensors (weight, bias) and folder/tuned_lens.json (labels, training info)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {"weight": self.weight.detach().cpu().contiguous(), "bias": self.bias.detach().cpu().contiguous()}
        atomic_write_file(folder / WEIGHTS_FILE, lambda path: save_file(tensors, str(path)))
        meta = {"format": "circuitlab-tuned-lens-1", "labels": self.labels, "d_model": int(self.weight.shape[-1]),
                "model": self.model_info, "train": self.train_info}
        atomic_write_text(folder / CONFIG_FILE, json_text(meta, indent=1))
        return folder

    @staticmethod
    def exists(folder: str | Path) -> bool:
        """Whether folder holds a saved tuned lens."""
        return (Path(folder) / WEIGHTS_FILE).is_file() and (Path(folder) / CONFIG_FILE).is_file()

    @classmethod
    def load(cls, folder: str | Path, model: Transformer | None = None) -> "TunedLens":
        """A saved lens; with `model`, checked to fit it (same residual points and d_model)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / WEIGHTS_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
            raise CircuitlabError(f"{folder} holds no tuned lens (expected {WEIGHTS_FILE} and {CONFIG_FILE})")
        meta = json.loads((folder / CONFIG_FILE).read_text())
        lens = cls(meta["labels"], meta["d_model"], meta.get("model"))
        tensors = load_file(str(folder / WEIGHTS_FILE))
        with torch.no_grad():
            lens.weight.copy_(tensors["weight"])
            lens.bias.copy_(tensors["bias"])
        lens.train_info = meta.get("train", {})
        if model is not None:
            _check_fits(lens, model)
        return lens


def default_lens_dir(checkpoint: str | Path) -> Path:
    """Where a checkpoint's tuned lens is kept unless told otherwise: <run>/tuned_lens for a run folder,
    <checkpoint>-tuned_lens beside a checkpoint folder (a checkpoint save replaces its folder as a whole)."""
    from circuitlab.training.outputs import default_out

    inside = Path(checkpoint) / "tuned_lens"  # where lenses were kept before (still read)
    return inside if TunedLens.exists(inside) else default_out(checkpoint, "tuned_lens")


def _model_info(model: Transformer) -> dict[str, Any]:
    return {"n_layers": model.cfg.n_layers, "d_model": model.cfg.d_model, "d_vocab": model.cfg.d_vocab}


def _check_fits(lens: TunedLens, model: Transformer) -> None:
    labels = ["embed"] + [f"L{l}" for l in range(model.cfg.n_layers)] if model.cfg.n_layers else ["embed"]
    if lens.labels != labels or lens.weight.shape[-1] != model.cfg.d_model:
        raise CircuitlabError(f"this tuned lens was trained for {len(lens.labels) - 1} layers of d_model "
                              f"{lens.weight.shape[-1]}; the model has {model.cfg.n_layers} of {model.cfg.d_model}")


def _residual_stream(model: Transformer, tokens: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """(labels, residual points [point, batch, pos, d_model]), without gradients."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: "resid" in n or n in ("hook_embed", "hook_pos_embed"))
    return residual_points(model, cache)


def _lens_log_probs(model: Transformer, resid: torch.Tensor) -> torch.Tensor:
    return model.readout(resid).float().log_softmax(dim=-1)


def story_batches(tokenizer, n_batches: int = 8, batch_size: int = BATCH_SIZE, seq_len: int = SEQ_LEN, seed: int = 1
                  ) -> list[torch.Tensor]:
    """The built-in stories (seed 1: not the stories the demo trains on, seed 0) as token batches
    [batch_size, seq_len], documents joined by EOS."""
    from circuitlab.data import generate_stories, tokenize_documents

    need = n_batches * batch_size * seq_len
    tokens, n = None, 64
    while tokens is None or len(tokens) < need:
        tokens, _ = tokenize_documents(generate_stories(n, seed=seed), tokenizer)
        n *= 2
    flat = torch.from_numpy(tokens[:need].astype("int64"))
    return list(flat.view(n_batches, batch_size, seq_len))


def check_lens_batches(model: Transformer, n_batches: int, batch_size: int, seq_len: int) -> None:
    """Refuse, in one line naming the option, sizes whose memory passes the budget: one step holds every point's
    log-probabilities [point, batch, pos, d_vocab] (lens_budget() floats at most), and all batches are held
    as tokens (lens_budget() floats at most, 2 a token). Called before any data is built."""
    for name, value in (("batches", n_batches), ("batch_size", batch_size), ("seq_len", seq_len)):
        COUNT.check(value, name)
    points = model.cfg.n_layers + 2
    per_row = 3 * points * seq_len * model.cfg.d_vocab  # log-probs, their grads, the KL's terms
    budget = lens_budget()
    if batch_size * per_row > budget:
        raise CircuitlabError(f"batch_size {batch_size} x seq_len {seq_len} needs "
                              f"{batch_size * per_row * 4 / 2**30:.1f} GiB per step for this model's {points} points "
                              f"and {model.cfg.d_vocab} tokens (limit {memory.describe(memory.STEP_SHARE)}); give a "
                              f"batch_size of at most {max(1, budget // per_row)}")
    if 2 * n_batches * batch_size * seq_len > budget:
        raise CircuitlabError(f"batches {n_batches} x batch_size {batch_size} x seq_len {seq_len} is "
                              f"{n_batches * batch_size * seq_len} tokens, all held in memory (limit "
                              f"{budget // 2:,} tokens: {memory.describe(memory.STEP_SHARE)}); "
                              f"give at most {max(1, budget // (2 * batch_size * seq_len))} batches")


def lens_estimate(model: Transformer, batch_size: int, seq_len: int, steps: int = STEPS, n_batches: int = 1
                  ) -> memory.Estimate:
    """What train_tuned_lens on n_batches token batches [batch_size, seq_len] holds at its peak and computes:
    one step's log-probabilities at every point, their gradients and the KL's terms (float32), the translators
    with their gradients and Adam's moments, and the token batches. Each step: a forward pass of the model (no
    gradient), then every point translated and read out, forward and backward."""
    from circuitlab.perf import transformer_step_flops

    cfg = model.cfg
    points, rows = cfg.n_layers + 2, batch_size * seq_len
    # ~3.5 [batch, pos, d_vocab] float32 tensors per translated point (log-probabilities, the KL's terms, their
    # gradients; fitted to benchmarks/bench_scale.py on GPT-2 small, Qwen3-0.6B and Llama-3.2-1B: 0.96-1.05)
    parts = {"a step's log-probabilities and gradients": 3.5 * (points - 1) * rows * cfg.d_vocab * 4,
             "translators, gradients and Adam's moments": 4 * (cfg.n_layers + 1) * (cfg.d_model + 1) * cfg.d_model * 4,
             "token batches": n_batches * rows * 8}
    # the model's forward; each translated point read out forward and backward (the gradient to the translators
    # only: the unembedding is frozen), the read-out of the final point once
    per_step = (transformer_step_flops(cfg, rows, seq_len, backward=False)
                + 2 * (points - 2) * rows * 2 * cfg.d_model * (cfg.d_vocab + cfg.d_model))
    # large products (rows x d_vocab): measured at the matmul speed of 512 x 512 products or above (bench_scale.py)
    return memory.Estimate(f"tuned lens training ({steps} steps of {batch_size} x {seq_len} tokens, {points - 1} "
                           "translators)", parts, held=memory.tensor_bytes(model), flops=steps * per_step,
                           efficiency=1.0)


def data_fingerprint(batches: Sequence[torch.Tensor]) -> str:
    """A short hash of the token batches (a resume with other data is refused)."""
    import hashlib

    h = hashlib.sha256()
    for b in batches:
        h.update(str(tuple(b.shape)).encode())
        h.update(b.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


INITS = ("identity", "lstsq")
RIDGE = 1e-2   # the least-squares start's ridge, a share of each coordinate's second moment (SmolLM2's best)


class ResidualCache:
    """Every layer's residual stream of each distinct token batch, from one forward pass of the model (no
    gradient) the first time the batch is seen, kept for the batch's later steps when the batches' residuals fit
    lens_budget() (else computed again each time: the same numbers, a forward pass a step)."""

    def __init__(self, model: Transformer, batches: Sequence[torch.Tensor]) -> None:
        self.model, self.batches = model, batches
        per_token = (model.cfg.n_layers + 1) * model.cfg.d_model
        self.keep = sum(b.numel() for b in batches) * per_token <= lens_budget()
        self.held: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def __getitem__(self, i: int) -> torch.Tensor:
        """Batch i's residual points [point, batch, pos, d_model]."""
        if i in self.held:
            return self.held[i]
        tokens = self.batches[i]
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        _, resid = _residual_stream(self.model, tokens.to(model_device(self.model)))
        if self.keep:
            self.held[i] = resid
        return resid


@torch.no_grad()
def fit_lstsq(lens: TunedLens, residuals: ResidualCache, n_batches: int, ridge: float = RIDGE) -> None:
    """Set every translator to the least-squares affine map (float64 normal equations, a ridge of `ridge` x each
    coordinate's second moment) from its point's residual to the model's last residual scaled to unit RMS per
    token: the read-out normalises its input, so each token's scale is free and the direction is what is fitted.
    Each map is then scaled by its point's mean RMS (the same read-out, the identity's scale). One pass over the batches; d_model + 1 square systems, no read-out through the vocabulary."""
    n, d = lens.weight.shape[0], lens.weight.shape[-1]
    gram = torch.zeros(n, d + 1, d + 1, dtype=torch.float64)
    cross = torch.zeros(n, d + 1, d, dtype=torch.float64)
    rms, count = torch.zeros(n, dtype=torch.float64), 0
    for i in range(n_batches):
        resid = residuals[i]
        x = resid[:-1].reshape(n, -1, d).double().cpu()
        x = torch.cat([x, torch.ones(*x.shape[:2], 1, dtype=x.dtype)], -1)
        h = resid[-1].reshape(-1, d).double().cpu()
        target = h / h.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
        gram += x.transpose(1, 2) @ x
        cross += x.transpose(1, 2) @ target
        rms += x[..., :d].pow(2).mean(-1).sqrt().sum(-1)
        count += x.shape[1]
    if not (torch.isfinite(gram).all() and torch.isfinite(cross).all()):
        raise CircuitlabError("the residual stream holds non-finite values: no least-squares translators (use "
                              "init identity)")
    # the ridge: a share of each coordinate's own second moment (a few residual coordinates are far larger than
    # the rest: a ridge of one size for all would flatten the others); Cholesky, the systems being positive definite
    diag = torch.diagonal(gram, dim1=1, dim2=2)
    gram = gram + torch.diag_embed(ridge * diag + 1e-12 * diag.mean(-1, keepdim=True))
    factor, info = torch.linalg.cholesky_ex(gram)
    if int(info.max()):
        raise CircuitlabError("the residual stream's Gram matrix is singular: give more tokens or a larger ridge")
    # scaled to the point's mean RMS: the read-out normalises, so it reads the same, and the translator has the
    # identity's scale (Adam's steps after it are of the size they are from the identity)
    solved = torch.cholesky_solve(cross, factor) * (rms / count)[:, None, None]   # [point, d + 1, d]
    lens.weight.copy_(solved[:, :d].to(lens.weight))
    lens.bias.copy_(solved[:, d].to(lens.bias))


def train_tuned_lens(model: Transformer, batches: Sequence[torch.Tensor] | torch.Tensor, steps: int = STEPS,
                     lr: float = LR,
                     progress: bool = False, state_file: str | Path | None = None, save_every: int = SAVE_EVERY,
                     settings: dict[str, Any] | None = None, init: str = INITS[0]) -> TunedLens:
    """Train a TunedLens on token batches [batch, pos] (a sequence, cycled through; one tensor is one batch).

    Adam on Σ_points mean_positions KL(final ‖ translated point), lr warmed up over the first 10% of steps
    and decayed linearly to 0. The model's parameters are not touched (no gradient flows into them). Each
    batch's residual stream is computed once, all points at once, and reused at its later steps (ResidualCache:
    the same numbers as a forward pass a step). init: "identity" (A = I, b = 0: Belrose et al.'s) or "lstsq" (the
    least-squares translators, fit_lstsq, a closed form that needs no read-out: far fewer KL steps reach a low
    loss, the way to train on a large vocabulary in minutes).
    state_file: the training state (translators, Adam's moments, step) is written there atomically every
    save_every steps; when the file exists, training continues from it (same steps, lr and batches), and
    ends where an uninterrupted run would. The caller deletes it once the lens is saved. A resume whose
    steps, lr, data (a fingerprint of the batches) or `settings` (the caller's names for what made the data,
    e.g. {"--seq-len": 64}) differ is refused, naming them. A first Ctrl-C finishes the step, saves the state
    and stops (KeyboardInterrupt saying the step and how to continue).
    """
    steps = COUNT.check(steps, "steps")
    lr = POSITIVE.check(lr, "lr")
    if init not in INITS:
        raise CircuitlabError(f"init must be one of {', '.join(INITS)}; got {init!r}")
    save_every = COUNT.check(save_every, "save_every")
    if model.cfg.n_layers == 0:
        raise CircuitlabError("a tuned lens translates each layer's residual: this model has no layers")
    batches = [batches] if isinstance(batches, torch.Tensor) else batches
    if len(batches) == 0:
        raise CircuitlabError("the tuned lens needs training data: got no token batches")
    device = model_device(model)
    labels = ["embed"] + [f"L{l}" for l in range(model.cfg.n_layers)]
    lens = TunedLens(labels, model.cfg.d_model, _model_info(model)).to(device)
    opt = torch.optim.Adam(lens.parameters(), lr=lr)
    warmup = max(1, steps // 10)
    for b in batches:
        b = b[None] if b.dim() == 1 else b
        check_lens_batches(model, 1, b.shape[0], b.shape[1])
    settings = {"steps": steps, "lr": lr, "n_batches": len(batches), "data": data_fingerprint(batches),
                **({"init": init} if init != "identity" else {}), **(settings or {})}
    start, saved_step = 0, None
    losses: list[float] = []
    residuals = ResidualCache(model, batches)
    if state_file is not None and Path(state_file).is_file():
        start, losses = _load_training_state(Path(state_file), lens, opt, settings)
        saved_step = start
    elif init == "lstsq":
        fit_lstsq(lens, residuals, len(batches))
    bar = tqdm(range(start, steps), total=steps, initial=start, desc="tuned lens", disable=not progress)
    rows = max(b.numel() for b in batches)
    step_flops = transformer_step_flops(model.cfg, rows, max(b.shape[-1] for b in batches))
    with threads_for_work(step_flops), frozen_parameters(model), stop_after_step_on_ctrl_c() as stop:
        for step in bar:
            resid = residuals[step % len(batches)]
            with torch.no_grad():
                final = _lens_log_probs(model, resid[-1])  # [batch, pos, d_vocab]
            pred = _lens_log_probs(model, lens.translate(resid)[:-1])  # [point, batch, pos, d_vocab]
            kl = (final.exp() * (final - pred)).sum(-1).mean(dim=(1, 2))  # [point]
            loss = kl.sum()
            for group in opt.param_groups:
                group["lr"] = lr * min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if state_file is not None and step + 1 < steps and ((step + 1) % save_every == 0 or stop.is_set()):
                _save_training_state(Path(state_file), lens, opt, settings, step + 1, losses)
                saved_step = step + 1
            if stop.is_set() and step + 1 < steps:
                bar.close()
                raise KeyboardInterrupt(interrupted_message(step + 1, saved_step, state_file))
    lens.train_info = {"steps": steps, "lr": lr, "final_loss": losses[-1], "first_loss": losses[0],
                       **({"init": init} if init != "identity" else {})}
    return lens.eval()


def _save_training_state(path: Path, lens: TunedLens, opt: torch.optim.Optimizer, settings: dict[str, Any],
                         step: int, losses: list[float]) -> None:
    """One safetensors file (atomic): translators, Adam's moments; step and settings in its metadata."""
    from safetensors.torch import save_file

    tensors = {"weight": lens.weight.detach().cpu().contiguous(), "bias": lens.bias.detach().cpu().contiguous()}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"adam.{i}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    meta = {"step": str(step), "settings": json_text(settings), "losses": json_text([losses[0], losses[-1]]),
            "labels": json_text(lens.labels)}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_file(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def _named_data_change(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """The data fingerprint differs because a named setting does (that one is named instead)."""
    return any(saved.get(k) != now.get(k) for k in set(saved) | set(now) if k not in ("data", "steps", "lr"))


def _load_training_state(path: Path, lens: TunedLens, opt: torch.optim.Optimizer, settings: dict[str, Any]
                         ) -> tuple[int, list[float]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    saved = json.loads(meta.get("settings", "{}"))
    if json.loads(meta.get("labels", "[]")) != lens.labels:
        raise CircuitlabError(f"the unfinished training in {path} is for a model with points {meta.get('labels')}; "
                              "resume it with that model, or start over (--overwrite)")
    changed = [f"{k} ({saved.get(k)!r} -> {settings.get(k)!r})" for k in sorted(set(saved) | set(settings))
               if saved.get(k) != settings.get(k) and not (k == "data" and _named_data_change(saved, settings))]
    if changed:
        raise CircuitlabError(f"cannot resume the training in {path} with other settings: {', '.join(changed)}; "
                              "resume with the settings it started with, or start over (--overwrite)")
    device = lens.weight.device
    with torch.no_grad():
        lens.weight.copy_(tensors["weight"])
        lens.bias.copy_(tensors["bias"])
    state = opt.state_dict()
    for key, value in tensors.items():
        if key.startswith("adam."):
            _, i, name = key.split(".", 2)
            value = value if name == "step" else value.to(device)
            state["state"].setdefault(int(i), {})[name] = value
    opt.load_state_dict(state)
    first, last = json.loads(meta["losses"])
    return int(meta["step"]), [first, last]


@dataclass
class LensComparison:
    """The logit lens and the tuned lens on the same sequence, with the same read-outs (LogitLens each:
    top tokens, entropy, probability of the final answer, kl_to_final [point, pos])."""

    logit: LogitLens
    tuned: LogitLens

    def mean_kl(self) -> dict[str, list[Any]]:
        """Per point, KL to the final distribution averaged over positions."""
        logit, tuned = self.logit.kl_to_final, self.tuned.kl_to_final
        assert logit is not None and tuned is not None  # both lenses are read against the final distribution
        return {"labels": self.logit.labels, "logit": logit.mean(-1).tolist(), "tuned": tuned.mean(-1).tolist()}

    def table(self) -> str:
        kl = self.mean_kl()
        rows = [f"{'point':<8}{'logit lens KL':>15}{'tuned lens KL':>15}"]
        rows += [f"{lab:<8}{a:>15.4f}{b:>15.4f}" for lab, a, b in zip(kl["labels"], kl["logit"], kl["tuned"])]
        return "\n".join(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"logit": self.logit.to_dict(), "tuned": self.tuned.to_dict(), "mean_kl": self.mean_kl()}

    def _repr_html_(self) -> str:
        # The KL table, then each lens as it displays (its registered figure in a notebook; circuitlab.display).
        return f"<pre>{self.table()}</pre>" + self.logit._repr_html_() + self.tuned._repr_html_()


@torch.no_grad()
def tuned_lens(model: Transformer, tokens: torch.Tensor, lens: TunedLens, k: int = 5, tokenizer=None) -> LogitLens:
    """The tuned lens's read-outs on one sequence, tokens [pos] (as logit_lens, through the translators)."""
    _check_fits(lens, model)
    tokens = one_sequence(model, tokens, "the tuned lens")
    labels, resid = _residual_stream(model, tokens[None])
    logits = model.readout(lens.to(tokens.device).translate(resid[:, 0]))
    return lens_readout(labels, tokens, logits, k, tokenizer, name="tuned lens")


def compare_lenses(model: Transformer, tokens: torch.Tensor, lens: TunedLens, k: int = 5,
                   tokenizer=None) -> LensComparison:
    """Logit lens and tuned lens side by side on one sequence tokens [pos]."""
    return LensComparison(logit_lens(model, tokens, k, tokenizer), tuned_lens(model, tokens, lens, k, tokenizer))


@torch.no_grad()
def mean_kl_to_final(model: Transformer, batches: Iterable[torch.Tensor] | torch.Tensor, lens: TunedLens | None = None
                     ) -> torch.Tensor:
    """KL(final ‖ lens) per residual point [point], averaged over every position of the batches
    (held-out data); lens None = the logit lens."""
    total, count = None, 0
    device = model_device(model)
    for tokens in ([batches] if isinstance(batches, torch.Tensor) else batches):
        tokens = (tokens[None] if tokens.dim() == 1 else tokens).to(device)
        _, resid = _residual_stream(model, tokens)
        if lens is not None:
            resid = lens.to(device).translate(resid)
        logp = _lens_log_probs(model, resid)
        kl = (logp[-1].exp() * (logp[-1] - logp)).sum(-1).sum(dim=(1, 2))
        total = kl if total is None else total + kl
        count += tokens.numel()
    if total is None:
        raise CircuitlabError("mean_kl_to_final got no token batches")
    return (total / count).cpu()


@torch.no_grad()
def held_out_agreement(model: Transformer, batches: Iterable[torch.Tensor] | torch.Tensor,
                       lenses: dict[str, TunedLens | None]) -> dict[str, dict[str, torch.Tensor]]:
    """For each lens by name (None = the logit lens), per residual point [point]: "kl", KL(final ‖ lens) averaged
    over every position of the batches (as mean_kl_to_final), and "top1", the share of positions where the lens's
    top token is the model's final top token. One forward pass per batch serves every lens; the points are read
    out one at a time (a [batch, pos, d_vocab] read-out at once, not one per point)."""
    device = model_device(model)
    sums: dict[str, dict[str, torch.Tensor]] = {}
    count = 0
    for tokens in ([batches] if isinstance(batches, torch.Tensor) else batches):
        tokens = (tokens[None] if tokens.dim() == 1 else tokens).to(device)
        _, resid = _residual_stream(model, tokens)
        final = _lens_log_probs(model, resid[-1])   # [batch, pos, d_vocab]
        p, top = final.exp(), final.argmax(-1)
        for name, lens in lenses.items():
            moved = resid if lens is None else lens.to(device).translate(resid)
            kl, agree = torch.zeros(len(moved), dtype=torch.float64), torch.zeros(len(moved), dtype=torch.float64)
            for i, point in enumerate(moved):
                logp = _lens_log_probs(model, point)
                kl[i] = float((p * (final - logp)).sum(-1).sum())
                agree[i] = float((logp.argmax(-1) == top).sum())
            got = sums.setdefault(name, {"kl": torch.zeros_like(kl), "top1": torch.zeros_like(agree)})
            got["kl"] += kl
            got["top1"] += agree
        count += tokens.numel()
    if not count:
        raise CircuitlabError("held_out_agreement got no token batches")
    return {name: {k: v / count for k, v in got.items()} for name, got in sums.items()}
