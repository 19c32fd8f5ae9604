"""The report's sections of what a run has, one builder each: a RunData (model card, training curves, heads,
induction by period, attention viewer, QK/OV circuits) and the summary. The methods' sections (logit lens,
direct logit attribution, patching, ...) are their own (circuitlab.methods). Figures are views from
circuitlab.viz (FigureSpecs)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.names import head_name, parse_head
from circuitlab.report.html import (Section, bullet_list, details, esc, heading, json_block, key_value_table,
                                    markdown_lite, paragraph, table_html)
from circuitlab.report.results import PeriodFindings
from circuitlab.report.runs import SCORE_COLUMNS, RunData, labels_by_head

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.methods.circuits import CircuitsFindings


def _param_counts(model: Transformer) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    embed = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("embed", "unembed", "pos_embed")))
    return {"parameters": total, "non-embedding parameters": total - embed}


def _flat(d: Mapping[str, Any] | None) -> str:
    if not d:
        return ""
    return ", ".join(f"{k} {v}" for k, v in d.items() if v not in (None, "", [], {}))


def model_card_section(runs: Sequence[RunData]) -> Section:
    parts = []
    for run in runs:
        cfg = dict(run.model_config or {})
        if run.model is not None:  # the resolved sizes (the config's d_head / d_mlp are often None)
            mc = run.model.cfg
            cfg = {**cfg, "d_head": mc.head_dim, "d_mlp": mc.mlp_dim if mc.has_mlp else None}
        rc = run.run_config or {}
        train = rc.get("train") or {}
        facts: dict[str, Any] = {"run": rc.get("name") or run.name, "description": rc.get("description")}
        if cfg:
            arch = (f"{cfg.get('n_layers')} layers, d_model {cfg.get('d_model')}, {cfg.get('n_heads')} heads"
                    + (f" of {cfg['d_head']}" if cfg.get("d_head") else "")
                    + (", attention only" if cfg.get("attn_only") else
                       (f", MLP {cfg.get('d_mlp')} ({cfg.get('mlp')})" if cfg.get("d_mlp") else ""))
                    + f", context {cfg.get('n_ctx')}, vocabulary {cfg.get('d_vocab')}"
                    + f", norm {cfg.get('norm')}, positions {cfg.get('positional')}")
            facts["model"] = f"{cfg.get('name') or 'custom'}: {arch}"
        if run.model is not None:
            facts.update(_param_counts(run.model))
        facts["data"] = _flat(rc.get("data"))
        if train:
            facts["training"] = _flat({k: train.get(k) for k in ("steps", "batch_size", "seq_len", "lr", "warmup_steps",
                                                                  "weight_decay", "seed")})
        facts["steps done"] = run.steps
        facts["tokens seen"] = run.tokens_seen
        facts.update(run.facts)
        facts["checkpoint"] = run.checkpoint
        if len(runs) > 1:
            parts.append(heading(run.name))
        parts.append(key_value_table(facts))
        if cfg or rc:
            parts.append(details("full configuration", json_block({"model": run.model_config, "run": rc or None})))
    return Section("model-card", "Model card", parts)


def training_section(runs: Sequence[RunData]) -> Section | None:
    from circuitlab.training.phase import PhaseChange, phase_change
    from circuitlab.viz.training import training_curves_figure

    with_metrics = [r for r in runs if r.metrics]
    if not with_metrics:
        return None
    curves = {r.name: r.metrics for r in with_metrics}
    phases, lines = {}, []
    for r in with_metrics:
        found = r.phase_change if r.phase_change is not None else phase_change(r.metrics)
        if found:
            phases[r.name] = found  # the figure draws the dict as results.json holds it
            pc = PhaseChange.from_dict(dict(found))
            text = (f"{r.name}: phase change around step {pc.step} ({pc.tokens:,} tokens): the best induction "
                    f"score went from {pc.induction_before:.2f} to {pc.induction_after:.2f}")
            if pc.repeat_loss_before is not None and pc.repeat_loss_after is not None:
                text += (f", the loss on repeated tokens from {pc.repeat_loss_before:.2f} to "
                         f"{pc.repeat_loss_after:.2f}")
            lines.append(text + ".")
        elif any("induction" in m for m in r.metrics):
            lines.append(f"{r.name}: no clear phase change in the induction score.")
    fig = training_curves_figure(curves, phases)
    return Section("training", "Training curves", [bullet_list(lines), fig],
                   "Loss and the best head's induction and previous-token scores against tokens seen; the dashed "
                   "line marks the phase change, the band the induction score's rise (from the last point below 20% of "
                   "it to the first at 80%).")


def heads_section(runs: Sequence[RunData]) -> Section | None:
    from circuitlab.viz.heads import head_scores_figure

    with_heads = [r for r in runs if r.heads]
    notes = [paragraph(r.unlabelled) for r in runs if r.unlabelled and not r.heads]
    if not with_heads:
        return Section("heads", "Heads", notes) if notes else None
    parts: list[Any] = list(notes)
    for run in with_heads:
        present = {k for row in run.heads or [] for k, v in row["scores"].items() if v is not None}
        columns = [c for c in SCORE_COLUMNS if c in present]
        rows = []
        for row in run.heads or []:
            chips = "".join(f'<span class="label">{esc(lab)}</span>' for lab in row["labels"]) or "-"
            ev = "".join(f"<div>{esc(e)}</div>" for e in row["evidence"])
            rows.append({"head": row["head"], "labels": chips,
                         **{c: (float(row["scores"][c]) if row["scores"].get(c) is not None else float("nan"))
                            for c in columns},
                         "evidence": f'<div class="evidence">{ev}</div>'})
        if len(with_heads) > 1:
            parts.append(heading(run.name))
        parts.append(table_html(rows, ["head", "labels", *columns, "evidence"], raw=("labels", "evidence")))
        if run.head_scores:
            parts.append(head_scores_figure(run.head_scores, title=f"{run.name} head scores"))
    return Section("heads", "Heads", parts,
                   "Labels need behaviour and weights to agree (induction: an induction pattern, a copying OV circuit "
                   "and K-composition with an earlier previous-token head); scores are the share of attention on the "
                   "positions each detector predicts, copying is the OV circuit's eigenvalue score.")


def induction_period_section(runs: Sequence[RunData]) -> Section | None:
    """The induction test [r, r] by period: a figure (score; loss on each copy) and a table per model."""
    from circuitlab.viz.training import induction_by_period_figure

    sweeps = {r.name: r.period_sweep for r in runs if r.period_sweep}
    if not sweeps:
        return None
    parts: list[Any] = [induction_by_period_figure(sweeps)]
    for name, found in sweeps.items():
        sweep = PeriodFindings.from_dict(dict(found))
        rows = [{"period": p, "best head": h, "induction score": float(s), "loss on first copy": float(a),
                 "loss on second copy": float(b)}
                for p, h, s, a, b in zip(sweep.periods, sweep.best_head, sweep.best, sweep.loss_first,
                                         sweep.loss_second)]
        parts.append(details(f"{name}: table by period", table_html(rows)))
    return Section("induction-by-period", "Induction by period", parts,
                   "A random sequence r followed by itself, [r, r], at every period from 4 to half the context "
                   "(r drawn uniformly from the ordinary tokens): the best head's share of attention from the second "
                   "copy to the token after the first occurrence, and the loss on each copy. An induction head "
                   "scores high at every period; a head that copies from a fixed distance back, at one.")


def attention_tokens(model: Transformer, seed: int = 7, segment: int = 12, repeats: int = 3) -> torch.Tensor:
    """A random segment repeated: [segment * repeats] ids (cropped to the context)."""
    gen = torch.Generator().manual_seed(seed)
    seg = torch.randint(0, model.cfg.d_vocab, (segment,), generator=gen)
    return seg.repeat(repeats)[: model.cfg.n_ctx]


def attention_section(run: RunData, tokens: torch.Tensor | None = None) -> Section | None:
    from circuitlab.analysis.heads import attention_view
    from circuitlab.viz.heads import attention_patterns_figure

    if run.model is None or run.model.cfg.n_layers == 0:
        return None
    tokens = attention_tokens(run.model) if tokens is None else tokens
    view = attention_view(run.model, tokens, run.tokenizer, labels_by_head(run))
    return Section("attention", "Attention patterns", [attention_patterns_figure(view, f"{run.name} attention")],
                   f"Every head of {run.name} on a random segment of 12 tokens repeated; choose the head in the menu, "
                   "hover a cell for the query token, the key token and the weight. Induction heads attend to the "
                   "token after the previous copy of the current one (an off-diagonal stripe).")


def _pick_heads(run: RunData, found: "CircuitsFindings | None") -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The induction head and its previous-token head as the circuits experiment picks them (from its
    results, else from the labels computed here), else the best-scoring head after layer 0 and the
    best previous-token head before it."""
    from circuitlab.analysis.heads.induction_circuit import induction_and_previous_head

    cfg = run.model.cfg
    ind = found.induction if found is not None else None
    if ind:
        return parse_head(ind.head), parse_head(ind.prev_token_head)
    if run.classes is not None and cfg.n_layers > 1:
        return induction_and_previous_head(run.classes)
    rows = {r["head"]: r["scores"] for r in run.heads or []}

    def score(l: int, h: int, key: str) -> float:
        v = rows.get(head_name(l, h), {}).get(key)
        return -1.0 if v is None else float(v)

    later = range(1 if cfg.n_layers > 1 else 0, cfg.n_layers)
    head = max(((l, h) for l in later for h in range(cfg.n_heads)), key=lambda lh: score(lh[0], lh[1], "induction"))
    if head[0] == 0:
        return head, None
    prev = max(((l, h) for l in range(head[0]) for h in range(cfg.n_heads)),
               key=lambda lh: score(lh[0], lh[1], "previous-token"))
    return head, prev



