"""What `forge compare` found, as sentences: each computed from the comparison's numbers by a stated
rule (docs/forge.md), none written by hand."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.report.markdown import percent as _pct

MATCH, PARTLY = 0.8, 0.5  # agreement thresholds of "attends like" and "partly like"

def _where(profile: dict[str, Any], limit: float = 0.15) -> str:
    """The attention categories that take at least `limit` of a head's attention, largest first."""
    mass = sorted(profile["mass"].items(), key=lambda kv: -kv[1])
    parts = [f"{c} {v:.2f}" for c, v in mass if v >= limit] or [f"{mass[0][0]} {mass[0][1]:.2f}"]
    return ", ".join(parts)


def findings(results: dict[str, Any]) -> list[str]:
    """What the comparison found, as sentences computed from results (summarize_comparison's dict): accuracy,
    each hand-built head's closest trained head, then the differences (attention, then OV subspaces)."""
    agree = torch.tensor(results["agreement"]["agreement"])  # [hand head, trained head]
    matches, matched = _head_matches(results, agree)
    diffs = _attention_differences(results, agree, matched) + _ov_differences(results, agree)
    return [_accuracy(results), *matches] + [f"{d[0].upper()}{d[1:]}." for d in diffs]


def _accuracy(results: dict[str, Any]) -> str:
    """Both models' exact answers (and the trained model's on pairs held out of its training)."""
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
    return line


def _head_matches(results: dict[str, Any], agree: torch.Tensor) -> tuple[list[str], set[str]]:
    """A sentence per hand-built head on its closest trained head by attention agreement; the trained heads
    matched at least partly."""
    out = []
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
    return out, matched


def _attention_differences(results: dict[str, Any], agree: torch.Tensor, matched: set[str]) -> list[str]:
    """Differences measured on the attention categories (matched grows by the trained heads that stand in for
    two hand-built ones)."""
    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    prof_h, prof_t = results["attention"]["hand"], results["attention"]["trained"]
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
    return diffs


def _ov_differences(results: dict[str, Any], agree: torch.Tensor) -> list[str]:
    """OV subspaces, against chance and against the plain digits-vs-EOS contrast."""
    hand_heads, other_heads = results["agreement"]["heads_a"], results["agreement"]["heads_b"]
    diffs = []
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
    return diffs
