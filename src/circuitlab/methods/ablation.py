"""Ablation as a method (`interpret --experiments ablation`; the analysis: analysis/ablation.py): every head (and
MLP) mean-ablated on repeated random sequences, the loss on the repeated half measured; then a group of heads
ablated together; its typed result and report section (the view: viz/patching.py's ablation_figure)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.ablation import ablate_and_measure, run_ablated
from circuitlab.analysis.patching import next_token_loss
import circuitlab.memory as memory
from circuitlab.checks import NONNEG_INT
from circuitlab.methods.base import Method, MethodResult, figures_estimate
from circuitlab.spec import Options, option
from circuitlab.methods.pairs import BATCH, SEED, check_pairs, random_ids
from circuitlab.model import model_device
from circuitlab.names import head_name
from circuitlab.viz.fragments import Section, bullet_list, paragraph

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass(frozen=True)
class AblationOptions(Options):
    title = "ablation (--experiments ablation)"
    ablation_layers: tuple[int, ...] | None = option(None, NONNEG_INT, nargs="+", metavar="L",
                                                     help="the layers whose heads (and MLPs) are ablated one at a "
                                                          "time (default: every layer)")
    mlp_ablation: bool = option(True, flag="--no-mlp-ablation",
                                help="leave the MLPs out: ablate the heads only (default: heads and MLPs)")


def check_ablation(model: "Transformer", tokenizer: Any, options: AblationOptions, clean: str | None = None,
                   corrupt: str | None = None, **_: Any) -> None:
    """The pairs' check, and --ablation-layers within the model."""
    check_pairs(model, tokenizer, options, clean, corrupt)
    check_model_layers(model, options.ablation_layers, "--ablation-layers")


def check_model_layers(model: "Transformer", layers: tuple[int, ...] | None, flag: str) -> None:
    """Refuse layers the model does not have, in one line naming the flag."""
    from circuitlab.errors import InputError

    bad = [l for l in layers or () if l >= model.cfg.n_layers]
    if bad:
        raise InputError(f"{flag} {' '.join(map(str, bad))}: the model has {model.cfg.n_layers} layers "
                         f"(0..{model.cfg.n_layers - 1})")


@dataclass
class AblationFindings(MethodResult):
    """tokens: what was ablated on; heads / mlps: AblationFindings.to_dict() of each head / MLP layer; group: the heads
    ablated together and the losses before and after; clean_prompt_loss: the same on --clean."""

    name = "ablation"
    tokens: str
    heads: dict[str, Any]
    mlps: dict[str, Any] | None = None
    group: dict[str, Any] | None = None
    clean_prompt_loss: list[float] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AblationFindings":
        return cls(list(d.get("summary", [])), list(d.get("figures", [])), d.get("tokens", ""), d["heads"],
                   d.get("mlps"), d.get("group"), d.get("clean_prompt_loss"))