@torch.no_grad()
def circuits_section(run: RunData, found: "CircuitsFindings | None" = None, prompt: str | None = None
                     ) -> Section | None:
    """QK (through the previous-token head when there is one) and OV circuits of the induction head on the
    prompt's tokens, copying scores of every head, K-composition between heads. Norms folded first."""
    from circuitlab.analysis.qk_ov import (composition_scores, copying_scores, k_composition_qk_circuit,
                                              ov_circuit, qk_circuit)
    from circuitlab.analysis.folding import weights_model
    from circuitlab.data.stories import DEFAULT_PROMPT
    from circuitlab.viz import token_label
    from circuitlab.viz.qk_ov import composition_figure, copying_scores_figure
    from circuitlab.viz.figure import heatmap_figure

    model = run.model
    if model is None or model.cfg.n_layers == 0:
        return None
    from circuitlab.model.assumptions import unmet

    if unmet(model, "additive_heads"):  # post-norms: a head's OV circuit is not defined (the circuits experiment is skipped)
        return None
    if found is None and run.unlabelled and not run.heads:  # no head to show: too many to label here (compute_heads)
        return Section("circuits", "QK and OV circuits", [paragraph(
            f"No induction head picked: {run.name}'s heads are not labelled here. `circuitlab interpret --experiments "
            "circuits` finds the induction head and its previous-token head and draws their circuits.")])
    wm = weights_model(model)
    if run.tokenizer is not None:
        ids = [i for i in run.tokenizer.encode(prompt or DEFAULT_PROMPT) if 0 <= i < model.cfg.d_vocab]
        ids = list(dict.fromkeys(ids))[:24]
    else:
        ids = []
    if not ids:
        ids = list(range(min(24, model.cfg.d_vocab)))
    strs = [token_label(run.tokenizer.decode([i]), 12) if run.tokenizer is not None else str(i) for i in ids]
    head, prev = _pick_heads(run, found)
    name = head_name(*head)
    parts: list[Any] = [bullet_list(found.summary if found is not None else [])]
    if prev is not None:
        qk = k_composition_qk_circuit(wm, head, prev).submatrix(ids, ids)
        parts.append(heatmap_figure(qk, strs, strs, f"{name} QK circuit via {head_name(*prev)}: query token vs "
                                    "the token before the key", x_title="token before the key",
                                    y_title="query token", value_name="score"))
    else:
        qk = qk_circuit(wm, head[0])[head[1]].submatrix(ids, ids)
        parts.append(heatmap_figure(qk, strs, strs, f"{name} QK circuit", x_title="key token", y_title="query token",
                                    value_name="score"))
    ov = ov_circuit(wm, head[0])[head[1]].submatrix(ids, ids)
    parts.append(heatmap_figure(ov, strs, strs, f"{name} full OV circuit: attending to a token, the logits it "
                                "raises", x_title="output logit", y_title="attended token", value_name="logit"))
    # The results' scores as written (float64 lists), else the labels' or computed ones (float32 tensors)
    if found is not None and found.copying is not None:
        copying: Any = found.copying.scores.tolist()
    else:
        copying = (run.classes.copying if run.classes is not None else copying_scores(wm)).scores
    L, H = model.cfg.n_layers, model.cfg.n_heads
    parts.append(copying_scores_figure(copying))
    if L > 1 and L * H <= 64:
        if found is not None and found.composition is not None:
            k: Any = found.composition.k.tolist()
            baseline = found.composition.baseline_mean
        else:
            c = run.classes.composition if run.classes is not None else composition_scores(wm)
            k, baseline = c.k, c.baseline_mean
        parts.append(composition_figure({"k": k}, baseline, modes=("k",)))
    return Section("circuits", "QK and OV circuits", parts,
                   f"Weight-based circuits of {run.name}'s {'induction head' if prev is not None else 'head'} {name}, "
                   "restricted to the tokens of a short prompt.")


def summary_section(lines: Sequence[str] | str, title: str = "Summary") -> Section | None:
    """Lines as a list, or a string of simple Markdown (paragraphs, "- " lists, **bold**)."""
    if isinstance(lines, str):
        return Section("summary", title, [markdown_lite(lines)]) if lines.strip() else None
    lines = [s for s in lines if s]
    return Section("summary", title, [bullet_list(lines)]) if lines else None
