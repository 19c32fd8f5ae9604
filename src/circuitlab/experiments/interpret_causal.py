"""Ready-made causal experiments for `circuitlab interpret` and the demo report.

EXPERIMENTS maps a name to fn(model, tokenizer, out_dir, clean, corrupt) -> ExperimentResult. Each
writes PNG figures into out_dir and returns its findings: summary (readable lines), figures (file
names in out_dir) and data (JSON-able numbers). The tokenizer needs encode(str) -> list[int], decode(list[int]) -> str,
vocab_size and eos_id.

Without --clean/--corrupt the experiments test the induction circuit on random tokens:
clean = r + r[:k] (n distinct random tokens, then the first k again), whose last token r[k-1]
is followed by r[k] earlier on, so an induction circuit predicts r[k]; corrupt = the same with
the first occurrence of r[k-1] replaced, so nothing earlier says what follows it. The metric is
the log-probability of r[k] at the last position. Denoising then lights up the three places the
information flows through: the residual stream at the replaced position, the previous-token head
at the position after it (where it writes "my previous token is r[k-1]"), and the induction head
at the last position.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.ablation import ablate_and_measure, run_ablated
from circuitlab.analysis.patching.attribution_patching import attribution_vs_patching
from circuitlab.analysis.patching.path import INPUTS, path_patching
from circuitlab.analysis.patching import (check_pair, default_targets, logit_diff, logprob, next_token_loss,
                                          patching_sweep)
from circuitlab.analysis.probing import random_sequences, train_probes
from circuitlab.errors import CircuitlabError
from circuitlab.experiments.result import ExperimentResult
from circuitlab.model import model_device
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer

SEED = 0
BATCH = 8


def _random_ids(shape: tuple[int, ...], vocab: int, eos: int | None, gen: torch.Generator) -> torch.Tensor:
    """Uniform random token ids that are never the EOS id."""
    if eos is None or not 0 <= eos < vocab:
        return torch.randint(0, vocab, shape, generator=gen)
    ids = torch.randint(0, vocab - 1, shape, generator=gen)
    return ids + (ids >= eos).long()


def _distinct_ids(rows: int, n: int, vocab: int, eos: int | None, gen: torch.Generator) -> torch.Tensor:
    """[rows, n] ids, distinct within each row, never EOS."""
    allowed = torch.tensor([t for t in range(vocab) if t != eos])
    return torch.stack([allowed[torch.randperm(len(allowed), generator=gen)[:n]] for _ in range(rows)])


def induction_pair(model: Transformer, tokenizer, batch: int = BATCH, seed: int = SEED
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Default prompts for patching (see the module docstring).

    Returns clean [batch, n + k], corrupt [batch, n + k], answer [batch] (r[k]) and k.
    """
    vocab, eos = model.cfg.d_vocab, getattr(tokenizer, "eos_id", None)
    n = min(16, vocab - 2, (2 * model.cfg.n_ctx) // 3)
    if n < 3:
        raise CircuitlabError("the default induction prompts need a vocabulary of at least 5 tokens and a context "
                              "of at least 5 positions; pass --clean and --corrupt instead")
    k = max(2, n // 2)
    gen = torch.Generator().manual_seed(seed)
    ids = _distinct_ids(batch, n + 1, vocab, eos, gen)
    r, spare = ids[:, :n], ids[:, n]  # spare: a token not in r, to corrupt with
    clean = torch.cat([r, r[:, :k]], dim=1)
    corrupt = clean.clone()
    corrupt[:, k - 1] = spare
    return clean, corrupt, r[:, k], k


def _prompts(model: Transformer, tokenizer, clean: str | None, corrupt: str | None):
    """(clean, corrupt tokens [batch, pos], metric, description, token strings of row 0)."""
    device = model_device(model)
    if clean is None and corrupt is None:
        c, x, answer, k = induction_pair(model, tokenizer)
        c, x = c.to(device), x.to(device)
        metric = logprob(answer.to(device))
        what = (f"{c.shape[0]} random sequences r + r[:{k}] (n={c.shape[1] - k}); corrupted: the first "
                f"occurrence of the last token replaced (position {k - 1}); metric: log-prob of the induction "
                "answer at the last position")
        return c, x, metric, what, [tokenizer.decode([int(t)]) for t in c[0]]
    if clean is None or corrupt is None:
        raise CircuitlabError("--clean and --corrupt go together: give both or neither")
    c, x = check_pair(model, tokenizer.encode(clean), tokenizer.encode(corrupt))
    with torch.no_grad():
        a, w = int(model(c)[0, -1].argmax()), int(model(x)[0, -1].argmax())
    if a != w:
        metric = logit_diff(a, w)
        what = f"logit({tokenizer.decode([a])!r}) - logit({tokenizer.decode([w])!r}) at the last position"
    else:
        metric = logprob(a)
        what = f"log-prob of {tokenizer.decode([a])!r} at the last position (both prompts predict it)"
    return c, x, metric, what, [tokenizer.decode([int(t)]) for t in c[0]]


def _percent(x: float) -> str:
    return f"{x if abs(x) >= 0.005 else 0.0:.0%}"  # no "-0%"


def _where(w: dict[str, int]) -> str:
    """{"layer": 1, "pos": 5, "head": 0} -> "L1H0 pos 5"."""
    pos = w.get("pos", w.get("dest_pos"))
    return f"L{w['layer']}" + (f"H{w['head']}" if "head" in w else "") + (f" pos {pos}" if pos is not None else "")


def run_patching(model: Transformer, tokenizer, out_dir: Path, clean: str | None = None, corrupt: str | None = None
                 ) -> ExperimentResult:
    """Activation patching (denoising) over the residual stream, layer outputs and heads; attribution
    patching against it; path patching from every earlier head into the strongest later head's q, k, v."""
    from circuitlab.viz.patching import attribution_vs_patching_figure, path_patching_figure, patching_figure

    out_dir = Path(out_dir)
    c, x, metric, what, strs = _prompts(model, tokenizer, clean, corrupt)
    targets = default_targets(model)
    results = patching_sweep(model, c, x, metric, targets)
    any_result = next(iter(results.values()))
    summary = [f"prompts: {what}",
               f"metric clean {any_result.clean_value:.3f}, corrupted {any_result.corrupt_value:.3f}"]
    figures = [patching_figure(res, strs).save_png(out_dir / f"patching_{t}.png").name for t, res in results.items()]
    found: dict[str, Any] = {"prompts": what, "tokens": strs, "patching": {t: r.to_dict() for t, r in results.items()}}
    gap = any_result.clean_value - any_result.corrupt_value
    if not gap:
        summary.append("the metric is the same on both prompts, so there is nothing to localise")
        return ExperimentResult("patching", summary, figures, found)
    note = any_result.noise_note()
    if note is not None:  # recoveries of a gap within noise would read as findings: say so, show none
        found["gap_within_noise"] = True
        summary.append(note)
        return ExperimentResult("patching", summary, figures, found)
    for t in ("resid_pre", "head_out", "head_out_by_pos"):
        if t in results:
            top = results[t].top(3)
            summary.append(f"{t}: largest recovery at " + ", ".join(f"{_where(w)} ({e / gap:+.2f})" for w, e in top))

    check = attribution_vs_patching(model, c, x, metric, targets, patching=results)
    figures.append(attribution_vs_patching_figure(check).save_png(out_dir / "attribution_vs_patching.png").name)
    found["attribution_correlation"] = check.to_dict()["correlation"]
    summary.append("attribution patching vs activation patching, Pearson r: "
                   + ", ".join(f"{t} {r:.3f}" for t, r in check.correlation.items() if r == r))

    if model.cfg.n_layers > 1:
        # Receiver: the head after layer 0 whose output recovers the metric most (the induction head here).
        best_head = int(results["head_out"].recovery()[1:].argmax())
        receiver = (1 + best_head // model.cfg.n_heads, best_head % model.cfg.n_heads)
        paths = [path_patching(model, c, x, metric, receiver, inp) for inp in INPUTS]
        figures.append(path_patching_figure(paths).save_png(out_dir / "path_patching.png").name)
        found["path_patching"] = {p.receiver_input: p.to_dict() for p in paths}
        # Each input's strongest sender, and the fraction of the clean - corrupted gap its path removes.
        best = {p.receiver_input: (p.top(1)[0][0], -p.top(1)[0][1] / gap) for p in paths}
        summary.append(f"path patching into {head_name(*receiver)} (the later head whose output recovers most): "
                       + "; ".join(f"{inp.upper()} input: {head_name(*s)} -> {_percent(frac)} of the gap"
                                   for inp, (s, frac) in best.items()))
        inp, (sender, frac) = max(best.items(), key=lambda kv: abs(kv[1][1]))
        found["composition"] = {"receiver": head_name(*receiver), "sender": head_name(*sender), "input": inp,
                                "fraction_of_gap": round(frac, 6)}
    return ExperimentResult("patching", summary, figures, found)


def run_ablation(model: Transformer, tokenizer, out_dir: Path, clean: str | None = None, corrupt: str | None = None,
                 group: list[str] | None = None) -> ExperimentResult:
    """Mean-ablate every head (and MLP) on repeated random sequences and measure the loss on the repeated
    half; then ablate a group of heads together (default: the two after layer 0 that matter most), and
    compare the loss on the first half."""
    from circuitlab.viz.patching import ablation_figure

    out_dir = Path(out_dir)
    gen = torch.Generator().manual_seed(SEED)
    half = min(24, model.cfg.n_ctx // 2)
    eos = getattr(tokenizer, "eos_id", None)
    device = model_device(model)
    tokens = _random_ids((BATCH, half), model.cfg.d_vocab, eos, gen).repeat(1, 2).to(device)
    reference = _random_ids((4 * BATCH, half), model.cfg.d_vocab, eos, gen).repeat(1, 2).to(device)
    second = torch.zeros_like(tokens, dtype=torch.bool)
    second[:, half:] = True
    repeated_loss = next_token_loss(tokens, second)
    first_half = torch.zeros_like(second)
    first_half[:, : half - 1] = True  # predictions of tokens in the first half, which nothing earlier repeats
    first_loss = next_token_loss(tokens, first_half)

    heads = ablate_and_measure(model, tokens, repeated_loss, "head", "mean", reference)
    figures = [ablation_figure(heads, "mean ablation of each head: change in loss on the repeated half"
                               ).save_png(out_dir / "ablation_heads.png").name]
    found: dict[str, Any] = {"tokens": f"{BATCH} random sequences of {half} tokens, each repeated once",
                             "heads": heads.to_dict()}
    summary = [f"loss on the repeated half {heads.baseline:.3f} nats; largest changes when one head is mean-ablated "
               "(+ raises it): " + ", ".join(f"{c} {v:+.3f}" for c, v in heads.top(4))]
    if model.cfg.has_mlp:
        mlps = ablate_and_measure(model, tokens, repeated_loss, "mlp", "mean", reference)
        figures.append(ablation_figure(mlps).save_png(out_dir / "ablation_mlps.png").name)
        found["mlps"] = mlps.to_dict()
        summary.append("MLP layers: " + ", ".join(f"{c} {v:+.3f}" for c, v in mlps.top(3)))

    chosen = "the given heads"
    if group is None:
        # The heads whose ablation hurts most (beyond layer 0, where induction heads cannot be), together.
        change = heads.change()
        later = change[1:] if change.shape[0] > 1 else change
        order = later.flatten().argsort(descending=True)[:2].tolist()
        offset = 1 if change.shape[0] > 1 else 0
        group = [head_name(i // later.shape[1] + offset, i % later.shape[1]) for i in order if later.flatten()[i] > 0]
        chosen = "the heads after layer 0 that hurt most, where induction heads can be"
    if group:
        with torch.no_grad():
            logits = model(tokens)
            ablated = run_ablated(model, tokens, group, "mean", reference)
        before = (float(repeated_loss(logits)), float(first_loss(logits)))
        after = (float(repeated_loss(ablated)), float(first_loss(ablated)))
        found["group"] = {"heads": group, "repeated_loss": [round(before[0], 6), round(after[0], 6)],
                          "first_half_loss": [round(before[1], 6), round(after[1], 6)]}
        summary.append(f"mean-ablating {' and '.join(group)} ({chosen}) together: loss on the repeated half "
                       f"{before[0]:.3f} -> {after[0]:.3f}, on the first half {before[1]:.3f} -> {after[1]:.3f}")
    if clean is not None:
        ids = tokenizer.encode(clean)
        if len(ids) > model.cfg.n_ctx:  # said, not silently cut
            warnings.warn(f"the clean prompt is {len(ids)} tokens, longer than the model's context of "
                          f"{model.cfg.n_ctx}: the ablation reads its last {model.cfg.n_ctx} tokens", stacklevel=2)
        prompt = torch.tensor(ids, device=device)[None, -model.cfg.n_ctx:]
        if prompt.shape[1] > 1 and group:
            loss = next_token_loss(prompt)
            with torch.no_grad():
                b, a = float(loss(model(prompt))), float(loss(run_ablated(model, prompt, group, "mean", reference)))
            found["clean_prompt_loss"] = [round(b, 6), round(a, 6)]
            summary.append(f"on the clean prompt, ablating {', '.join(group)}: loss {b:.3f} -> {a:.3f}")
    return ExperimentResult("ablation", summary, figures, found)


def run_probing(model: Transformer, tokenizer, out_dir: Path, clean: str | None = None, corrupt: str | None = None
                ) -> ExperimentResult:
    """Linear probes for the previous token, "has this token occurred before" and the position, at every
    residual point, on tiled random sequences (the prompts are not used)."""
    from circuitlab.viz.probing import probe_figure

    pos = min(64, model.cfg.n_ctx)
    data = random_sequences(model.cfg.d_vocab, n_batches=8, batch=16, pos=pos, seed=SEED)
    results = train_probes(model, data, ["prev_token", "repeat", "position"])
    figure = probe_figure(results).save_png(Path(out_dir) / "probe_accuracy.png").name
    summary = []
    for name, res in results.items():
        point, score = res.best()
        i = res.points.index(point)
        summary.append(f"{name}: best at {point} with val {res.score} {score:.3f} (control "
                       f"{float(res.control_score[i]):.3f}, chance {res.chance:.3f}); by point: "
                       + ", ".join(f"{p} {float(v):.2f}" for p, v in zip(res.points, res.val_score)))
    return ExperimentResult("probing", summary, [figure], {"probes": {k: v.to_dict() for k, v in results.items()},
                                                           "data": f"8 x 16 tiled random sequences of {pos}"})


EXPERIMENTS: dict[str, Callable[..., ExperimentResult]] = {
    "patching": run_patching,
    "ablation": run_ablation,
    "probing": run_probing,
}
