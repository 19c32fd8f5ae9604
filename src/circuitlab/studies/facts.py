"""The facts study (Meng et al. 2022, "Locating and editing factual associations in GPT"): a model that recalls
"The Eiffel Tower is located in the city of" -> " Paris" does it in two places. With the subject's embeddings
corrupted by noise, restoring the clean MLP outputs gives the answer back most at the subject's last token in
early-to-middle layers, restoring attention gives it back at the last token in later layers; the hidden state
carries it at both sites. Restoring the hidden state at the subject's last token with the later MLPs frozen at
their corrupted values (severed) gives back less: the MLPs there carry the effect.

Measured on the facts of studies/facts_data.py whose answer is one token in this tokenizer (checked) and which the
model gets right (its top next token, checked): causal tracing of each (analysis.patching.causal_tracing, the
method `interpret --experiments causal_tracing` runs: prefix-reusing restoration sweeps, noise samples in the
batch), averaged by Meng's token groups (average_causal_trace: the average indirect effect, AIE, by layer and
group), for the hidden states, the MLP and attention outputs (windows of layers) and the hidden states with later
MLPs severed (the method's hidden_no_mlp kind). The noise's std is measured once over every traced subject.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import circuitlab.memory as memory
from circuitlab.checks import COUNT, INT
from circuitlab.errors import CircuitlabError
from circuitlab.spec import Options, option
from circuitlab.studies.base import Claim, Study, StudyResult
from circuitlab.studies.facts_data import FACTS

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.viz.spec import FigureSpec

# The verdicts' thresholds, written once: corruption "destroys" recall when it leaves at most DESTROYED of the clean
# probability; a site "carries" the answer when its AIE is SITE_SHARE of the average total effect or more; the
# early-to-middle layers are the first EARLY of the depth, the late layers the rest; severing the MLPs "takes
# away" the effect when the severed hidden state gives back at most SEVERED of the unsevered one there.
DESTROYED = 0.5
SITE_SHARE = 0.2
EARLY = 2 / 3
SEVERED = 0.8
LAST_SUBJECT, LAST = "last subject token", "last token"
KINDS = ("hidden", "mlp", "attn", "hidden_no_mlp")
CLAIMS = ("Corrupting the subject's token embeddings destroys the recall of the fact.",
          "The MLPs' effect peaks at the subject's last token, in early-to-middle layers.",
          "Attention's effect peaks at the last token, in later layers than the MLPs'.",
          "The hidden state carries the answer at two sites: the subject's last token in early-to-middle layers, "
          "and the last token in late layers.",
          "Severing the later MLPs takes away much of the hidden state's effect at the subject's last token in "
          "early-to-middle layers: the MLPs there carry it.")


@dataclass(frozen=True)
class FactsOptions(Options):
    """The facts study's sizes (small by default: the study fits 5 minutes at 150 GFLOP/s on a 135M model)."""

    title = "facts study"
    facts: int = option(30, COUNT, help="facts traced at most: the first of those the model gets right")
    noise_samples: int = option(1, COUNT, metavar="N",
                                help="corrupted runs per fact (Meng: 10; the average over facts also averages noise)")
    window: int | None = option(None, COUNT, metavar="W",
                                help="layers restored together for MLP and attention (default: 10/48 of the depth)")
    noise_seed: int = option(0, INT, help="the seed of the noise")


