"""report.md: the demo's and `circuitlab interpret`'s findings in words, from their results (the
to_dict() form that results.json holds). Every number comes from the results; nothing is read back."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from circuitlab.report.results import (CausalEvidence, DemoFindings, DemoModelFindings, Findings, ForgeComparison,
                                       InterpretResults, PeriodFindings)
from circuitlab.training.phase import PhaseChange


def demo_narrative(results: DemoFindings | Mapping[str, Any]) -> list[str]:
    """The demo's story in Markdown lines: what was trained, the phase change, the heads found, the
    1-layer contrast and the causal evidence (report.md's opening and report.html's summary).
    results: the demo's results.json (or its DemoFindings)."""
    results = DemoFindings.of(results)
    two, one = results.model("2l"), results.model("1l")
    lines: list[str] = []
    if two:
        lines += [f"A 2-layer attention-only transformer trained for {two.steps} steps "
                  f"({two.tokens_seen:,} tokens) on the built-in stories mixed with repeated random "
                  f"segments reached a validation loss of {two.best_val_loss:.3f}.", ""]
        pc = two.phase_change
        if pc is not None:
            lines += [f"**Phase change.** Around step {pc.step} ({pc.tokens:,} tokens) the induction score "
                      f"of the best head jumped to {pc.induction_after:.2f} (from {pc.induction_before:.2f}), "
                      f"while the loss on the repeated half of random sequences "
                      f"{_moved(pc.repeat_loss_before, pc.repeat_loss_after, 'fell', 'rose')}.{_icl_sentence(pc)} "  # type: ignore[arg-type]
                      "The training curves mark it on every panel.", ""]
        else:
            lines += ["**No clear phase change** was seen in the induction score during training.", ""]
        if two.induction_heads:
            lines += [f"**Induction heads:** {', '.join(two.induction_heads)}; "
                      f"**previous-token heads:** {', '.join(two.previous_token_heads) or 'none'}. "
                      "Each induction label needs behaviour and weights to agree:", ""]
            lines += [f"- {e}" for e in two.induction_evidence] + [""]
        else:
            lines += ["**No induction head** was found in the 2-layer model.", ""]
        if two.rejected:
            lines += ["Heads that attend like induction heads but lack the weight evidence:", ""]
            lines += [f"- {e}" for e in two.rejected] + [""]
    if one:
        lines += contrast_lines(one, two)
    return lines + causal_paragraph(results.causal_evidence)


# Below this many nats, two losses are reported as "about the same": the demo's losses are printed to
# 0.01, and a difference this small is within what another seed or batch would move them by.
SAME_LOSS = 0.05


def _moved(before: float, after: float, down: str = "fell", up: str = "rose") -> str:
    """'fell from 3.20 to 1.10' / 'rose from ...' / 'stayed at about 6.25 (6.25 to 6.25)': the verb follows
    the numbers."""
    if abs(after - before) < SAME_LOSS:
        return f"stayed at about {before:.2f} ({before:.2f} to {after:.2f})"
    return f"{down if after < before else up} from {before:.2f} to {after:.2f}"


def contrast_lines(one: DemoModelFindings, two: DemoModelFindings | None) -> list[str]:
    """The 1-layer contrast. The composition sentence is written only when the numbers show it: the
    2-layer model has induction heads, the 1-layer one has none, and its repeated-token loss is clearly
    higher (by SAME_LOSS or more); otherwise the report says which part did not happen."""
    best = max((h.induction_score for h in one.heads), default=0.0)
    heads = 'no induction head' if not one.induction_heads else 'induction heads ' + ', '.join(one.induction_heads)
    text = f"**Contrast.** The 1-layer model ({one.steps} steps) has {heads} (best induction score {best:.2f})"
    if two is None:
        return [text + f"; its loss on repeated random tokens is {one.repeat_loss:.2f}.", ""]
    text += (f"; its loss on repeated random tokens is {one.repeat_loss:.2f} against {two.repeat_loss:.2f} "
             "for the 2-layer model. ")
    if not two.induction_heads:
        text += ("The 2-layer model formed no induction head either, so this run does not show what composition "
                 "adds; train it longer (`circuitlab demo --steps N`).")
    elif one.induction_heads:
        text += "Both models have heads labelled induction, so this run does not show the contrast."
    elif one.repeat_loss - two.repeat_loss < SAME_LOSS:  # type: ignore[operator]
        text += ("The 2-layer model's induction heads do not lower its repeated-token loss below the 1-layer "
                 "model's, so this run does not show what composition adds.")
    else:
        text += "One layer cannot compose a previous-token head with a copying head."
    return [text, ""]


