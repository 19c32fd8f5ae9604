"""Linear probes on the residual stream: what can be read off each layer with a linear map?

    data = random_sequences(model.cfg.d_vocab, n_batches=16, batch=32, pos=64)
    res = train_probes(model, data, ["prev_token", "repeat", "position"])
    res["prev_token"].val_score          # [point]: accuracy before layer 0, 1, ..., after the last
    res["prev_token"].selectivity()      # accuracy minus the random-label control's

A probe is a logistic regression (classification tasks) or a linear regression (n_classes == 0)
per residual point, trained with Adam on activations computed batch by batch: only one batch of
activations is ever in memory, at the cost of one forward pass per batch and epoch.

Train/val split: in every batch the last val_fraction of the sequences are held out (whole
sequences, so no position of a held-out sequence is seen in training). Control (Hewitt & Liang,
2019, with random labels): each example also gets a label drawn by shuffling the batch's labels
with a seed fixed per batch, so it is the same in every epoch; a probe trained on those can only
learn the label frequencies. Selectivity = val score - control val score: high means the
representation, not the probe's capacity, explains the score.

Built-in tasks: "prev_token" (the token 1 position back; "prev_token_2" for 2 back, ...),
"repeat" (does this token occur earlier in the sequence), "position" (the position as a class),
"position_value" (the position by linear regression, scored by R²).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from circuitlab.checks import DEFAULT_SEED
from circuitlab.analysis.patching import as_tokens, rounded
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.model.hooks import act_name
from circuitlab.perf import threads_for_work

if TYPE_CHECKING:
    from circuitlab.model import Transformer

Data = torch.Tensor | Iterable[torch.Tensor] | Callable[[], Iterable[torch.Tensor]]



# ---------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class ProbeTask:
    """labels(tokens [batch, pos]) -> (labels [batch, pos], valid [batch, pos] bool); n_classes 0 = regression."""

    name: str
    labels: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    n_classes: int


def prev_token_task(d_vocab: int, n: int = 1) -> ProbeTask:
    """Class = the token n positions back (positions < n have none and are skipped)."""
    def labels(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros_like(tokens)
        out[:, n:] = tokens[:, :-n]
        valid = torch.zeros_like(tokens, dtype=torch.bool)
        valid[:, n:] = True
        return out, valid
    return ProbeTask("prev_token" if n == 1 else f"prev_token_{n}", labels, d_vocab)


def repeat_task() -> ProbeTask:
    """Class 1 if the token occurs earlier in its sequence, else 0."""
    def labels(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        same = tokens[:, :, None] == tokens[:, None, :]  # [batch, query, key]
        earlier = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).tril(-1)
        return (same & earlier).any(-1).long(), torch.ones_like(tokens, dtype=torch.bool)
    return ProbeTask("repeat", labels, 2)


def position_task(n_ctx: int, regression: bool = False) -> ProbeTask:
    """The position of each token: a class out of n_ctx, or a number (regression)."""
    def labels(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        return (pos.float() if regression else pos), torch.ones_like(tokens, dtype=torch.bool)
    return ProbeTask("position_value" if regression else "position", labels, 0 if regression else n_ctx)


BUILTIN_TASKS = ("prev_token", "repeat", "position", "position_value")


def builtin_task(model: Transformer, name: str) -> ProbeTask:
    """A built-in task by name: prev_token, prev_token_<n>, repeat, position, position_value."""
    m = re.fullmatch(r"prev_token(?:_(\d+))?", name)
    if m:
        n = int(m.group(1) or 1)
        if n < 1:
            raise CircuitlabError(f"probing task {name!r}: the offset must be at least 1")
        return prev_token_task(model.cfg.d_vocab, n)
    if name == "repeat":
        return repeat_task()
    if name in ("position", "position_value"):
        return position_task(model.cfg.n_ctx, regression=name == "position_value")
    raise CircuitlabError(f"unknown probing task {name!r}; built-in tasks: prev_token (prev_token_<n> for n back), "
                          "repeat, position, position_value, or pass a ProbeTask")


# ---------------------------------------------------------------------------- data


def random_sequences(d_vocab: int, n_batches: int = 16, batch: int = 32, pos: int = 64, seed: int = DEFAULT_SEED,
                     tiled: bool = True) -> Callable[[], Iterable[torch.Tensor]]:
    """A re-playable stream of n_batches token batches [batch, pos], the same on every pass.

    tiled: random segments repeated a few times (so "repeat" has both classes and induction heads
    have work); otherwise uniform random tokens.
    """
    from circuitlab.data.synthetic import tiled_random_segments

    def stream() -> Iterable[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(n_batches):
            if tiled:
                yield tiled_random_segments(batch, pos, d_vocab, gen, min_len=max(2, pos // 8),
                                            max_len=max(2, pos // 4))
            else:
                yield torch.randint(0, d_vocab, (batch, pos), generator=gen)
    return stream


def _passes(data: Data, batch_size: int, n: int) -> Callable[[], Iterable[torch.Tensor]]:
    """A function giving a fresh iteration over the data, n times in all."""
    if isinstance(data, torch.Tensor):
        if data.dim() != 2:
            raise CircuitlabError(f"probe data must be tokens [n_sequences, pos], got shape {tuple(data.shape)}")
        return lambda: data.split(batch_size)
    if callable(data):
        return data
    if n > 1 and iter(data) is data:
        raise CircuitlabError("probe data is a one-shot iterator but training needs several passes: pass a list "
                              "of batches, a token tensor, or a function returning a fresh iterator")
    return lambda: data


# ---------------------------------------------------------------------------- probes


@dataclass
class ProbeResult(Displayed):
    """Probe scores per residual point (point i = the residual stream before layer i; the last is
    after the final layer).

    score: "accuracy" (classification) or "r2" (regression). train_score, val_score, control_score
    [point]: control_score is the random-label control's val score (NaN without a control).
    chance: the val score of always predicting the most frequent training class (0 for r2).
    """

    task: str
    points: list[str]
    score: str
    train_score: torch.Tensor
    val_score: torch.Tensor
    control_score: torch.Tensor
    chance: float
    n_train: int
    n_val: int

    def selectivity(self) -> torch.Tensor:
        """val_score - control_score [point]."""
        return self.val_score - self.control_score

    def best(self) -> tuple[str, float]:
        """The point with the highest val score, and that score."""
        i = int(self.val_score.argmax())
        return self.points[i], float(self.val_score[i])

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "points": self.points, "score": self.score,
                "train_score": rounded(self.train_score), "val_score": rounded(self.val_score),
                "control_score": rounded(self.control_score), "selectivity": rounded(self.selectivity()),
                "chance": round(self.chance, 6), "n_train": self.n_train, "n_val": self.n_val}



def probe_points(model: Transformer) -> list[str]:
    """Hook names of the residual stream before each layer and after the last: n_layers + 1 points."""
    L = model.cfg.n_layers
    if L == 0:
        raise CircuitlabError("the model has no layers: probe its embeddings with a one-layer model instead")
    return [act_name("resid_pre", l) for l in range(L)] + [act_name("resid_post", L - 1)]


class _Probes:
    """One linear map per point, trained together: W [point, d_model, out], b [point, out]."""

    def __init__(self, n_points: int, d_model: int, n_out: int, lr: float, device: torch.device) -> None:
        self.W = torch.zeros(n_points, d_model, n_out, device=device, requires_grad=True)
        self.b = torch.zeros(n_points, n_out, device=device, requires_grad=True)
        self.opt = torch.optim.Adam([self.W, self.b], lr=lr)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [point, n, d_model] -> [point, n, out]."""
        return torch.einsum("pnd,pdk->pnk", x, self.W) + self.b[:, None]