def one_token_facts(tokenizer: Any, facts: tuple[tuple[str, str, str], ...] = FACTS
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """(the facts whose answer " " + answer is one token, as {"prompt", "subject", "answer", "token"}; the answers
    left out, each with its token count: 0 when the tokenizer cannot encode the fact)."""
    kept, dropped = [], []
    for prompt, subject, answer in facts:
        try:
            ids = tokenizer.encode(" " + answer)
            tokenizer.encode(prompt)
        except (CircuitlabError, KeyError):   # e.g. a char or word tokenizer without one of its letters or words
            ids = []
        if len(ids) == 1:
            kept.append({"prompt": prompt, "subject": subject, "answer": answer, "token": int(ids[0])})
        else:
            dropped.append(f"{answer} ({len(ids)} tokens)")
    return kept, dropped


@torch.no_grad()
def recall(model: "Transformer", tokenizer: Any, facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each fact with the model's clean answer: "prob" of the answer, "top" its top next token (text), "known"
    whether the top token is the answer."""
    out = []
    for f in facts:
        tokens = torch.tensor(tokenizer.encode(f["prompt"]))
        probs = model(tokens[None])[0, -1].float().softmax(-1)
        top = int(probs.argmax())
        out.append({**f, "prob": round(float(probs[f["token"]]), 6), "top": tokenizer.decode([top]),
                    "known": top == f["token"], "n_tokens": len(tokens)})
    return out


def run_facts(model: "Transformer", tokenizer: Any, options: FactsOptions, progress: bool = True) -> StudyResult:
    """The facts study on `model` (see the module docstring)."""
    from circuitlab.analysis.patching.causal_tracing import average_causal_trace, check_window
    from circuitlab.analysis.patching.noise import Noise

    opts = options.check()
    if tokenizer is None:
        raise CircuitlabError("the facts study writes English prompts: the checkpoint needs its tokenizer")
    window = check_window(model, opts.window)
    t0 = time.time()
    single, dropped = one_token_facts(tokenizer)
    checked = recall(model, tokenizer, single)
    known = [f for f in checked if f["known"]]
    not_known = [{"prompt": f["prompt"], "answer": f["answer"], "top": f["top"], "prob": f["prob"]}
                 for f in checked if not f["known"]]
    counts = {"candidates": len(FACTS), "one_token": len(single), "known": len(known)}
    setup: dict[str, Any] = {"answers_left_out": dropped, "noise_samples": opts.noise_samples, "window": window,
                             "kinds": list(KINDS), "metric": "the answer's probability at the last position",
                             "n_layers": model.cfg.n_layers}
    said = ("the model is attention-only: no MLPs to trace." if not model.cfg.has_mlp else
            f"the model gets none of the {len(checked)} facts with a one-token answer right: nothing to trace.")
    if not known or not model.cfg.has_mlp:   # the claims cannot be decided (`study all` goes on with the next study)
        return StudyResult("facts", {**setup, "facts": []}, {**counts, "traced": 0, "not_known": not_known},
                           [Claim(c, said, None) for c in CLAIMS], seconds={"wall": round(time.time() - t0, 1)})
    traced = known[: opts.facts]
    noise = Noise(samples=opts.noise_samples, seed=opts.noise_seed)
    average = average_causal_trace(model, [f["prompt"] for f in traced], [f["subject"] for f in traced],
                                   [f["token"] for f in traced], tokenizer=tokenizer, kinds=list(KINDS),
                                   window=window, noise=noise, progress=progress)
    per_fact = []
    for f, trace in zip(traced, average.traces):
        lo, hi = min(trace.clean_value, trace.corrupt_value), max(trace.clean_value, trace.corrupt_value)
        row = {"prompt": f["prompt"], "subject": f["subject"], "answer": f["answer"],
               "clean": round(trace.clean_value, 6), "corrupted": round(trace.corrupt_value, 6),
               "subject_tokens": list(trace.subject), "n_tokens": len(trace.tokens),
               # the last layer's state restored at the last token: the clean run's output (a check)
               "hidden_last": round(float(trace.values["hidden"][-1, -1]), 6)}
        for kind in KINDS:
            v = trace.values[kind]
            row[f"{kind}_range"] = [round(float(v.min()), 6), round(float(v.max()), 6)]
            row[f"{kind}_within"] = round(float(((v >= lo - 1e-9) & (v <= hi + 1e-9)).double().mean()), 4)
        per_fact.append(row)
    summary = average.to_dict()
    summary.pop("prompts")   # the per-fact grids: per_fact keeps what the report reads
    numbers = {**counts, "traced": len(traced),
               "clean_mean": round(sum(r["clean"] for r in per_fact) / len(per_fact), 6),
               "corrupted_mean": round(sum(r["corrupted"] for r in per_fact) / len(per_fact), 6),
               "average": summary, "facts": per_fact, "not_known": not_known}
    setup.update(facts=[f["prompt"] + " -> " + f["answer"] for f in traced], noise=summary["noise"])
    return StudyResult("facts", setup, numbers, facts_claims(numbers, model.cfg.n_layers),
                       seconds={"wall": round(time.time() - t0, 1)})


def _column(avg: dict[str, Any], kind: str, category: str) -> list[float]:
    """The AIE of `kind` by layer at one token group (NaN as None in the stored form)."""
    c = avg["categories"].index(category)
    return [float("nan") if row[c] is None else float(row[c]) for row in avg["values"][kind]]


def facts_claims(n: dict[str, Any], n_layers: int) -> list[Claim]:
    """Meng et al.'s claims against the numbers (as run_facts writes them); every verdict states its numbers."""
    avg = n["average"]
    ate = float(avg["total_effect"])
    clean, corrupt = n["clean_mean"], n["corrupted_mean"]
    early = max(1, round(EARLY * n_layers))   # layers 0 .. early - 1
    claims = [Claim(
        CLAIMS[0],
        f"the answer's probability is {clean:.3f} on average over {n['traced']} facts, {corrupt:.3f} with the "
        f"subject corrupted ({corrupt / clean:.0%} of it; destroyed means at most {DESTROYED:.0%})." if clean > 0 else
        "the clean probability is 0: nothing to destroy.", corrupt <= DESTROYED * clean if clean > 0 else None)]
    mlp = avg["peaks"]["mlp"]
    at_subject = mlp["category"] == LAST_SUBJECT
    claims.append(Claim(
        CLAIMS[1],
        f"the MLP outputs' AIE peaks at layer {mlp['layer']} at the {mlp['category']} ({mlp['effect']:+.3f}, "
        f"{mlp['share']:.0%} of the average total effect {ate:+.3f}); early-to-middle means layers 0-{early - 1} of "
        f"{n_layers}.", at_subject and mlp["layer"] < early))
    attn = avg["peaks"]["attn"]
    claims.append(Claim(
        CLAIMS[2],
        f"the attention outputs' AIE peaks at layer {attn['layer']} at the {attn['category']} ({attn['effect']:+.3f}, "
        f"{attn['share']:.0%} of the average total effect); the MLPs' at layer {mlp['layer']}.",
        attn["category"] == LAST and attn["layer"] > mlp["layer"]))
    subj = _column(avg, "hidden", LAST_SUBJECT)
    last = _column(avg, "hidden", LAST)
    early_site = max((x for x in subj[:early] if x == x), default=float("nan"))
    late_site = max((x for x in last[early:] if x == x), default=float("nan"))
    both = ate > 0 and early_site >= SITE_SHARE * ate and late_site >= SITE_SHARE * ate
    claims.append(Claim(
        CLAIMS[3],
        f"restoring the hidden state gives back at most {early_site:+.3f} at the last subject token in layers "
        f"0-{early - 1} and {late_site:+.3f} at the last token in layers {early}-{n_layers - 1} (a site carries it "
        f"with {SITE_SHARE:.0%} of the average total effect, {SITE_SHARE * ate:+.3f}, or more).",
        both if ate > 0 and early_site == early_site and late_site == late_site else None))
    claims.append(_severed_claim(avg, early))
    return claims


def _severed_claim(avg: dict[str, Any], early: int) -> Claim:
    """Does severing the later MLPs take the hidden state's effect at the last subject token away, early on?"""
    with_mlp = [x for x in _column(avg, "hidden", LAST_SUBJECT)[:early] if x == x]
    without = [x for x in _column(avg, "hidden_no_mlp", LAST_SUBJECT)[:early] if x == x]
    a = sum(with_mlp) / len(with_mlp) if with_mlp else float("nan")
    b = sum(without) / len(without) if without else float("nan")
    decided = with_mlp and without and a > 0
    said = (f"at the subject's last token, layers 0-{early - 1}: restoring the hidden state gives back {a:+.3f} on "
            f"average, {b:+.3f} with the later MLPs frozen at their corrupted values")
    said += (f" ({b / a:.0%} of it; taken away means at most {SEVERED:.0%})." if decided else
             ": the unsevered effect is not positive, nothing to take away.")
    return Claim(CLAIMS[4], said, b <= SEVERED * a if decided else None)


def facts_markdown(result: StudyResult) -> list[str]:
    """report.md's body after the claims: the facts kept, the peaks, the per-fact table."""
    n, s = result.numbers, result.setup
    if not n["traced"]:
        return ["", f"{n['candidates']} facts written; {n['one_token']} with a one-token answer in this tokenizer; "
                    f"the model gets {n['known']} right: nothing traced ({result.claims[0].verdict})"]
    avg = n["average"]
    lines = ["", f"{n['candidates']} facts written; {n['one_token']} with a one-token answer in this tokenizer"
             + (f" (left out: {', '.join(s['answers_left_out'])})" if s["answers_left_out"] else "")
             + f"; the model gets {n['known']} right (its top next token); {n['traced']} traced, "
             f"{s['noise_samples']} noise sample{'s' if s['noise_samples'] > 1 else ''} each "
             f"(Gaussian, std {avg['noise'].get('nu', float('nan')):.3g}), MLP and attention restored in windows of "
             f"{s['window']} layers.", "", "### Where each kind's average indirect effect peaks", "",
             "| restored | layer | token group | AIE | share of the average total effect |", "|---|---|---|---|---|"]
    for kind, p in avg["peaks"].items():
        lines.append(f"| {kind} | {p['layer']} | {p['category']} | {p['effect']:+.4f} | {p['share']:.0%} |")
    lines += ["", f"Average total effect {avg['total_effect']:+.4f} (clean {n['clean_mean']:.4f}, corrupted "
                  f"{n['corrupted_mean']:.4f}).", "", "### The facts traced", "",
              "| prompt | answer | clean | corrupted |", "|---|---|---|---|"]
    lines += [f"| {r['prompt']} | {r['answer']} | {r['clean']:.3f} | {r['corrupted']:.3f} |" for r in n["facts"]]
    if n["not_known"]:
        lines += ["", "Not known (left out): " + "; ".join(f"{r['prompt']} -> {r['answer']} (top {r['top']!r})"
                                                         for r in n["not_known"])]
    return lines


def facts_figures(result: StudyResult) -> dict[str, "FigureSpec"]:
    """Meng's three panels (hidden, MLP, attention AIE by layer and token group) and the severed comparison."""
    from circuitlab.methods.causal_tracing import average_trace_figure
    from circuitlab.viz.parts import Panel, Series
    from circuitlab.viz.spec import FigureSpec

    if not result.numbers["traced"]:
        return {}
    avg = result.numbers["average"]
    three = {**avg, "values": {k: avg["values"][k] for k in ("hidden", "mlp", "attn")},
             "prompts": result.numbers["facts"]}
    layers = list(range(len(avg["values"]["hidden"])))
    severed = FigureSpec([Panel(
        "At the subject's last token", "layer", "average indirect effect",
        series=[Series(layers, _column(avg, "hidden", LAST_SUBJECT), "hidden state restored", kind="line+markers"),
                Series(layers, _column(avg, "hidden_no_mlp", LAST_SUBJECT), "later MLPs severed",
                       kind="line+markers", dash="dash")])],
        "Restoring the hidden state, with and without the later MLPs")
    return {"tracing": average_trace_figure(three), "severed_mlp": severed}


# prompts of ~10 tokens reach less of the matmul speed than causal tracing's usual prompt (per-op overhead): measured on
# SmolLM2, one thread, 40 facts took 308 s of CPU where TRACE_EFFICIENCY alone said 182 s
SHORT_PROMPTS = 0.6


def estimate_facts(model: "Transformer", options: FactsOptions) -> memory.Estimate:
    """Causal tracing of the first `facts` facts (a token a word, and the first: the prompts' length and the
    subject's place before tokenizing), each kind's restoration sweep from the subject's first position on."""
    from circuitlab.analysis.patching.causal_tracing import TRACE_EFFICIENCY, trace_flops, trace_estimate

    opts = options.check()
    flops = 0.0
    for prompt, subject, _ in FACTS[: opts.facts]:
        words = prompt.split()
        first = len(prompt[: prompt.find(subject)].split())
        flops += trace_flops(model.cfg, len(words), opts.noise_samples, list(KINDS), opts.window, first)[0]
    one = trace_estimate(model, max(len(p.split()) for p, _, _ in FACTS), runs=opts.noise_samples, kinds=len(KINDS))
    return memory.Estimate(f"facts study (causal tracing of {min(opts.facts, len(FACTS))} facts, "
                           f"{opts.noise_samples} noise sample{'s' if opts.noise_samples > 1 else ''}, {len(KINDS)} kinds)", one.parts,
                           held=memory.tensor_bytes(model), flops=flops, efficiency=TRACE_EFFICIENCY * SHORT_PROMPTS)


STUDY = Study("facts", "Factual recall: causal tracing", "Meng et al. 2022, Locating and editing factual "
              "associations in GPT", FactsOptions, run_facts, facts_markdown, facts_figures, estimate_facts)