def demo_markdown(results: DemoFindings | Mapping[str, Any]) -> str:
    """The demo's report.md: the narrative, each analysis's summary, the head table, the figures."""
    results = DemoFindings.of(results)
    lines = ["# circuitlab demo: induction heads", ""] + demo_narrative(results) + period_lines(results.models)
    for experiment, found in results.analysis.items():
        lines += [f"## {experiment.replace('_', ' ').capitalize()}", ""]
        lines += [f"- {line}" for line in Findings.of(found).summary] + [""]
    lines += ["## Heads", "", "| model | head | induction | previous-token | copying | labels |",
              "|---|---|---|---|---|---|"]
    for name, m in results.models.items():
        for h in m.heads:
            lines.append(f"| {name} | {h.head} | {h.induction_score:.3f} | {h.prev_token_score:.3f} | "
                         f"{h.copying_score:.2f} | {', '.join(h.labels) or '-'} |")
    lines += ["", "## Figures", ""]
    for title, fname in results.figures.items():
        lines.append(f"![{title}]({fname})")
    return "\n".join(lines) + "\n"


def _icl_sentence(pc: PhaseChange) -> str:
    if pc.icl_before is None or pc.icl_after is None:
        return ""
    return (f" The in-context-learning score on the stories (loss late in the context minus early) went from "
            f"{pc.icl_before:.2f} to {pc.icl_after:.2f} nats.")


def period_lines(models: Mapping[str, DemoModelFindings]) -> list[str]:
    """The induction test [r, r] at every period, in words and as a table (three columns per model)."""
    sweeps: dict[str, PeriodFindings] = {name: m.induction_by_period for name, m in models.items()
                                         if m.induction_by_period is not None}
    if not sweeps:
        return []
    lines = ["## Induction by period", ""]
    for name, sw in sweeps.items():
        worst = min(range(len(sw.periods)), key=lambda i: sw.best[i])
        lines.append(f"- {name}: on [r, r] with r of {sw.periods[0]} to {sw.periods[-1]} random tokens, the best "
                     f"head's induction score is at least {sw.best[worst]:.2f} (period {sw.periods[worst]}) and the "
                     f"loss on the second copy at most {max(sw.loss_second):.2f} nats (first copy: "
                     f"{min(sw.loss_first):.2f}-{max(sw.loss_first):.2f}).")
    names = list(sweeps)
    lines += ["", "| period | " + " | ".join(f"{n} best head | {n} score | {n} loss, 2nd copy" for n in names) + " |",
              "|---|" + "---|---|---|" * len(names)]
    for i, p in enumerate(sweeps[names[0]].periods):
        cells = []
        for n in names:
            sw = sweeps[n]
            cells.append(f"{sw.best_head[i]} | {sw.best[i]:.3f} | {sw.loss_second[i]:.2f}"
                         if i < len(sw.periods) and sw.periods[i] == p else "- | - | -")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines + [""]