def _loss(out: torch.Tensor, y: torch.Tensor, classify: bool) -> torch.Tensor:
    """Summed over points of the mean loss. out [point, n, out]; y [n]."""
    if classify:
        return F.cross_entropy(out.flatten(0, 1), y.repeat(out.shape[0]), reduction="mean") * out.shape[0]
    return ((out[..., 0] - y) ** 2).mean(dim=1).sum()


def train_probes(model: Transformer, data: Data,
                 tasks: Sequence[str | ProbeTask] | str | ProbeTask = BUILTIN_TASKS[:3], *,
                 points: Sequence[str] | None = None, epochs: int = 4, steps_per_batch: int = 4,
                 lr: float = 0.02, val_fraction: float = 0.25, control: bool = True, batch_size: int = 32,
                 seed: int = DEFAULT_SEED, progress: bool = True) -> dict[str, ProbeResult]:
    """Train linear probes for every task at every residual point, on activations streamed batch by batch.

    data: token batches [batch, pos]: a tensor [n_sequences, pos] (split into batch_size rows), a list
    of batches, or a function returning a fresh iterator (e.g. random_sequences(...)); passes must
    give the same batches in the same order (the control labels are seeded per batch).
    tasks: built-in names (BUILTIN_TASKS) or ProbeTask objects. points: hook names to probe
    (default probe_points(model)). Each batch's activations get steps_per_batch Adam steps.
    Returns {task name: ProbeResult} with scores [point].
    """
    if isinstance(tasks, (str, ProbeTask)):
        tasks = [tasks]
    task_list = [t if isinstance(t, ProbeTask) else builtin_task(model, t) for t in tasks]
    if not task_list:
        raise CircuitlabError("train_probes needs at least one task")
    points = list(points) if points is not None else probe_points(model)
    missing = [p for p in points if p not in model.hook_points()]
    if missing:
        raise CircuitlabError(f"no such hook point(s) to probe: {', '.join(missing)} (model.hook_names() lists all)")
    if not 0 < val_fraction < 1:
        raise CircuitlabError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    if epochs < 1 or steps_per_batch < 1:
        raise CircuitlabError("epochs and steps_per_batch must be at least 1")
    stream = _passes(data, batch_size, epochs + 1)
    device = model_device(model)
    d = model.cfg.d_model
    state: dict[str, dict[str, Any]] = {}

    def batches(desc: str):
        for i, tokens in enumerate(tqdm(stream(), desc=desc, unit="batch", delay=2.0, disable=not progress)):
            tokens = as_tokens(model, tokens, "probe data")
            B = tokens.shape[0]
            n_val = math.ceil(val_fraction * B)
            if n_val >= B:
                raise CircuitlabError(f"a probe batch of {B} sequence(s) cannot be split {1 - val_fraction:.0%} "
                                      f"train / {val_fraction:.0%} val: use batches of at least 2 sequences")
            _, cache = model.run_with_cache(tokens, names_filter=points)
            acts = torch.stack([cache[p] for p in points]).float()  # [point, batch, pos, d_model]
            yield i, tokens, acts, B - n_val

    def examples(task: ProbeTask, i: int, tokens: torch.Tensor, acts: torch.Tensor, n_train: int):
        """{split: (features [point, n, d_model] normalised, labels [n], control labels [n])}."""
        labels, valid = task.labels(tokens)
        control_labels = _shuffled(labels, valid, seed * 100_003 + i)
        s = state[task.name]
        out = {}
        for split, rows in (("train", slice(0, n_train)), ("val", slice(n_train, None))):
            keep = valid[rows]
            x, y, yc = acts[:, rows][:, keep], labels[rows][keep], control_labels[rows][keep]
            if "mean" not in s and len(y):  # normalise with the first labelled (training) examples' statistics
                s["mean"], s["std"] = x.mean(dim=1, keepdim=True), x.std(dim=1, keepdim=True).clamp(min=1e-5)
                y_float = y.float()
                s["y_mean"], s["y_std"] = y_float.mean(), y_float.std().nan_to_num(1.0).clamp(min=1e-5)
            if not len(y):
                out[split] = (x, y, yc)
                continue
            if not task.n_classes:
                y, yc = (y.float() - s["y_mean"]) / s["y_std"], (yc.float() - s["y_mean"]) / s["y_std"]
            out[split] = ((x - s["mean"]) / s["std"], y, yc)
        return out

    for task in task_list:
        n_out = task.n_classes or 1
        state[task.name] = {"probe": _Probes(len(points), d, n_out, lr, device),
                            "control": _Probes(len(points), d, n_out, lr, device) if control else None}

    # many small Adam steps on [point, rows, d_model] features: one thread unless the rows are many
    max_classes = max(task.n_classes or 1 for task in task_list)
    with threads_for_work(6.0 * len(points) * d * max_classes * batch_size * model.cfg.n_ctx):
        _fit_probes(task_list, state, batches, examples, epochs, steps_per_batch)
    return _evaluate(task_list, state, batches, examples, points)