def run_ablation(model: "Transformer", tokenizer: Any, out_dir: Path, options: AblationOptions, clean: str | None = None,
                 corrupt: str | None = None, group: list[str] | None = None) -> AblationFindings:
    """Mean-ablate every head (and MLP) on repeated random sequences and measure the loss on the repeated
    half; then ablate a group of heads together (default: the two after layer 0 that matter most), and
    compare the loss on the first half."""
    from circuitlab.viz.patching import ablation_figure

    out_dir = Path(out_dir)
    gen = torch.Generator().manual_seed(SEED)
    half = min(24, model.cfg.n_ctx // 2)
    eos = getattr(tokenizer, "eos_id", None)
    device = model_device(model)
    tokens = random_ids((BATCH, half), model.cfg.d_vocab, eos, gen).repeat(1, 2).to(device)
    reference = random_ids((4 * BATCH, half), model.cfg.d_vocab, eos, gen).repeat(1, 2).to(device)
    second = torch.zeros_like(tokens, dtype=torch.bool)
    second[:, half:] = True
    repeated_loss = next_token_loss(tokens, second)
    first_half = torch.zeros_like(second)
    first_half[:, : half - 1] = True  # predictions of tokens in the first half, which nothing earlier repeats
    first_loss = next_token_loss(tokens, first_half)

    layers = list(options.ablation_layers) if options.ablation_layers else None
    heads = ablate_and_measure(model, tokens, repeated_loss, "head", "mean", reference, layers=layers)
    figures = [ablation_figure(heads, "mean ablation of each head: change in loss on the repeated half"
                               ).save_png(out_dir / "ablation_heads.png").name]
    found = AblationFindings([], figures, f"{BATCH} random sequences of {half} tokens, each repeated once",
                           heads.to_dict())
    summary = found.summary
    summary.append(f"loss on the repeated half {heads.baseline:.3f} nats; largest changes when one head is "
                   "mean-ablated (+ raises it): " + ", ".join(f"{c} {v:+.3f}" for c, v in heads.top(4)))
    if model.cfg.has_mlp and options.mlp_ablation:
        mlps = ablate_and_measure(model, tokens, repeated_loss, "mlp", "mean", reference, layers=layers)
        figures.append(ablation_figure(mlps).save_png(out_dir / "ablation_mlps.png").name)
        found.mlps = mlps.to_dict()
        summary.append("MLP layers: " + ", ".join(f"{c} {v:+.3f}" for c, v in mlps.top(3)))

    chosen = "the given heads"
    if group is None:
        # The heads whose ablation hurts most (beyond layer 0, where induction heads cannot be), together.
        change, swept = heads.change(), list(heads.layers)
        keep = [i for i, l in enumerate(swept) if l > 0] if len(swept) > 1 and any(l > 0 for l in swept) else \
            list(range(len(swept)))
        later = change[keep]
        order = later.flatten().argsort(descending=True)[:2].tolist()
        group = [head_name(swept[keep[i // later.shape[1]]], i % later.shape[1]) for i in order
                 if later.flatten()[i] > 0]
        chosen = "the heads after layer 0 that hurt most, where induction heads can be"
    if group:
        with torch.no_grad():
            logits = model(tokens)
            ablated = run_ablated(model, tokens, group, "mean", reference)
        before = (float(repeated_loss(logits)), float(first_loss(logits)))
        after = (float(repeated_loss(ablated)), float(first_loss(ablated)))
        found.group = {"heads": group, "repeated_loss": [round(before[0], 6), round(after[0], 6)],
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
            found.clean_prompt_loss = [round(b, 6), round(a, 6)]
            summary.append(f"on the clean prompt, ablating {', '.join(group)}: loss {b:.3f} -> {a:.3f}")
    return found


def ablation_section(found: AblationFindings) -> Section:
    from circuitlab.viz.patching import ablation_figure

    parts: list[Any] = [paragraph(f"Tokens: {found.tokens}") if found.tokens else "", bullet_list(found.summary)]
    parts += [ablation_figure(res) for res in (found.heads, found.mlps) if res]
    return Section("ablation", "Ablation", parts)


def estimate_ablation(model: Transformer, tokenizer: Any, options: AblationOptions, **_: Any) -> memory.Estimate:
    """The reference sequences' mean activations, then one ablated run per head (and MLP) of the swept layers, each
    run from its layer on (analysis.ablation reuses the clean run below it), and the group's two runs."""
    from circuitlab.methods.pairs import BATCH
    from circuitlab.model.transformer import cache_estimate
    from circuitlab.perf import block_weights

    cfg = model.cfg
    half = min(24, cfg.n_ctx // 2)
    n = 2 * half
    est = cache_estimate(model, 5 * BATCH, n, lambda name: name.endswith(("hook_z", "hook_mlp_out")))
    layers = list(options.ablation_layers) if options.ablation_layers else list(range(cfg.n_layers))
    per = cfg.n_heads + (1 if cfg.has_mlp and options.mlp_ablation else 0)
    per_token_block = 2 * block_weights(cfg) + 4 * n * cfg.n_heads * cfg.head_dim
    runs = sum(per * ((cfg.n_layers - l) * per_token_block + 2 * cfg.d_model * cfg.d_vocab) for l in layers)
    full = cfg.n_layers * per_token_block + 2 * cfg.d_model * cfg.d_vocab
    est.flops = float(BATCH * n * (runs + 7 * full))   # the ablated runs; the reference (x4), base, group's two
    est.what = (f"ablation ({'every head and MLP' if per > cfg.n_heads else 'every head'} of "
                f"{len(layers)} layers mean-ablated on {BATCH} x {n} tokens)")
    return memory.Estimate.one_after_another(est.what, [est, figures_estimate(model, 1 + (per > cfg.n_heads))])


METHOD = Method("ablation", AblationOptions, AblationFindings, run_ablation, ablation_section,
                inputs=("clean", "corrupt"), check=check_ablation, estimate=estimate_ablation)
