"""Hand-built vs trained: train a small model on the addition task and compare it with the carry adder.

    results = run_forge_compare("runs/forge-compare")      # trains (~20 s on one CPU core), compares, writes
    results["accuracy"], results["agreement"], results["findings"]
    run_forge_compare(**ForgeCompareOptions(steps=3000, seed=1).to_dict())   # the command's options, declared once

What goes into the output folder:
    trained/              the trained model's run (the project trainer's checkpoint/, metrics.jsonl, run.yaml)
    results.json          accuracies, per-head attention agreement, OV alignment, where each head attends
    attention_mean.png    each head's mean attention at the answer positions, hand-built above, trained below
    attention_example.png the same on one problem
    similarity.png        agreement and OV alignment of every hand-built head with every trained head
    training.png          the training loss and the held-out loss
    report.md             the numbers, the figures, and what the trained model does differently, in words

Every sentence of the report is computed from the measured numbers (summarize_comparison and
findings), so it holds for whatever model the training produced, not just the one documented.
The same functions compare any model that writes the answer as tokens in the task format.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitlab.atomic import json_text
from circuitlab.checks import COUNT, DEFAULT_SEED, INT, Number
from circuitlab.data.dataset import AdditionData
from circuitlab.data.sources import ADDITION_MAX_DIGITS
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.experiments.forge_findings import findings
from circuitlab.forge.adder import EOS, Adder, TokenAdder, add_digits, build_carry_adder, digits_of
from circuitlab.forge.compare import (COMPARE_SAMPLES, _all_heads, _label, addition_problems, answer_agreement,
                                      check_token_adder, ov_alignment, ov_subspace, query_patterns)
from circuitlab.model.transformer import Transformer
from circuitlab.perf import threads_for_work, transformer_step_flops
from circuitlab.report.markdown import forge_compare_markdown
from circuitlab.spec import Options, option
from circuitlab.training.outputs import check_writable
from circuitlab.viz.forge_compare import write_comparison_figures

Head = tuple[int, int]

DEFAULT_STEPS = 2000     # 2+2 digits: every answer right for seeds 0..3, ~20 s on one CPU core (docs/forge.md)
EXHAUSTIVE_PAIRS = 100_000  # accuracy on every pair up to this many, else on Adder.check's random pairs
# Problems the attention is compared on: both models' attention on all of them is held at once (100,000 took
# over 3 GB; 20,000 0.85 GB).
SAMPLES = Number(int, low=1, high=50_000, why="both models' attention on every problem is held at once")
CATEGORIES = ("a, same column", "b, same column", "lower columns", "higher columns", "EOS", "answer digits")

# What each head of the hand-built carry adder does, by design (build_carry_adder's docstring).
CARRY_ROLES = {
    (0, 0): "head a: fetches the digit of a in the answer's column",
    (0, 1): "head b: fetches the digit of b in the answer's column",
    (1, 0): "carry head: looks up the carry flag of the nearest lower column that is not a 9",
}
DIGITS = Number(int, low=1, high=ADDITION_MAX_DIGITS, why="the addition data's limit")


@dataclass(frozen=True)
class ForgeCompareOptions(Options):
    """What `circuitlab forge compare` takes, declared once (circuitlab.spec): each flag's default, rule and help;
    run_forge_compare's keywords. check() says a bad digit count, step count or seed in the training config's words
    (addition_run_config's), then applies every field's rule."""

    out: str | Path = option("runs/forge-compare",
                             help="output folder (default {default}); the trained model goes to OUT/trained")
    digits: int = option(2, DIGITS, arg=int, help=f"digits of a (default {{default}}, at most {ADDITION_MAX_DIGITS})")
    digits_b: int | None = option(None, DIGITS, arg=int, help="digits of b (default: same as --digits)")
    steps: int = option(DEFAULT_STEPS, COUNT, arg=int,
                        help="training steps (default {default}: every 2+2-digit answer right for seeds 0..3)")
    seed: int = option(DEFAULT_SEED, INT, arg=int, help="seed of the training and of the test problems")
    samples: int = option(COMPARE_SAMPLES, SAMPLES, arg=int, help=f"random problems the attention is compared on "
                                                        f"(default {{default}}, at most {SAMPLES.high})")
    retrain: bool = option(False, help="train again even if OUT/trained holds a model (it is replaced)")
    progress: bool = option(True, flag="--no-progress", help="no progress bar while training")

    def check(self, error: type[Exception] = InputError) -> ForgeCompareOptions:
        try:
            _check_digits(self.digits, self.digits_b)
            _check_training(self.steps, self.seed)
        except CircuitlabError as e:   # a config's error class (from_dict) where one is asked for
            raise error(str(e)) from None
        return super().check(error)


DEFAULTS = ForgeCompareOptions()



# ---------------------------------------------------------------------- training
def addition_run_config(n_digits_a: int = DEFAULTS.digits, n_digits_b: int | None = None,
                        steps: int = DEFAULTS.steps, seed: int = DEFAULTS.seed) -> Any:
    """The RunConfig of the trained adder: 2 layers of 2 heads (the hand-built adder's shape), d_model 64,
    MLPs of 256, on data source addition:N:M, one problem per row, on one CPU thread."""
    from circuitlab.training.config import RunConfig

    n, m = _check_digits(n_digits_a, n_digits_b)
    _check_training(steps, seed)
    row = n + m + 1 + max(n, m) + 1
    return RunConfig(
        name=f"adder-{n}+{m}",
        model={"n_layers": 2, "n_heads": 2, "d_model": 64, "d_mlp": 256},
        data={"source": f"addition:{n}:{m}", "seed": seed},  # type: ignore[arg-type]  # __post_init__ builds it
        train={"steps": steps, "batch_size": 64, "seq_len": row - 1, "lr": 3e-3,  # type: ignore[arg-type]  # ditto
               "warmup_steps": min(100, max(1, steps // 10)), "eval_every": max(1, steps // 10), "eval_batches": 4,
               "ckpt_every": steps, "track_every": steps, "log_every": max(1, steps // 100), "seed": seed,
               "device": "cpu", "threads": 1},
        description=f"a small transformer trained on {n}-digit + {m}-digit addition, for `circuitlab forge compare`")


def _check_digits(n: Any, m: Any) -> tuple[int, int]:
    m = n if m is None else m
    for name, v in (("digits", n), ("digits of b", m)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= ADDITION_MAX_DIGITS:
            raise CircuitlabError(f"{name} must be a whole number from 1 to {ADDITION_MAX_DIGITS} (the addition data's "
                                  f"limit), got {v!r}")
    return n, m


def _check_training(steps: Any, seed: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise CircuitlabError(f"steps must be a positive whole number, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CircuitlabError(f"seed must be a whole number, got {seed!r}")


def _json_roundtrip(d: dict) -> dict:
    return json.loads(json_text(d))


def train_addition_model(run: Any, out_dir: str | Path, retrain: bool = False,
                         progress: bool = True) -> tuple[Transformer, dict[str, Any]]:
    """Train run into out_dir with the project trainer, or reuse the model already there when it was
    trained with the same settings. Returns (model on CPU, eval mode; info: reused, seconds, losses)."""
    from circuitlab.atomic import old_copy
    from circuitlab.training import load_checkpoint, read_metrics, train
    from circuitlab.training.checkpoint import is_checkpoint

    out_dir = Path(out_dir)
    saved = any(is_checkpoint(p) for p in (out_dir / "checkpoint", old_copy(out_dir / "checkpoint")))
    if saved and not retrain:
        model, _, meta = load_checkpoint(out_dir)
        if meta.get("run") != _json_roundtrip(run.to_dict()):
            raise CircuitlabError(f"{out_dir} holds a model trained with other settings; pass --retrain to replace "
                                  "it, or choose another --out")
        reused, seconds = True, None
    else:
        if retrain and out_dir.exists():  # asked for; otherwise the trainer refuses a folder it would overwrite
            shutil.rmtree(out_dir)
        result = train(run, out_dir, progress=progress)
        model, reused, seconds = result.model.cpu().eval(), False, result.seconds
    metrics = read_metrics(out_dir)
    losses = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
    vals = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
    return model, {"reused": reused, "seconds": seconds, "final_loss": losses[-1][1] if losses else None,
                   "final_val_loss": vals[-1][1] if vals else None, "loss_curve": losses, "val_curve": vals}


# ---------------------------------------------------------------------- positions and where heads attend
def position_labels(n: int, m: int) -> list[str]:
    """Names of the positions a model reads (the last answer digit is never fed back):
    a1 a0 b1 b0 EOS s2 s1 for 2+2 digits (xj = digit of x at 10^j, s = the sum)."""
    K = max(n, m) + 1
    return ([f"a{n - 1 - i}" for i in range(n)] + [f"b{m - 1 - i}" for i in range(m)] + ["EOS"]
            + [f"s{K - 1 - r}" for r in range(K - 1)])


def key_categories(n: int, m: int) -> torch.Tensor:
    """[n_answer, n_keys] index into CATEGORIES: what key k is to the answer position that predicts column i
    (query r = EOS + r predicts column max(n, m) - r); keys after the query are -1 (causal mask)."""
    K, P = max(n, m) + 1, n + m + 1
    L = P + K - 1
    out = torch.full((K, L), -1, dtype=torch.long)
    for r in range(K):
        column = K - 1 - r
        for k in range(P + r):
            if k < n + m:
                is_a = k < n
                col = n - 1 - k if is_a else n + m - 1 - k
                if col == column:
                    out[r, k] = 0 if is_a else 1
                else:
                    out[r, k] = 2 if col < column else 3
            else:
                out[r, k] = 4 if k == n + m else 5
        # keys > P - 1 + r stay -1
    return out


def attention_profile(model: Transformer, tokens: torch.Tensor, n: int, m: int,
                      heads: list[Head] | None = None) -> dict[str, Any]:
    """Where each head attends from the answer positions (EOS and the answer digits), on tokens
    [batch, prompt + answer - 1]: the mean pattern [n_answer, n_keys], the attention mass on each of
    CATEGORIES (mean over inputs and answer positions), the mean top weight (1 = one key only) and the
    variability: the mean total-variation distance of a pattern from the head's mean pattern at that
    position (0 = it attends the same way on every input, by position alone; higher = the digits decide)."""
    heads = heads if heads is not None else _all_heads(model)
    P, K = n + m + 1, max(n, m) + 1
    queries = list(range(P - 1, P - 1 + K))
    with torch.no_grad():
        patterns = query_patterns(model, tokens, heads, queries)  # [H, batch, K, keys]
    cats = key_categories(n, m)
    labels = position_labels(n, m)
    out: dict[str, Any] = {}
    for i, head in enumerate(heads):
        p = patterns[i].double()
        mean = p.mean(0)                              # [K, keys]
        variability = float(0.5 * (p - mean).abs().sum(-1).mean())
        mass = {c: float(sum(mean[r, cats[r] == j].sum() for r in range(K)) / K) for j, c in enumerate(CATEGORIES)}
        top = []
        for r, q in enumerate(queries):
            order = mean[r].argsort(descending=True)[:2]
            top.append({"query": labels[q], "keys": [[labels[int(k)], round(float(mean[r, k]), 3)] for k in order]})
        out[_label(head)] = {"mean_pattern": [[round(float(x), 4) for x in row] for row in mean],
                             "mass": {c: round(v, 4) for c, v in mass.items()},
                             "top_weight": round(float(p.amax(-1).mean()), 4), "variability": round(variability, 4),
                             "top_keys": top}
    return out


# ---------------------------------------------------------------------- the comparison
def _accuracy(adder: Adder, seed: int) -> dict[str, Any]:
    n, m = adder.n_digits_a, adder.n_digits_b
    check = adder.check(seed=seed, exhaustive=10 ** (n + m) <= EXHAUSTIVE_PAIRS, progress=False)
    return {"correct": check.correct, "total": check.total, "exhaustive": check.exhaustive,
            "accuracy": check.correct / check.total, "failures": [list(f) for f in check.failures[:5]]}


def heldout_accuracy(model: Transformer, data: Any, rows: int = 10_000) -> dict[str, Any] | None:
    """Accuracy of model on the pairs the training held out (an AdditionData's val split), or None
    when nothing was held out."""
    if data is None or data.val_frac <= 0:
        return None
    task = data.task
    n, m = task.n_digits_a, task.n_digits_b
    listed = data._listed.get("val")
    if listed is not None and len(listed) <= rows:
        idx = listed
    else:
        batch = data.get_batch("val", 0, rows, task.seq_len - 1)
        idx = _pair_index(batch, n, m)
    da, db = digits_of(idx // 10 ** m, n), digits_of(idx % 10 ** m, m)
    ok = TokenAdder(model, n, m).correct_rows(da, db)
    return {"correct": int(ok.sum()), "total": len(ok), "accuracy": float(ok.float().mean())}


def _pair_index(tokens: torch.Tensor, n: int, m: int) -> torch.Tensor:
    pa = 10 ** torch.arange(n - 1, -1, -1)
    pb = 10 ** torch.arange(m - 1, -1, -1)
    return (tokens[:, :n] * pa).sum(1) * 10 ** m + (tokens[:, n:n + m] * pb).sum(1)


def example_problem(n: int, m: int) -> tuple[int, int]:
    """A problem whose carry has to pass through a column summing to 9 (45 + 57 = 102 for 2+2 digits)."""
    a = int("4" * (n - 1) + "5")
    b = int("5" * (m - 1) + "7")
    return a, b


def _fold(model: Transformer) -> Transformer:
    """The model with LayerNorm gains folded into the weights (and writing weights centered), so W_E, W_OV
    and W_U describe what the heads compute; outputs and attention patterns are unchanged."""
    from circuitlab.analysis.folding import weights_model

    folded = weights_model(model)
    return folded if folded is model else folded.eval()


def summarize_comparison(hand: Adder, other: Transformer, samples: int = DEFAULTS.samples,
                         seed: int = DEFAULTS.seed, data: Any = None) -> dict[str, Any]:
    """Everything `forge compare` measures, for a hand-built adder and any model that writes the answer
    as tokens in the task format (trained, random, or the hand-built one itself), as a JSON-able dict:
    accuracy, attention agreement (hand-built heads x other's heads), OV alignment of every such pair,
    attention profiles of both models and the findings in words."""
    SAMPLES.check(samples, "samples", CircuitlabError)
    check_token_adder(hand)
    n, m = hand.n_digits_a, hand.n_digits_b
    other = _fold(other.cpu().eval())
    other_adder = TokenAdder(other, n, m, design="trained")
    tokens = addition_problems(n, m, samples, seed)[:, :-1]
    agreement = answer_agreement(hand, other, tokens)
    heads_hand, heads_other = agreement.heads_a, agreement.heads_b
    ov = {}
    for side in ("input", "output"):
        rows = []
        for ha in heads_hand:
            row = []
            for hb in heads_other:
                full = ov_alignment(hand.model, ha, other, hb, side)
                k = full.rank_a
                top = ov_alignment(hand.model, ha, other, hb, side, rank=k) if k else None
                row.append({"similarity": full.similarity, "rank_hand": full.rank_a, "rank_other": full.rank_b,
                            "chance": max(full.rank_a, full.rank_b) / other.cfg.d_vocab if full.rank_a else None,
                            "top_similarity": top.similarity if top else None,
                            "top_chance": k / other.cfg.d_vocab if k else None,
                            "angles_deg": [round(a, 2) for a in full.angles_deg]})
            rows.append(row)
        ov[side] = rows
    merged = merged_agreement(hand.model, heads_hand, other, heads_other, tokens, n, m)
    # What a head that only tells digits from EOS would score against each hand-built input subspace.
    contrast = torch.ones(hand.model.cfg.d_vocab, dtype=torch.float64)
    contrast[EOS] = 0
    contrast /= contrast.norm()
    for i, ha in enumerate(heads_hand):
        A = ov_subspace(hand.model, ha, "input")
        baseline = float(((A.T @ contrast) ** 2).sum()) if A.shape[1] else None
        for cell in ov["input"][i]:
            cell["digits_vs_eos_baseline"] = baseline
    a, b = example_problem(n, m)
    example = torch.cat([hand.prompt(a, b), add_digits(digits_of(torch.tensor([a]), n),
                                                       digits_of(torch.tensor([b]), m), max(n, m) + 1)[0, :-1]])
    results = {
        "digits": [n, m],
        "samples": samples,
        "positions": position_labels(n, m),
        "categories": list(CATEGORIES),
        "accuracy": {"hand": _accuracy(hand, seed), "trained": _accuracy(other_adder, seed),
                     "trained_heldout": heldout_accuracy(other, data)},
        "agreement": {**agreement.to_dict(), "query_positions": position_labels(n, m)[n + m:]},
        "merged_agreement": merged,
        "ov": {"hand_heads": [_label(h) for h in heads_hand], "other_heads": [_label(h) for h in heads_other],
               "basis": "token", "d_vocab": other.cfg.d_vocab, **ov,
               "digit_value_share": {"hand": {_label(h): digit_value_share(hand.model, h) for h in heads_hand},
                                     "trained": {_label(h): digit_value_share(other, h) for h in heads_other}}},
        "attention": {"hand": attention_profile(hand.model, tokens, n, m, heads_hand),
                      "trained": attention_profile(other, tokens, n, m, heads_other)},
        "example": {"a": a, "b": b, "tokens": example.tolist(),
                    "hand": _example_patterns(hand.model, example, n, m, heads_hand),
                    "trained": _example_patterns(other, example, n, m, heads_other)},
        "roles": {_label(h): CARRY_ROLES.get(h, "") for h in heads_hand} if hand.design == "carry" else {},
    }
    results["findings"] = findings(results)
    return results


def digit_value_share(model: Transformer, head: Head) -> float | None:
    """How much of what head reads from the digit tokens is the digit's numeric value: the rows of
    W_E·W_OV for digits 0..9, centered over the digits, projected on the direction (d − 4.5); the share
    of their squared norm that the projection keeps. 1 for a head that reads only the value (the
    hand-built heads a and b), about 1/9 for a head reading the digits at random; None if the head
    reads nothing that differs between digits."""
    layer, h = head
    with torch.no_grad():
        M = (model.W_E[:10] @ model.W_OV[layer, h]).double()
        scale = float((model.W_OV[layer, h].double() ** 2).sum())
    M = M - M.mean(0, keepdim=True)
    total = float((M ** 2).sum())
    if total <= 1e-12 * max(1.0, scale):
        return None
    u = torch.arange(10, dtype=torch.float64) - 4.5
    u = u / u.norm()
    return float(((u @ M) ** 2).sum()) / total


def merged_agreement(hand: Transformer, heads_hand: list[Head], other: Transformer, heads_other: list[Head],
                     tokens: torch.Tensor, n: int, m: int) -> dict[str, dict[str, float]]:
    """Agreement of each of other's heads with the average pattern of each pair of hand-built heads in the
    same layer ("L0H0+L0H1"): high when one trained head does the work of two hand-built ones at once."""
    queries = list(range(n + m, n + m + max(n, m) + 1))
    with torch.no_grad():
        ph = query_patterns(hand, tokens, heads_hand, queries)
        po = query_patterns(other, tokens, heads_other, queries)
    out = {}
    for i, hi in enumerate(heads_hand):
        for j in range(i + 1, len(heads_hand)):
            hj = heads_hand[j]
            if hi[0] != hj[0]:
                continue
            avg = (ph[i] + ph[j]) / 2
            tv = 0.5 * (avg[None] - po).abs().sum(-1).mean(dim=(1, 2))
            out[f"{_label(hi)}+{_label(hj)}"] = {_label(h): round(float(1 - t), 4) for h, t in zip(heads_other, tv)}
    return out


def _example_patterns(model: Transformer, tokens: torch.Tensor, n: int, m: int, heads: list[Head]) -> dict[str, Any]:
    queries = list(range(n + m, n + m + max(n, m) + 1))
    with torch.no_grad():
        p = query_patterns(model, tokens[None], heads, queries)[:, 0]
    return {_label(h): [[round(float(x), 4) for x in row] for row in p[i]] for i, h in enumerate(heads)}


# ---------------------------------------------------------------------- the whole command
def run_forge_compare(out: str | Path = DEFAULTS.out, digits: int = DEFAULTS.digits,
                      digits_b: int | None = DEFAULTS.digits_b, steps: int = DEFAULTS.steps, seed: int = DEFAULTS.seed,
                      samples: int = DEFAULTS.samples, retrain: bool = DEFAULTS.retrain,
                      progress: bool = DEFAULTS.progress) -> dict[str, Any]:
    """Train a small model on the addition task (or reuse out/trained when it was trained with the same
    settings), compare it with the hand-built carry adder for the same digit counts, and write
    results.json, the figures and report.md into out. Returns the results dict. The keywords are
    ForgeCompareOptions' (checked by it first)."""
    from circuitlab.data import build_data

    ForgeCompareOptions(out=out, digits=digits, digits_b=digits_b, steps=steps, seed=seed, samples=samples,
                        retrain=retrain, progress=progress).check(CircuitlabError)
    run = addition_run_config(digits, digits_b, steps, seed)
    n, m = _check_digits(digits, digits_b)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CircuitlabError(f"--out {out} is a file; give a folder")
    check_writable(out, "the comparison")
    out.mkdir(parents=True, exist_ok=True)
    # The threads are the run config's train.threads (1: this model is tiny), applied by perf's one rule for
    # the whole command: training, the data and the comparison's inference.
    step = transformer_step_flops(run.model_config(d_vocab=11), run.train.batch_size * run.train.seq_len,
                                  run.train.seq_len)   # 11: the addition data's digits and EOS
    with threads_for_work(step, run.train.threads or None):
        model, info = train_addition_model(run, out / "trained", retrain=retrain, progress=progress)
        data = build_data(run.data)
        results = summarize_comparison(build_carry_adder(n, m), model, samples=samples, seed=seed, data=data)
    assert isinstance(data, AdditionData)  # an addition: source
    row = data.task.seq_len
    results["training"] = {**info, "steps": steps, "seed": seed, "batch_size": run.train.batch_size,
                           "source": run.data.source, "out": str(out / "trained"),
                           "model": f"2 layers x 2 heads, d_model 64, MLP 256 ({model.cfg.norm}, learned positions)",
                           "loss_floor": (n + m - 1) * math.log(10) / (row - 1)}
    figures = write_comparison_figures(out, results)
    results["figures"] = figures
    (out / "results.json").write_text(json_text(results, indent=2))
    (out / "report.md").write_text(forge_compare_markdown(results, figures))
    return results


__all__ = ["CATEGORIES", "DEFAULT_STEPS", "ForgeCompareOptions", "addition_run_config", "attention_profile",
           "findings", "heldout_accuracy", "key_categories", "position_labels", "run_forge_compare", "summarize_comparison",
           "train_addition_model"]