def _fit_probes(tasks, state, batches, examples, epochs: int, steps_per_batch: int) -> None:
    """Every probe (and control) over the training split of each batch, epoch by epoch."""
    for epoch in range(epochs):
        for i, tokens, acts, n_train in batches(f"probes, epoch {epoch + 1}/{epochs}"):
            for task in tasks:
                x, y, yc = examples(task, i, tokens, acts, n_train)["train"]
                if not len(y):
                    continue
                s = state[task.name]
                for probe, target in ((s["probe"], y), (s["control"], yc)):
                    if probe is None:
                        continue
                    for _ in range(steps_per_batch):
                        probe.opt.zero_grad()
                        _loss(probe(x), target, bool(task.n_classes)).backward()
                        probe.opt.step()


@torch.no_grad()
def _evaluate(tasks, state, batches, examples, points) -> dict[str, ProbeResult]:
    """One more pass: scores on the train and val splits, and the control's on val.

    Accumulates, per task and split: the example count, correct predictions (or squared errors)
    per point, and the label counts (or label sum and sum of squares, for R²'s total variance).
    """
    P = len(points)
    acc: dict[str, dict[str, dict[str, Any]]]
    acc = {t.name: {split: {"n": 0, "score": torch.zeros(P), "control": torch.zeros(P),
                            "counts": torch.zeros(max(t.n_classes, 1)), "sum": 0.0, "sumsq": 0.0}
                    for split in ("train", "val")} for t in tasks}
    for i, tokens, acts, n_train in batches("probes, evaluating"):
        for task in tasks:
            s, classify = state[task.name], bool(task.n_classes)
            for split, (x, y, yc) in examples(task, i, tokens, acts, n_train).items():
                a = acc[task.name][split]
                if not len(y):
                    continue
                a["n"] += len(y)
                a["score"] += _score_sums(s["probe"](x), y, classify)
                if s["control"] is not None:
                    a["control"] += _score_sums(s["control"](x), yc, classify)
                if classify:
                    a["counts"] += torch.bincount(y.cpu(), minlength=task.n_classes)[: task.n_classes].float()
                else:
                    a["sum"] += float(y.sum())
                    a["sumsq"] += float((y ** 2).sum())
    results = {}
    for task in tasks:
        tr, va = acc[task.name]["train"], acc[task.name]["val"]
        if not tr["n"] or not va["n"]:
            raise CircuitlabError(f"probing task {task.name!r} found no labelled examples in the "
                                  f"{'train' if not tr['n'] else 'val'} split; give longer or more sequences")
        if task.n_classes:
            score, chance = "accuracy", float(va["counts"][tr["counts"].argmax()] / va["n"])
            train, val, ctrl = tr["score"] / tr["n"], va["score"] / va["n"], va["control"] / va["n"]
        else:  # the sums are squared errors: R² = 1 - SSE / SST
            score, chance = "r2", 0.0
            sst = {k: max(a["sumsq"] - a["sum"] ** 2 / a["n"], 1e-12) for k, a in (("train", tr), ("val", va))}
            train = 1 - tr["score"] / sst["train"]
            val, ctrl = 1 - va["score"] / sst["val"], 1 - va["control"] / sst["val"]
        if state[task.name]["control"] is None:
            ctrl = torch.full((P,), float("nan"))
        results[task.name] = ProbeResult(task.name, _point_labels(points), score, train, val, ctrl, chance,
                                         tr["n"], va["n"])
    return results


