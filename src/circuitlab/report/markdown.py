"""report.md: the demo's and `circuitlab interpret`'s findings in words, from their results (the
to_dict() form that results.json holds). Every number comes from the results; nothing is read back."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def demo_narrative(results: Mapping[str, Any]) -> list[str]:
    """The demo's story in Markdown lines: what was trained, the phase change, the heads found, the
    1-layer contrast and the causal evidence (report.md's opening and report.html's summary)."""
    two, one = results["models"].get("2l"), results["models"].get("1l")
    lines: list[str] = []
    if two:
        lines += [f"A 2-layer attention-only transformer trained for {two['steps']} steps "
                  f"({two['tokens_seen']:,} tokens) on the built-in stories mixed with repeated random "
                  f"segments reached a validation loss of {two['best_val_loss']:.3f}.", ""]
        pc = two["phase_change"]
        if pc:
            lines += [f"**Phase change.** Around step {pc['step']} ({pc['tokens']:,} tokens) the induction score "
                      f"of the best head jumped to {pc['induction_after']:.2f} (from {pc['induction_before']:.2f}), "
                      f"while the loss on the repeated half of random sequences fell from "
                      f"{pc['repeat_loss_before']:.2f} to {pc['repeat_loss_after']:.2f}.", ""]
        else:
            lines += ["**No clear phase change** was seen in the induction score during training.", ""]
        if two["induction_heads"]:
            lines += [f"**Induction heads:** {', '.join(two['induction_heads'])}; "
                      f"**previous-token heads:** {', '.join(two['previous_token_heads']) or 'none'}. "
                      "Each induction label needs behaviour and weights to agree:", ""]
            lines += [f"- {e}" for e in two["induction_evidence"]] + [""]
        else:
            lines += ["**No induction head** was found in the 2-layer model.", ""]
        if two["rejected"]:
            lines += ["Heads that attend like induction heads but lack the weight evidence:", ""]
            lines += [f"- {e}" for e in two["rejected"]] + [""]
    if one:
        best = max((h["induction_score"] for h in one["heads"]), default=0.0)
        lines += [f"**Contrast.** The 1-layer model ({one['steps']} steps) has "
                  f"{'no induction head' if not one['induction_heads'] else 'induction heads ' + ', '.join(one['induction_heads'])}"
                  f" (best induction score {best:.2f}); its loss on repeated random tokens stays at "
                  f"{one['repeat_loss']:.2f} against {two['repeat_loss']:.2f} for the 2-layer model. "
                  "One layer cannot compose a previous-token head with a copying head.", ""]
    return lines + causal_paragraph(results.get("causal_evidence", {}))


def demo_markdown(results: Mapping[str, Any]) -> str:
    """The demo's report.md: the narrative, each analysis's summary, the head table, the figures."""
    lines = ["# circuitlab demo: induction heads", ""] + demo_narrative(results)
    for experiment, found in results.get("analysis", {}).items():
        lines += [f"## {experiment.replace('_', ' ').capitalize()}", ""]
        lines += [f"- {line}" for line in found.get("summary", [])] + [""]
    lines += ["## Heads", "", "| model | head | induction | previous-token | copying | labels |",
              "|---|---|---|---|---|---|"]
    for name, m in results["models"].items():
        for h in m["heads"]:
            lines.append(f"| {name} | {h['head']} | {h['induction_score']:.3f} | {h['prev_token_score']:.3f} | "
                         f"{h['copying_score']:.2f} | {', '.join(h['labels']) or '-'} |")
    lines += ["", "## Figures", ""]
    for title, fname in results["figures"].items():
        lines.append(f"![{title}]({fname})")
    return "\n".join(lines) + "\n"


def causal_paragraph(evidence: Mapping[str, Any]) -> list[str]:
    """The interventions in words; every number comes from the demo's causal evidence."""
    if not evidence:
        return []
    lines = ["**Causal evidence.** On random sequences r + r[:k] whose earlier copy of the last token is "
             "replaced in the corrupted run (metric: log-prob of the induction answer):", ""]
    recovery = evidence.get("patching_recovery", {})
    if recovery:
        lines.append("- patching each head's clean output into the corrupted run recovers "
                     + ", ".join(f"{h} {v:.0%}" for h, v in recovery.items()) + " of the gap;")
    paths = evidence.get("path_patching")
    if paths and paths["fraction_of_gap"]:
        fractions = paths["fraction_of_gap"]
        strongest = max(fractions, key=lambda k: fractions[k])
        lines.append(f"- path patching from {paths['sender']} into {paths['receiver']}: the corrupted path through "
                     + ", ".join(f"its {k.upper()} input removes {v:.0%}" for k, v in fractions.items())
                     + f" of the gap, so the two compose mostly through {strongest.upper()}"
                     + (" (K-composition)" if strongest == "k" else "")
                     + (f"; one path carries only part of the gap because {', '.join(paths['other_induction_heads'])}"
                        " still read the clean one;" if paths.get("other_induction_heads") else ";"))
    group = evidence.get("ablation")
    if group:
        (rep_before, rep_after), (first_before, first_after) = group["repeated_loss"], group["first_half_loss"]
        lines.append(f"- mean-ablating {', '.join(group['heads'])} together raises the loss on the repeated half of "
                     f"random sequences from {rep_before:.2f} to {rep_after:.2f} nats, while the loss on the "
                     f"first half (which nothing earlier predicts) goes from {first_before:.2f} to {first_after:.2f}.")
    return lines + [""]


def interpret_markdown(results: Mapping[str, Any]) -> str:
    """`circuitlab interpret`'s report.md: each experiment's summary and figures."""
    lines = [f"# circuitlab interpret: {results['checkpoint']}", ""]
    for name in results["experiments"]:
        found = results[name]
        lines += [f"## {name}", ""]
        summary = found.get("summary") if isinstance(found, Mapping) else None
        if summary:
            lines += [summary if isinstance(summary, str) else "\n".join(f"- {s}" for s in summary), ""]
        for fig in (found.get("figures", []) if isinstance(found, Mapping) else []):
            fig = fig if isinstance(fig, str) else fig.get("file", "")
            lines.append(f"![{name}]({fig})")
        lines.append("")
    return "\n".join(lines)