def causal_paragraph(evidence: CausalEvidence | Mapping[str, Any] | None) -> list[str]:
    """The interventions in words; every number comes from the demo's causal evidence."""
    evidence = CausalEvidence.of(evidence)
    if evidence.empty:
        return []
    lines = ["**Causal evidence.** On random sequences r + r[:k] whose earlier copy of the last token is "
             "replaced in the corrupted run (metric: log-prob of the induction answer):", ""]
    if evidence.patching_noise:
        lines.append(f"- patching: {evidence.patching_noise};")
    recovery = evidence.patching_recovery
    if recovery:
        lines.append("- patching each head's clean output into the corrupted run recovers "
                     + ", ".join(f"{h} {v:.0%}" for h, v in recovery.items()) + " of the gap;")
    paths = evidence.path_patching
    if paths is not None and paths.fraction_of_gap:
        fractions = paths.fraction_of_gap
        strongest = max(fractions, key=lambda k: fractions[k])
        # "compose mostly through X" only when one input carries a real share (a tenth or more) of the gap
        verdict = (f", so the two compose mostly through {strongest.upper()}"
                   + (" (K-composition)" if strongest == "k" else "")) if fractions[strongest] >= 0.1 else \
            ", so no input carries a clear share of the gap: no composition is shown"
        lines.append(f"- path patching from {paths.sender} into {paths.receiver}: the corrupted path through "
                     + ", ".join(f"its {k.upper()} input removes {v:.0%}" for k, v in fractions.items())
                     + f" of the gap{verdict}"
                     + (f"; one path carries only part of the gap because {', '.join(paths.other_induction_heads)}"
                        " still read the clean one;" if paths.other_induction_heads else ";"))
    group = evidence.ablation
    if group is not None:
        (rep_before, rep_after), (first_before, first_after) = group.repeated_loss, group.first_half_loss
        lines.append(f"- mean-ablating {', '.join(group.heads)} together, the loss on the repeated half of "
                     f"random sequences {_moved(rep_before, rep_after)} nats, while the loss on the "
                     f"first half (which nothing earlier predicts) {_moved(first_before, first_after)}.")
    return lines + [""]


def interpret_markdown(results: InterpretResults | Mapping[str, Any]) -> str:
    """`circuitlab interpret`'s report.md: each experiment's summary and figures."""
    results = InterpretResults.of(results)
    lines = [f"# circuitlab interpret: {results.checkpoint}", ""]
    for name in results.experiments:
        found = Findings.of(results.entries.get(name))
        lines += [f"## {name}", ""]
        if found.summary:
            summary = found.summary
            lines += [summary if isinstance(summary, str) else "\n".join(f"- {s}" for s in summary), ""]
        for title, table in (found.tables or {}).items():
            lines += [f"**{title}**", "", *table, ""]  # Markdown tables, e.g. the induction test by period
        for fig in found.figures:
            lines.append(f"![{name}]({fig})")
        lines.append("")
    for name, why in results.skipped.items():  # left out for this architecture
        lines += [f"## {name} (skipped)", "", why, ""]
    return "\n".join(lines)


def percent(x: float) -> str:
    """0.987 -> "98.7%"; two decimals near 100% so 99.96% does not read as 100.0%."""
    return f"{100 * x:.1f}%" if x < 0.9995 or x == 1 else f"{100 * x:.2f}%"