def _score_sums(out: torch.Tensor, y: torch.Tensor, classify: bool) -> torch.Tensor:
    """Per point: the number of correct predictions, or the sum of squared errors. out [point, n, out]."""
    if classify:
        return (out.argmax(-1) == y).float().sum(dim=1).cpu()
    return ((out[..., 0] - y) ** 2).sum(dim=1).cpu()


def _shuffled(labels: torch.Tensor, valid: torch.Tensor, seed: int) -> torch.Tensor:
    """Control labels: the valid labels of the batch shuffled by a seeded permutation."""
    gen = torch.Generator().manual_seed(seed)
    out = labels.clone()
    flat = labels[valid]
    out[valid] = flat[torch.randperm(len(flat), generator=gen).to(flat.device)]
    return out


def _point_labels(points: Sequence[str]) -> list[str]:
    """"blocks.2.hook_resid_pre" -> "L2 in"; "blocks.2.hook_resid_post" -> "L2 out"; others unchanged."""
    out = []
    for p in points:
        m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|post)", p)
        out.append(f"L{m.group(1)} {'in' if m.group(2) == 'pre' else 'out'}" if m else p)
    return out


def train_probe(model: Transformer, data: Data, task: str | ProbeTask, **kwargs: Any) -> ProbeResult:
    """train_probes for one task; returns its ProbeResult."""
    task = task if isinstance(task, ProbeTask) else builtin_task(model, task)
    return train_probes(model, data, [task], **kwargs)[task.name]
