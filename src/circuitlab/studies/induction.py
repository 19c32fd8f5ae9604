"""The induction study (Olsson et al. 2022, "In-context learning and induction heads"): on a random sequence
repeated twice, [r, r], a model that learned induction predicts the second copy; heads that attend from each
token of the second copy to the token after its first occurrence (prefix matching) and copy it (induction), built
on a previous-token head in an earlier layer, do it; removing them breaks it.

Measured, on `batch` sequences [r, r] of `period` random tokens (special tokens left out):
- the loss at every position (lm_loss), first copy against second;
- every head's previous-token and prefix-matching scores (analysis.heads.detect_heads: the share of attention on
  the previous token / on the token after the earlier occurrence) and its induction score: its direct logit
  attribution to the right next token on the second copy (analysis.logit_attribution: copying, in logits);
- causal evidence: the top-k heads by prefix matching mean-ablated together (analysis.ablation, means over other
  random [r, r]) raise the second copy's loss; k heads drawn at random from the same layers, `draws` times, are
  the control (their mean and spread).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

import circuitlab.memory as memory
from circuitlab.checks import COUNT, INT
from circuitlab.names import head_name, parse_head
from circuitlab.spec import Options, option
from circuitlab.studies.base import Claim, Study, StudyResult, forward_flops

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.viz.figure import FigureSpec

# The verdicts' thresholds, written once: the second copy "far below" the first is half its loss or less; a head
# "attends" by a score of ATTENDS or more; top-k heads "hurt more" than the control by CONTROL_SIGMAS spreads.
SECOND_COPY_SHARE = 0.5
ATTENDS = 0.3
CONTROL_SIGMAS = 2.0
TOP = 5   # heads listed by each score


@dataclass(frozen=True)
class InductionOptions(Options):
    """The induction study's sizes (small by default: the study fits 5 minutes at 150 GFLOP/s on a 135M model)."""

    title = "induction study"
    batch: int = option(8, COUNT, help="random sequences [r, r]")
    period: int = option(24, COUNT, help="tokens in r (each sequence is 2 x period tokens)")
    ks: tuple[int, ...] = option((1, 2, 4, 8), COUNT, nargs="+",
                                 help="how many top induction heads to ablate together, each k in turn")
    draws: int = option(5, COUNT, help="random sets of k heads of the same layers, the control of each k")
    token_seed: int = option(0, INT, help="the seed of the random tokens and of the control draws")


def _tokens(model: "Transformer", tokenizer: Any, opts: InductionOptions, seed: int) -> torch.Tensor:
    """[batch, 2 * period] random [r, r], the tokenizer's special tokens left out."""
    from circuitlab.data.synthetic import repeated_random_tokens

    special = sorted({int(i) for n in ("eos_id", "bos_id", "pad_id") if (i := getattr(tokenizer, n, None)) is not None})
    gen = torch.Generator().manual_seed(seed)
    return repeated_random_tokens(opts.batch, opts.period, model.cfg.d_vocab, gen, exclude=special)


def _second_copy_loss(logits: torch.Tensor, tokens: torch.Tensor, period: int) -> float:
    """Mean loss predicting the second copy's tokens 2..period (the first is not predictable by copying)."""
    from circuitlab.model.transformer import lm_loss

    return float(lm_loss(logits[:, period:-1].float(), tokens[:, period + 1:]))