def number(x: Any) -> str:
    """A table cell: floats to 3 decimals, None as a dash."""
    return "—" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def forge_compare_markdown(results: ForgeComparison | Mapping[str, Any], figures: list[str]) -> str:
    """`forge compare`'s report.md: what was run, the numbers, the figures, and the findings."""
    results = ForgeComparison.of(results)
    n, m = results.digits
    acc = results.accuracy
    lines = [f"# Hand-built vs trained adder ({n}+{m} digits)", ""]
    train = results.training
    if train is not None:
        how = ("reused from an earlier run with the same settings" if train.reused
               else f"trained now in {train.seconds:.1f} s")
        lines += [f"Trained model: {train.model} — {train.steps} steps of batch {train.batch_size} "
                  f"on `{train.source}` (seed {train.seed}), {how}. Final training loss "
                  f"{number(train.final_loss)}, held-out loss {number(train.final_val_loss)} (the loss covers every "
                  f"position; the digits of a and b are unpredictable, a floor of {train.loss_floor:.3f}).", ""]
    lines += ["Hand-built model: `build_carry_adder` (2 layers, 2 heads, two 4-neuron MLPs; L1H1 is unused).",
              "", "## What the comparison found", ""]
    lines += [f"- {f}" for f in results.findings]
    lines += ["", "## Accuracy", "", "| model | correct | of | accuracy |", "|---|---|---|---|"]
    for name, key in (("hand-built", "hand"), ("trained", "trained"), ("trained, held-out pairs", "trained_heldout")):
        a = acc.get(key)
        if a is not None:
            lines.append(f"| {name} | {a.correct:,} | {a.total:,} | {percent(a.accuracy)} |")
    lines += ["", "## Where each head attends", "",
              f"Positions: {' '.join(results.positions)} (xj = digit of x at 10^j, s = the sum; EOS predicts the "
              "first answer digit). Attention mass on each kind of key, averaged over the answer positions and "
              f"{results.samples} random problems; top weight = mean of each pattern's largest weight; "
              "variability = mean total-variation distance of a pattern from the head's mean pattern (0 = the same "
              "on every input).", "",
              "| model | head | " + " | ".join(results.categories)
              + " | top weight | variability | most attended key per query |",
              "|---|---|" + "---|" * (len(results.categories) + 3)]
    for model, name in (("hand", "hand-built"), ("trained", "trained")):
        for h, v in results.attention[model].items():
            keys = "; ".join(f"{t.query}→{t.keys[0][0]} {t.keys[0][1]:.2f}" for t in v.top_keys)
            lines.append(f"| {name} | {h} | " + " | ".join(f"{v.mass[c]:.2f}" for c in results.categories)
                         + f" | {v.top_weight:.2f} | {v.variability:.2f} | {keys} |")
    hand_heads, other_heads = results.agreement.heads_a, results.agreement.heads_b
    lines += ["", "## Attention agreement", "",
              "1 − total-variation distance between the two heads' patterns at the answer positions, averaged "
              "over the problems (1 = identical, 0 = disjoint).", "",
              "| hand-built \\ trained | " + " | ".join(other_heads) + " |", "|---|" + "---|" * len(other_heads)]
    for h, row in zip(hand_heads, results.agreement.agreement):
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
    for side, grid in (("input", results.ov.input), ("output", results.ov.output)):
        for i, h in enumerate(hand_heads):
            for j, t in enumerate(other_heads):
                c = grid[i][j]
                if c.rank_hand:
                    lines.append(f"| {side} | {h} | {t} | {c.rank_hand}, {c.rank_other} | "
                                 f"{number(c.top_similarity)} | {number(c.top_chance)} | {number(c.similarity)} | "
                                 f"{number(c.chance)} |")
    base = next((c.digits_vs_eos_baseline for row in results.ov.input for c in row
                 if c.digits_vs_eos_baseline is not None), None)
    if base is not None:
        lines += ["", f"Input similarity has a floor besides chance: a head that only tells digits from EOS scores "
                      f"{base:.2f} against the hand-built digit-value direction [0, 1, …, 9, 0]. The share of the "
                      "digit value removes it: of the rows of W_E·W_OV for digits 0..9, centered over the digits, "
                      "the share of their squared norm along (d − 4.5); 1 = reads only the value, about 0.11 = "
                      "reads the digits at random."]
    shares = results.ov.digit_value_share
    lines += ["", "| | " + " | ".join(f"{name} {h}" for name, part in (("hand-built", shares.hand),
                                                                      ("trained", shares.trained)) for h in part) + " |",
              "|---|" + "---|" * (len(shares.hand) + len(shares.trained)),
              "| digit-value share | " + " | ".join(number(v) for part in (shares.hand, shares.trained)
                                                    for v in part.values()) + " |"]
    lines += ["", "## Figures", ""]
    captions = {"attention_mean.png": "Mean attention from each answer position (rows: the query and the digit it "
                                      "predicts) to each position, hand-built heads above, trained heads below.",
                "attention_example.png": f"The same on one problem, {results.example.a} + "
                                         f"{results.example.b} (a carry through a column summing to 9).",
                "similarity.png": "Attention agreement and OV similarity of every hand-built head with every "
                                  "trained head (— = the hand-built head reads or writes nothing in token space).",
                "training.png": "Training loss and held-out loss of the trained model."}
    for f in figures:
        lines += [f"![{f}]({f})", "", captions.get(f, ""), ""]
    return "\n".join(lines)
