"""Hand-built vs trained: train a small model on the addition task and compare it with the carry adder.

    results = run_forge_compare("runs/forge-compare")      # trains (~20 s on one CPU core), compares, writes
    results["accuracy"], results["agreement"], results["findings"]

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

import contextlib
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from circuitlab.data.sources import ADDITION_MAX_DIGITS
from circuitlab.errors import CircuitlabError
from circuitlab.forge.adder import EOS, Adder, TokenAdder, add_digits, build_carry_adder, digits_of
from circuitlab.forge.compare import (_all_heads, _label, addition_problems, answer_agreement, attention_patterns,
                                      check_token_adder, ov_alignment, ov_subspace)
from circuitlab.model.transformer import Transformer

Head = tuple[int, int]

DEFAULT_STEPS = 2000     # 2+2 digits: every answer right for seeds 0..3, ~20 s on one CPU core (docs/forge.md)
EXHAUSTIVE_PAIRS = 100_000  # accuracy on every pair up to this many, else on 10,000 random pairs
CATEGORIES = ("a, same column", "b, same column", "lower columns", "higher columns", "EOS", "answer digits")
MATCH, PARTLY = 0.8, 0.5  # agreement thresholds of "attends like" and "partly like"

# What each head of the hand-built carry adder does, by design (build_carry_adder's docstring).
CARRY_ROLES = {
    (0, 0): "head a: fetches the digit of a in the answer's column",
    (0, 1): "head b: fetches the digit of b in the answer's column",
    (1, 0): "carry head: looks up the carry flag of the nearest lower column that is not a 9",
}


# ---------------------------------------------------------------------- training
def addition_run_config(n_digits_a: int = 2, n_digits_b: int | None = None, steps: int = DEFAULT_STEPS,
                        seed: int = 0) -> Any:
    """The RunConfig of the trained adder: 2 layers of 2 heads (the hand-built adder's shape), d_model 64,
    MLPs of 256, on data source addition:N:M, one problem per row, on one CPU thread."""
    from circuitlab.training.config import RunConfig

    n, m = _check_digits(n_digits_a, n_digits_b)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise CircuitlabError(f"steps must be a positive whole number, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CircuitlabError(f"seed must be a whole number, got {seed!r}")
    row = n + m + 1 + max(n, m) + 1
    return RunConfig(
        name=f"adder-{n}+{m}",
        model={"n_layers": 2, "n_heads": 2, "d_model": 64, "d_mlp": 256},
        data={"source": f"addition:{n}:{m}", "seed": seed},
        train={"steps": steps, "batch_size": 64, "seq_len": row - 1, "lr": 3e-3,
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


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch on n CPU threads inside the block (a tiny model is fastest on one, most of all on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _json_roundtrip(d: dict) -> dict:
    return json.loads(json.dumps(d))


def train_addition_model(run: Any, out_dir: str | Path, retrain: bool = False,
                         progress: bool = True) -> tuple[Transformer, dict[str, Any]]:
    """Train run into out_dir with the project trainer, or reuse the model already there when it was
    trained with the same settings. Returns (model on CPU, eval mode; info: reused, seconds, losses)."""
    from circuitlab.training.checkpoint import load_checkpoint
    from circuitlab.training.trainer import read_metrics, train

    out_dir = Path(out_dir)
    if (out_dir / "checkpoint").exists() and not retrain:
        model, _, meta = load_checkpoint(out_dir / "checkpoint")
        if meta.get("run") != _json_roundtrip(run.to_dict()):
            raise CircuitlabError(f"{out_dir} holds a model trained with other settings; pass --retrain to replace "
                                  "it, or choose another --out")
        reused, seconds = True, None
    else:
        if out_dir.exists():
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
        patterns = attention_patterns(model, tokens, heads, queries)  # [H, batch, K, keys]
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
    check = adder.check(samples=10_000, seed=seed, exhaustive=10 ** (n + m) <= EXHAUSTIVE_PAIRS, progress=False)
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
    if model.cfg.norm == "none":
        return model
    from circuitlab.analysis.folding import fold_layer_norm

    return fold_layer_norm(model).eval()


def summarize_comparison(hand: Adder, other: Transformer, samples: int = 1000, seed: int = 0,
                         data: Any = None) -> dict[str, Any]:
    """Everything `forge compare` measures, for a hand-built adder and any model that writes the answer
    as tokens in the task format (trained, random, or the hand-built one itself), as a JSON-able dict:
    accuracy, attention agreement (hand-built heads x other's heads), OV alignment of every such pair,
    attention profiles of both models and the findings in words."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise CircuitlabError(f"samples must be a positive whole number, got {samples!r}")
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
        ph = attention_patterns(hand, tokens, heads_hand, queries)
        po = attention_patterns(other, tokens, heads_other, queries)
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
        p = attention_patterns(model, tokens[None], heads, queries)[:, 0]
    return {_label(h): [[round(float(x), 4) for x in row] for row in p[i]] for i, h in enumerate(heads)}


# ---------------------------------------------------------------------- the findings, in words
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.9995 or x == 1 else f"{100 * x:.2f}%"


def _where(profile: dict[str, Any], limit: float = 0.15) -> str:
    """The attention categories that take at least `limit` of a head's attention, largest first."""
    mass = sorted(profile["mass"].items(), key=lambda kv: -kv[1])
    parts = [f"{c} {v:.2f}" for c, v in mass if v >= limit] or [f"{mass[0][0]} {mass[0][1]:.2f}"]
    return ", ".join(parts)


def findings(results: dict[str, Any]) -> list[str]:
    """What the comparison found, as sentences computed from results (summarize_comparison's dict)."""
    out = []
    acc = results["accuracy"]
    th, tt = acc["hand"], acc["trained"]
    which = f"of all {tt['total']:,}" if tt["exhaustive"] else f"of {tt['total']:,} random"
    line = (f"Accuracy: the trained model answers {tt['correct']:,} {which} problems exactly "
            f"({_pct(tt['accuracy'])}); the hand-built adder {th['correct']:,} ({_pct(th['accuracy'])}).")
    if acc.get("trained_heldout"):
        h = acc["trained_heldout"]
        gap = h["accuracy"] - tt["accuracy"]
        verdict = ("about as many as overall, so what it learned carries over to pairs it never saw."
                   if gap >= -0.02 else "fewer than overall, so part of what it learned is memorised pairs.")
        line += (f" On the {h['total']:,} pairs held out of training it gets {h['correct']:,} right "
                 f"({_pct(h['accuracy'])}): {verdict}")
    out.append(line)

    agree = torch.tensor(results["agreement"]["agreement"])
    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    prof_h, prof_t = results["attention"]["hand"], results["attention"]["trained"]
    roles = results.get("roles", {})
    matched = set()
    for i, hh in enumerate(hand_heads):
        j = int(agree[i].argmax())
        th_, g = other_heads[j], float(agree[i, j])
        role = f" ({roles[hh]})" if roles.get(hh) else ""
        where_h, where_t = _where(prof_h[hh]), _where(prof_t[th_])
        if g >= MATCH:
            matched.add(th_)
            out.append(f"Hand-built {hh}{role} is matched by trained {th_}: attention agreement {g:.2f}. "
                       f"Both attend to {where_t} (hand-built: {where_h}).")
        elif g >= PARTLY:
            matched.add(th_)
            out.append(f"Hand-built {hh}{role} is only partly matched: the closest trained head, {th_}, agrees "
                       f"{g:.2f}. The hand-built head puts its attention on {where_h}; {th_} on {where_t}.")
        else:
            out.append(f"No trained head attends like hand-built {hh}{role}: the best agreement is {g:.2f} "
                       f"({th_}). The hand-built head puts its attention on {where_h}; {th_} on {where_t}.")

    # Differences, measured on the attention categories.
    diffs = []
    for pair, row in results.get("merged_agreement", {}).items():
        best_t = max(row, key=row.get)
        single = max(float(agree[hand_heads.index(h), other_heads.index(best_t)]) for h in pair.split("+"))
        if row[best_t] >= PARTLY and row[best_t] >= single + 0.1:
            matched.add(best_t)
            diffs.append(f"trained {best_t} agrees {row[best_t]:.2f} with the average of hand-built "
                         f"{' and '.join(pair.split('+'))} (against {single:.2f} with either alone): one trained head "
                         "does the work of both")
    both = [h for h in other_heads if prof_t[h]["mass"]["a, same column"] >= 0.2
            and prof_t[h]["mass"]["b, same column"] >= 0.2]
    for h in both:
        ms = prof_t[h]["mass"]
        diffs.append(f"trained {h} reads both digits of the answer's column in one head (a {ms['a, same column']:.2f}, "
                     f"b {ms['b, same column']:.2f}), where the hand-built adder uses one head for a and one for b")

    def layer_mass(prof: dict[str, Any], layer: int, cat: str) -> float:
        return sum(v["mass"][cat] for k, v in prof.items() if k.startswith(f"L{layer}H"))

    low_h0, low_t0 = layer_mass(prof_h, 0, "lower columns"), layer_mass(prof_t, 0, "lower columns")
    low_h1, low_t1 = layer_mass(prof_h, 1, "lower columns"), layer_mass(prof_t, 1, "lower columns")
    if low_t0 >= 0.2 and low_t0 > low_h0 + 0.1:
        diffs.append(f"the trained model's layer 0 already attends to the digits of lower columns (attention mass "
                     f"{low_t0:.2f}, summed over its heads; hand-built layer 0: {low_h0:.2f}): it reads the digits a "
                     f"carry depends on directly, where the hand-built adder first computes a carry flag per column "
                     f"(MLP 0) and looks it up in layer 1 (lower-column mass, summed over heads: hand-built "
                     f"{low_h1:.2f}, trained {low_t1:.2f})")
    elif low_t1 >= 0.2:
        diffs.append(f"like the hand-built adder, the trained model reads lower columns (where carries come from) in "
                     f"layer 1 (attention mass {low_t1:.2f}; hand-built {low_h1:.2f}), not in layer 0 ({low_t0:.2f})")
    elif max(low_t0, low_t1) < 0.1 and low_h1 >= 0.1:
        diffs.append(f"no trained head looks at lower columns much (layer 0: {low_t0:.2f}, layer 1: {low_t1:.2f}; "
                     f"the hand-built carry head: {low_h1:.2f}): whatever carries the trained model computes, it "
                     "does not fetch them by attention to the lower columns")

    sharp_h = sum(v["top_weight"] for v in prof_h.values()) / max(1, len(prof_h))
    sharp_t = sum(v["top_weight"] for v in prof_t.values()) / max(1, len(prof_t))
    if sharp_t < sharp_h - 0.1:
        diffs.append(f"the trained heads spread their attention: their largest weight averages {sharp_t:.2f}, "
                     f"against {sharp_h:.2f} for the hand-built heads, which each pick one key")
    var_h = max(v["variability"] for v in prof_h.values())
    varied = {h: v["variability"] for h, v in prof_t.items() if v["variability"] >= var_h + 0.1}
    if varied:
        most = max(prof_h, key=lambda h: prof_h[h]["variability"])
        diffs.append(f"trained {', '.join(varied)} change where they look with the digits more than any hand-built "
                     "head "
                     f"(variability {', '.join(f'{v:.2f}' for v in varied.values())}, against at most {var_h:.2f} for "
                     f"hand-built {most}): they choose keys by content, where the hand-built heads choose by position"
                     + (" (except the carry lookup)" if var_h >= 0.05 else ""))
    for h, v in prof_t.items():
        fed = v["mass"]["answer digits"] + v["mass"]["EOS"]
        if fed >= 0.4 and h not in matched:
            diffs.append(f"trained {h} puts {fed:.2f} of its attention on EOS and the answer digits already "
                         "written: it reads the output so far, which no hand-built head does "
                         "(they use EOS only as the stand-in digit 0 for a missing digit)")
    unmatched = [h for h in other_heads if h not in matched and not any(f"trained {h} " in d for d in diffs)]
    for h in unmatched:
        diffs.append(f"trained {h} matches no hand-built head; it attends to {_where(prof_t[h])}")

    # OV subspaces, against chance and against the plain digits-vs-EOS contrast.
    ov_in, ov_out = results["ov"]["input"], results["ov"]["output"]
    for i, hh in enumerate(hand_heads):
        j = int(agree[i].argmax())
        cell, th_ = ov_in[i][j], other_heads[j]
        if cell["rank_hand"] == 0:
            diffs.append(f"hand-built {hh} reads nothing straight from the token embeddings (only what earlier "
                         "layers computed), so its OV input subspace has no token-space counterpart to compare")
            continue
        top, chance, base = cell["top_similarity"], cell["top_chance"], cell.get("digits_vs_eos_baseline")
        verdict = ("well above" if top >= max(0.5, 3 * chance) else "above" if top >= 1.5 * chance else "near")
        line = (f"OV input: against what hand-built {hh} reads from the tokens (a {cell['rank_hand']}-dim subspace), "
                f"the top direction(s) that {th_} reads score {top:.2f}, {verdict} chance ({chance:.2f})")
        if base is not None and base >= chance:
            line += (f"; but a head that only tells digits from EOS would already score {base:.2f}"
                     + (", and this one does not beat that" if top <= base else ""))
        diffs.append(line)
    share_h, share_t = results["ov"]["digit_value_share"]["hand"], results["ov"]["digit_value_share"]["trained"]
    valued = {h: v for h, v in share_h.items() if v is not None and v > 0.99}
    if valued:
        parts = ", ".join(f"{h} {v:.2f}" for h, v in share_t.items() if v is not None)
        best_h = max((h for h, v in share_t.items() if v is not None), key=lambda h: share_t[h], default=None)
        best_t = share_t[best_h] if best_h is not None else 0.0
        diffs.append(f"hand-built {' and '.join(valued)} read only the numeric value of a digit (share 1.00); of "
                     f"what each trained head reads from the digit tokens, the share that is the digit's value "
                     f"(linear in d) is {parts or 'none'} (a head reading the digits at random: 0.11): "
                     + (f"trained {best_h} reads the value much like the hand-built ones" if best_t >= 0.8 else
                        "the trained heads read the digits partly by value, partly as other features"
                        if best_t >= 0.3 else "the trained heads read the digits as other features than their value"))
    tops = [c["top_similarity"] for row in ov_out for c in row if c["top_similarity"] is not None]
    chances = [c["top_chance"] for row in ov_out for c in row if c["top_chance"] is not None]
    if tops and max(tops) < 2 * max(chances):
        diffs.append(f"no trained head writes the hand-built heads' output direction (the digit value, read by the "
                     f"unembedding) straight into the logits: output similarity at most {max(tops):.2f}, chance "
                     f"{max(chances):.2f}; what the trained heads write goes to later layers and the MLPs")
    out += [f"{d[0].upper()}{d[1:]}." for d in diffs]
    return out


# ---------------------------------------------------------------------- figures and the report
def write_figures(out: Path, results: dict[str, Any]) -> list[str]:
    """PNG figures of the comparison into out; returns their file names."""
    import matplotlib
    from matplotlib.figure import Figure

    names = []
    labels = results["positions"]
    n, m = results["digits"]
    K = max(n, m) + 1
    qlabels = [f"{q}→s{K - 1 - r}" for r, q in enumerate(labels[n + m:])]  # each query and the digit it predicts
    for kind, title in (("attention_mean", "mean attention at the answer positions, {s} problems"),
                        ("attention_example", "attention on {a} + {b}")):
        src = {"hand": {h: v["mean_pattern"] for h, v in results["attention"]["hand"].items()},
               "trained": {h: v["mean_pattern"] for h, v in results["attention"]["trained"].items()}}
        if kind == "attention_example":
            src = {"hand": results["example"]["hand"], "trained": results["example"]["trained"]}
        cols = max(len(src["hand"]), len(src["trained"]))
        fig = Figure(figsize=(3.2 * cols + 1, 6.4), layout="constrained")
        axes = fig.subplots(2, cols, squeeze=False)
        for r, model in enumerate(("hand", "trained")):
            heads = list(src[model])
            for c in range(cols):
                ax = axes[r][c]
                if c >= len(heads):
                    ax.axis("off")
                    continue
                h = heads[c]
                im = ax.imshow(src[model][h], vmin=0, vmax=1, cmap="viridis", aspect="auto")
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
                ax.set_yticks(range(len(qlabels)), qlabels, fontsize=8)
                ax.set_title(f"{'hand-built' if model == 'hand' else 'trained'} {h}", fontsize=10)
                if c == 0:
                    ax.set_ylabel("query (→ digit it predicts)")
        fig.colorbar(im, ax=axes, shrink=0.6, label="attention")
        ex = results["example"]
        fig.suptitle(title.format(s=results["samples"], a=ex["a"], b=ex["b"]))
        fig.savefig(out / f"{kind}.png", dpi=110)
        names.append(f"{kind}.png")

    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    mats = [("attention agreement", results["agreement"]["agreement"])]
    for side in ("input", "output"):
        mats.append((f"OV {side} similarity (top directions)",
                     [[c["top_similarity"] for c in row] for row in results["ov"][side]]))
    fig = Figure(figsize=(4.2 * len(mats), 0.6 * len(hand_heads) + 2.4), layout="constrained")
    axes = fig.subplots(1, len(mats), squeeze=False)[0]
    for ax, (title, mat) in zip(axes, mats):
        values = torch.tensor([[math.nan if v is None else v for v in row] for row in mat], dtype=torch.float64)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="lightgray")
        im = ax.imshow(values.numpy(), vmin=0, vmax=1, cmap=cmap, aspect="auto")
        ax.set_xticks(range(len(other_heads)), other_heads)
        ax.set_yticks(range(len(hand_heads)), hand_heads)
        ax.set_xlabel("trained head")
        ax.set_ylabel("hand-built head")
        ax.set_title(title, fontsize=10)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                v = values[i, j].item()
                ax.text(j, i, "—" if math.isnan(v) else f"{v:.2f}", ha="center", va="center",
                        color="white" if not math.isnan(v) and v < 0.6 else "black", fontsize=9)
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.savefig(out / "similarity.png", dpi=110)
    names.append("similarity.png")

    train = results.get("training") or {}
    if train.get("loss_curve"):
        fig = Figure(figsize=(6, 3.6), layout="constrained")
        ax = fig.subplots()
        steps, loss = zip(*train["loss_curve"])
        ax.plot(steps, loss, label="training loss (every position)")
        if train.get("val_curve"):
            vs, vl = zip(*train["val_curve"])
            ax.plot(vs, vl, "o-", label="held-out loss")
        ax.axhline(results["training"]["loss_floor"], color="gray", ls="--",
                   label="floor: unpredictable digits of a and b")
        ax.set_xlabel("step")
        ax.set_ylabel("next-token loss")
        ax.legend(fontsize=8)
        fig.savefig(out / "training.png", dpi=110)
        names.append("training.png")
    return names


def write_report(out: Path, results: dict[str, Any], figures: list[str]) -> Path:
    """report.md: what was run, the numbers, the figures, and the findings."""
    n, m = results["digits"]
    acc = results["accuracy"]
    lines = [f"# Hand-built vs trained adder ({n}+{m} digits)", ""]
    train = results.get("training")
    if train:
        how = ("reused from an earlier run with the same settings" if train["reused"]
               else f"trained now in {train['seconds']:.1f} s")
        lines += [f"Trained model: {train['model']} — {train['steps']} steps of batch {train['batch_size']} "
                  f"on `{train['source']}` (seed {train['seed']}), {how}. Final training loss "
                  f"{_num(train['final_loss'])}, held-out loss {_num(train['final_val_loss'])} (the loss covers every "
                  f"position; the digits of a and b are unpredictable, a floor of {train['loss_floor']:.3f}).", ""]
    lines += ["Hand-built model: `build_carry_adder` (2 layers, 2 heads, two 4-neuron MLPs; L1H1 is unused).",
              "", "## What the comparison found", ""]
    lines += [f"- {f}" for f in results["findings"]]
    lines += ["", "## Accuracy", "", "| model | correct | of | accuracy |", "|---|---|---|---|"]
    for name, key in (("hand-built", "hand"), ("trained", "trained"), ("trained, held-out pairs", "trained_heldout")):
        a = acc.get(key)
        if a:
            lines.append(f"| {name} | {a['correct']:,} | {a['total']:,} | {_pct(a['accuracy'])} |")
    lines += ["", "## Where each head attends", "",
              f"Positions: {' '.join(results['positions'])} (xj = digit of x at 10^j, s = the sum; EOS predicts the "
              "first answer digit). Attention mass on each kind of key, averaged over the answer positions and "
              f"{results['samples']} random problems; top weight = mean of each pattern's largest weight; "
              "variability = mean total-variation distance of a pattern from the head's mean pattern (0 = the same "
              "on every input).", "",
              "| model | head | " + " | ".join(results["categories"])
              + " | top weight | variability | most attended key per query |",
              "|---|---|" + "---|" * (len(results["categories"]) + 3)]
    for model, name in (("hand", "hand-built"), ("trained", "trained")):
        for h, v in results["attention"][model].items():
            keys = "; ".join(f"{t['query']}→{t['keys'][0][0]} {t['keys'][0][1]:.2f}" for t in v["top_keys"])
            lines.append(f"| {name} | {h} | " + " | ".join(f"{v['mass'][c]:.2f}" for c in results["categories"])
                         + f" | {v['top_weight']:.2f} | {v['variability']:.2f} | {keys} |")
    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    lines += ["", "## Attention agreement", "",
              "1 − total-variation distance between the two heads' patterns at the answer positions, averaged "
              "over the problems (1 = identical, 0 = disjoint).", "",
              "| hand-built \\ trained | " + " | ".join(other_heads) + " |", "|---|" + "---|" * len(other_heads)]
    for h, row in zip(hand_heads, results["agreement"]["agreement"]):
        lines.append(f"| {h} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    lines += ["", "## OV alignment", "",
              "Principal angles between what the heads read from the token embeddings (input: column space of "
              "W_E·W_OV) or write to the logits (output: of (W_OV·W_U)ᵀ), in token space, with the trained model's "
              "LayerNorm folded in. Similarity = mean cos² of the angles. *Top*: the trained head's top "
              "directions, as many as the hand-built head's rank, with chance = rank / 11; *full*: its whole "
              "subspace, with chance = larger rank / 11 (a high-rank subspace contains almost anything). "
              "Hand-built heads that read or write nothing in token space are left out.", "",
              "| side | hand-built | trained | rank (hand, trained) | top similarity | chance | full similarity "
              "| chance |",
              "|---|---|---|---|---|---|---|---|"]
    for side in ("input", "output"):
        for i, h in enumerate(hand_heads):
            for j, t in enumerate(other_heads):
                c = results["ov"][side][i][j]
                if c["rank_hand"]:
                    lines.append(f"| {side} | {h} | {t} | {c['rank_hand']}, {c['rank_other']} | "
                                 f"{_num(c['top_similarity'])} | {_num(c['top_chance'])} | {_num(c['similarity'])} | "
                                 f"{_num(c['chance'])} |")
    base = next((c["digits_vs_eos_baseline"] for row in results["ov"]["input"] for c in row
                 if c.get("digits_vs_eos_baseline") is not None), None)
    if base is not None:
        lines += ["", f"Input similarity has a floor besides chance: a head that only tells digits from EOS scores "
                      f"{base:.2f} against the hand-built digit-value direction [0, 1, …, 9, 0]. The share of the "
                      "digit value removes it: of the rows of W_E·W_OV for digits 0..9, centered over the digits, "
                      "the share of their squared norm along (d − 4.5); 1 = reads only the value, about 0.11 = "
                      "reads the digits at random."]
    shares = results["ov"]["digit_value_share"]
    lines += ["", "| | " + " | ".join(f"{name} {h}" for name in ("hand-built", "trained")
                                            for h in shares["hand" if name == "hand-built" else "trained"]) + " |",
              "|---|" + "---|" * (len(shares["hand"]) + len(shares["trained"])),
              "| digit-value share | " + " | ".join(_num(v) for part in ("hand", "trained")
                                                    for v in shares[part].values()) + " |"]
    lines += ["", "## Figures", ""]
    captions = {"attention_mean.png": "Mean attention from each answer position (rows: the query and the digit it "
                                      "predicts) to each position, hand-built heads above, trained heads below.",
                "attention_example.png": f"The same on one problem, {results['example']['a']} + "
                                         f"{results['example']['b']} (a carry through a column summing to 9).",
                "similarity.png": "Attention agreement and OV similarity of every hand-built head with every "
                                  "trained head (— = the hand-built head reads or writes nothing in token space).",
                "training.png": "Training loss and held-out loss of the trained model."}
    for f in figures:
        lines += [f"![{f}]({f})", "", captions.get(f, ""), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _num(x: Any) -> str:
    return "—" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


# ---------------------------------------------------------------------- the whole command
def run_forge_compare(out: str | Path = "runs/forge-compare", digits: int = 2, digits_b: int | None = None,
                      steps: int = DEFAULT_STEPS, seed: int = 0, samples: int = 1000, retrain: bool = False,
                      progress: bool = True) -> dict[str, Any]:
    """Train a small model on the addition task (or reuse out/trained when it was trained with the same
    settings), compare it with the hand-built carry adder for the same digit counts, and write
    results.json, the figures and report.md into out. Returns the results dict."""
    from circuitlab.data import build_data

    run = addition_run_config(digits, digits_b, steps, seed)
    n, m = _check_digits(digits, digits_b)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise CircuitlabError(f"samples must be a positive whole number, got {samples!r}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CircuitlabError(f"--out {out} is a file; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    with _threads(1):
        model, info = train_addition_model(run, out / "trained", retrain=retrain, progress=progress)
        data = build_data(run.data)
        results = summarize_comparison(build_carry_adder(n, m), model, samples=samples, seed=seed, data=data)
    row = data.task.seq_len
    results["training"] = {**info, "steps": steps, "seed": seed, "batch_size": run.train.batch_size,
                           "source": run.data.source, "out": str(out / "trained"),
                           "model": f"2 layers x 2 heads, d_model 64, MLP 256 ({model.cfg.norm}, learned positions)",
                           "loss_floor": (n + m - 1) * math.log(10) / (row - 1)}
    figures = write_figures(out, results)
    results["figures"] = figures
    (out / "results.json").write_text(json.dumps(results, indent=2))
    write_report(out, results, figures)
    return results


__all__ = ["CATEGORIES", "DEFAULT_STEPS", "addition_run_config", "attention_profile", "findings", "heldout_accuracy",
           "key_categories", "position_labels", "run_forge_compare", "summarize_comparison",
           "train_addition_model", "write_figures", "write_report"]