@torch.no_grad()
def head_scores(model: "Transformer", tokens: torch.Tensor, period: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(scores name -> [layer, head], loss by position [2 * period - 1]) on [r, r] tokens [batch, 2 * period]:
    previous_token and prefix_matching (attention shares, analysis.heads.detect_heads) and induction (each head's
    direct logit attribution to the right next token, averaged over the second copy's predictions)."""
    from circuitlab.analysis.heads.detectors import detect_heads
    from circuitlab.analysis.logit_attribution import direct_logit_attribution, residual_decomposition
    from circuitlab.model.transformer import lm_loss

    logits, cache = model.run_with_cache(tokens)
    found = detect_heads(cache, tokens)
    parts = residual_decomposition(model, cache)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    rows = torch.tensor([parts.labels.index(head_name(l, h)) for l in range(L) for h in range(H)])
    dla = torch.zeros(L * H, dtype=torch.float64)
    positions = range(period, 2 * period - 1)   # predicting the second copy's tokens 2..period
    for pos in positions:
        attribution = direct_logit_attribution(model, cache, tokens[:, pos + 1], pos=pos, decomposition=parts)
        dla += attribution.mean()[rows].double()
    scores = {"induction": (dla / len(positions)).view(L, H), "prefix_matching": found["induction"].double().cpu(),
              "previous_token": found["previous_token"].double().cpu()}
    loss = lm_loss(logits[:, :-1].float(), tokens[:, 1:], per_token=True).mean(0).cpu()
    return scores, loss


def top_heads(scores: torch.Tensor, k: int) -> list[str]:
    """The k highest-scoring heads of scores [layer, head], best first."""
    H = scores.shape[1]
    return [head_name(i // H, i % H) for i in torch.nan_to_num(scores, nan=-1e9).flatten().argsort(
        descending=True)[:k].tolist()]


def control_draw(top: list[str], n_heads: int, gen: torch.Generator) -> list[str]:
    """For each head of `top`, another head of the same layer, none of them in `top`, no head twice."""
    taken = set(top)
    drawn = []
    for name in top:
        layer, _ = parse_head(name)
        free = [h for h in range(n_heads) if head_name(layer, h) not in taken]
        if not free:   # every head of this layer is already taken: the layer cannot give one more
            continue
        pick = head_name(layer, free[int(torch.randint(len(free), (1,), generator=gen))])
        taken.add(pick)
        drawn.append(pick)
    return drawn


@torch.no_grad()
def ablation_evidence(model: "Transformer", tokens: torch.Tensor, reference: torch.Tensor, ranking: torch.Tensor,
                    opts: InductionOptions, progress: bool = True) -> dict[str, Any]:
    """For each k of opts.ks: the second copy's loss with the top-k heads of `ranking` [layer, head] mean-ablated
    together, and with `draws` random sets of heads of the same layers (mean and standard deviation)."""
    from circuitlab.analysis.ablation import reference_values, run_ablated

    H = model.cfg.n_heads
    every = [head_name(l, h) for l in range(model.cfg.n_layers) for h in range(H)]
    values = reference_values(model, every, "mean", reference, (tokens.shape[0], tokens.shape[1]))   # one reference pass
    baseline = _second_copy_loss(model(tokens), tokens, opts.period)
    gen = torch.Generator().manual_seed(opts.token_seed + 1)
    rows = []
    bar = tqdm(total=len(opts.ks) * (1 + opts.draws), desc="induction: ablations", unit="run", disable=not progress)
    for k in opts.ks:
        top = top_heads(ranking, min(k, len(every)))
        ablated = _second_copy_loss(run_ablated(model, tokens, top, "mean", values=values), tokens, opts.period)
        bar.update(1)
        controls = []
        for _ in range(opts.draws):
            drawn = control_draw(top, H, gen)
            controls.append(_second_copy_loss(run_ablated(model, tokens, drawn, "mean", values=values), tokens,
                                              opts.period))
            bar.update(1)
        c = torch.tensor(controls, dtype=torch.float64)
        rows.append({"k": k, "heads": top, "loss": round(ablated, 6), "rise": round(ablated - baseline, 6),
                     "control_losses": [round(x, 6) for x in controls],
                     "control_rise_mean": round(float(c.mean()) - baseline, 6),
                     "control_rise_std": round(float(c.std()) if len(c) > 1 else 0.0, 6)})
    bar.close()
    return {"baseline_loss": round(baseline, 6), "by_k": rows}


def run_induction(model: "Transformer", tokenizer: Any, options: InductionOptions, progress: bool = True
                  ) -> StudyResult:
    """The induction study on `model` (see the module docstring)."""
    opts = options.check()
    from circuitlab.errors import CircuitlabError

    if 2 * opts.period > model.cfg.n_ctx:
        raise CircuitlabError(f"period {opts.period}: two copies need {2 * opts.period} tokens, more than the "
                              f"model's context of {model.cfg.n_ctx}")
    t0 = time.time()
    tokens = _tokens(model, tokenizer, opts, opts.token_seed)
    reference = _tokens(model, tokenizer, opts, opts.token_seed + 100)
    scores, loss = head_scores(model, tokens, opts.period)
    causal = ablation_evidence(model, tokens, reference, scores["prefix_matching"], opts, progress)
    first = float(loss[: opts.period - 1].mean())
    second = float(loss[opts.period:].mean())
    numbers = {"loss_by_position": [round(float(x), 4) for x in loss], "loss_first_copy": round(first, 4),
               "loss_second_copy": round(second, 4),
               "scores": {k: [[round(float(x), 4) for x in row] for row in v] for k, v in scores.items()},
               "top": {k: [{"head": h, "score": round(float(v[parse_head(h)]), 4)} for h in top_heads(v, TOP)]
                       for k, v in scores.items()},
               "causal": causal}
    setup = {"sequences": opts.batch, "period": opts.period, "seed": opts.token_seed, "ks": list(opts.ks),
             "draws": opts.draws, "ablation": "mean over other random [r, r] (sequences and positions)"}
    return StudyResult("induction", setup, numbers, induction_claims(numbers), seconds={
        "wall": round(time.time() - t0, 1)})


def induction_claims(n: dict[str, Any]) -> list[Claim]:
    """The paper's claims against the numbers (numbers as run_induction writes them): every verdict states the
    numbers it follows from."""
    first, second = n["loss_first_copy"], n["loss_second_copy"]
    claims = [Claim("The model does induction: it predicts the second copy of a repeated random sequence far better "
                    "than the first.",
                    f"loss {first:.2f} nats on the first copy, {second:.2f} on the second "
                    f"({second / first:.0%} of it; far below means at most {SECOND_COPY_SHARE:.0%})." if first > 0 else
                    f"loss {first:.2f} on the first copy: nothing to compare with.",
                    second <= SECOND_COPY_SHARE * first if first > 0 else None)]
    prefix, prev = n["top"]["prefix_matching"][0], n["top"]["previous_token"][0]
    (pl, _), (vl, _) = parse_head(prefix["head"]), parse_head(prev["head"])
    attends = prefix["score"] >= ATTENDS and prev["score"] >= ATTENDS
    claims.append(Claim(
        "Induction heads attend from each token to the one after its earlier occurrence, and a previous-token head "
        "in an earlier layer supplies the key they match.",
        f"best prefix-matching head {prefix['head']} (score {prefix['score']:.2f}), best previous-token head "
        f"{prev['head']} ({prev['score']:.2f}); " + (
            f"a head attends with a score of {ATTENDS:g} or more, so " if attends else
            f"a score below {ATTENDS:g} is not attending, so nothing can be said of their order."
        ) + ((f"the previous-token head is earlier (layer {vl} < {pl})." if vl < pl else
              f"the previous-token head is not earlier (layer {vl} >= {pl}).") if attends else ""),
        (vl < pl) if attends else None))
    for row in n["causal"]["by_k"]:
        claims.append(_ablation_claim(row))
    return claims


def _ablation_claim(row: dict[str, Any]) -> Claim:
    """One k: do the top-k heads raise the second copy's loss more than the control's mean + CONTROL_SIGMAS sd?"""
    k, rise, mean, sd = row["k"], row["rise"], row["control_rise_mean"], row["control_rise_std"]
    bound = mean + CONTROL_SIGMAS * sd
    holds = rise > 0 and rise > bound
    said = (f"ablating {', '.join(row['heads'])} raises the second copy's loss by {rise:+.3f} nats; random heads of "
            f"the same layers by {mean:+.3f} ± {sd:.3f} (mean ± sd of {len(row['control_losses'])} draws)")
    if holds:
        said += f": more than the control's mean + {CONTROL_SIGMAS:g} sd ({bound:+.3f})."
    elif rise <= 0:
        said += ": the top heads do not raise it at all."
    else:
        said += f": not more than the control's mean + {CONTROL_SIGMAS:g} sd ({bound:+.3f})."
    return Claim(f"Mean-ablating the top {k} induction head{'s' if k > 1 else ''} hurts the second copy more than "
                 f"{k} random head{'s' if k > 1 else ''} of the same layers.", said, holds)


def induction_markdown(result: StudyResult) -> list[str]:
    """report.md's body after the claims: the top heads and the ablations."""
    n = result.numbers
    lines = ["", "### Top heads", "", "| score | heads |", "|---|---|"]
    for name, rows in n["top"].items():
        lines.append(f"| {name.replace('_', ' ')} | " + ", ".join(f"{r['head']} {r['score']:.3f}" for r in rows) + " |")
    lines += ["", f"Induction score: the head's direct logit attribution to the right token on the second copy "
                  f"(logits); prefix matching and previous token: shares of attention (0..1).", "",
              "### Ablations (second copy's loss; baseline "
              f"{n['causal']['baseline_loss']:.3f} nats)", "", "| k | heads | rise | random heads' rise (mean ± sd) |",
              "|---|---|---|---|"]
    for r in n["causal"]["by_k"]:
        lines.append(f"| {r['k']} | {', '.join(r['heads'])} | {r['rise']:+.3f} | {r['control_rise_mean']:+.3f} ± "
                     f"{r['control_rise_std']:.3f} |")
    return lines


def induction_figures(result: StudyResult) -> dict[str, "FigureSpec"]:
    """Loss by position; the three scores as layer x head heat maps; the ablations against their controls."""
    from circuitlab.viz.parts import Heatmap, Panel, Rule, Series, as_array
    from circuitlab.viz.figure import FigureSpec

    n = result.numbers
    p = result.setup["period"]
    loss = n["loss_by_position"]
    figs = {"loss_by_position": FigureSpec([Panel(
        "Loss by position on [r, r]", "position predicted", "loss (nats)",
        series=[Series(list(range(1, len(loss) + 1)), loss, "loss", kind="line+markers")],
        rules=[Rule(x=p + 0.5, label="second copy starts")])], "Induction: loss by position")}
    panels = []
    for name, grid in n["scores"].items():
        rows = len(grid)
        z = as_array(grid)
        signed = name == "induction"   # logits, either sign: white at 0; the attention shares run 0..1
        top = float(abs(z[z == z]).max()) if signed and (z == z).any() else 1.0
        panels.append(Panel(heatmap=Heatmap(z, [f"H{h}" for h in range(len(grid[0]))],
                                            [f"L{l}" for l in range(rows)], -top if signed else 0.0, top,
                                            "RdBu_r" if signed else "Blues", value_name="score", value_format=".3f"),
                            x_title="head", y_title="layer", name=name.replace("_", " ")))
    figs["head_scores"] = FigureSpec(panels, "Every head's scores (layer x head)", layout="menu",
                                     height=min(900, 200 + 22 * len(n["scores"]["induction"])))
    by_k = n["causal"]["by_k"]
    ks = [r["k"] for r in by_k]
    figs["ablation"] = FigureSpec([Panel(
        "Second copy's loss rise when heads are mean-ablated", "k heads", "rise (nats)",
        series=[Series(ks, [r["rise"] for r in by_k], "top-k induction heads", kind="line+markers"),
                Series(ks, [r["control_rise_mean"] for r in by_k], "random heads, same layers (mean)",
                       kind="line+markers", dash="dash"),
                Series(ks, [r["control_rise_mean"] + CONTROL_SIGMAS * r["control_rise_std"] for r in by_k],
                       f"random: mean + {CONTROL_SIGMAS:g} sd", kind="line", dash="dot")])], "Causal evidence")
    return figs


def estimate_induction(model: "Transformer", options: InductionOptions) -> memory.Estimate:
    """The cached run, the reference run and one ablated run per k and per draw, over [batch, 2 * period]."""
    from circuitlab.model.transformer import cache_estimate

    opts = options.check()
    T = 2 * opts.period
    est = cache_estimate(model, opts.batch, T)
    runs = 2 + len(opts.ks) * (1 + opts.draws) + 1
    return memory.Estimate(f"induction study ({runs} runs of {opts.batch} x {T} tokens)", est.parts,
                           held=memory.tensor_bytes(model), flops=runs * forward_flops(model, opts.batch * T),
                           efficiency=0.5)


STUDY = Study("induction", "Induction heads", "Olsson et al. 2022, In-context learning and induction heads",
              InductionOptions, run_induction, induction_markdown, induction_figures, estimate_induction)
