"""The lens study (nostalgebraist 2020, "interpreting GPT: the logit lens"; Belrose et al. 2023, "Eliciting latent
predictions from transformers with the tuned lens"): the residual stream after each layer, read through the final
norm and the unembedding as if it were the last (the logit lens), moves towards the model's final distribution with
depth; an affine translator per layer trained to match the final distribution (the tuned lens) reads every layer
closer to it than the logit lens does.

Measured on real text (circuitlab.data.realtext: the Python Language Reference's prose by default, the `pyref`
source that ships with Python; `kjv` or --text FILE instead), held out from the tokens the tuned lens trains on:
for both lenses, at every depth, the KL from the final distribution and the share of positions whose top-1 token
is the final top-1 token (analysis.lens.tuned.held_out_agreement). The tuned lens is trained here
(analysis.lens.tuned.train_tuned_lens): its translators set by least squares (init "lstsq", no read-out through
the vocabulary) then `lens_steps` Adam steps on the KL; the identity start (Belrose et al.'s) is `--lens-init
identity`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import circuitlab.memory as memory
from circuitlab.analysis.lens.tuned import INITS
from circuitlab.checks import COUNT, POSITIVE
from circuitlab.data.realtext import PYREF_SOURCE, REAL_SOURCES
from circuitlab.errors import CircuitlabError
from circuitlab.spec import Options, option
from circuitlab.studies.base import Claim, Study, StudyResult, forward_flops

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.viz.spec import FigureSpec

# The verdicts' thresholds, written once: the logit lens "approaches" the final distribution when its mean KL over
# the last third of the depth is at most FALLS of its mean over the first third.
FALLS = 0.5
HELD_OUT_SHARE = 10   # --text FILE: its last tenth of tokens is held out


@dataclass(frozen=True)
class LensStudyOptions(Options):
    """The lens study's sizes (small by default: the study fits 5 minutes at 150 GFLOP/s on a 135M model)."""

    title = "lens study"
    text_source: str = option(PYREF_SOURCE, choices=REAL_SOURCES,
                              help="real text: pyref (the Python Language Reference's prose, ships with Python) or "
                                   "kjv (Debian's bible-kjv); each with its held-out documents")
    text: str | None = option(None, help="a UTF-8 text file instead (its last tenth held out)")
    train_sequences: int = option(64, COUNT, help="sequences the tuned lens trains on")
    held_out_sequences: int = option(8, COUNT, help="held-out sequences both lenses are measured on")
    lens_seq_len: int = option(64, COUNT, help="tokens per sequence (capped by the context)")
    lens_steps: int = option(30, COUNT, help="Adam steps on the KL after the translators' start")
    step_sequences: int = option(2, COUNT, help="sequences per Adam step")
    lens_lr: float = option(1e-3, POSITIVE, help="Adam's peak learning rate")
    lens_init: str = option("lstsq", choices=INITS,
                            help="the translators' start: lstsq (least squares) or identity (Belrose et al.)")


def _file_split(path: str, tokenizer: Any) -> dict[str, torch.Tensor]:
    """A text file's tokens: the first nine tenths "train", the last tenth "val"."""
    from circuitlab.textfile import read_text

    ids = torch.tensor(tokenizer.encode(read_text(path, "--text file")), dtype=torch.long)
    cut = len(ids) - len(ids) // HELD_OUT_SHARE
    return {"train": ids[:cut], "val": ids[cut:]}


def _batches(flat: torch.Tensor, sequences: int, per_batch: int, seq_len: int, what: str) -> list[torch.Tensor]:
    need = sequences * seq_len
    if len(flat) < need:
        raise CircuitlabError(f"the {what} text holds {len(flat)} tokens; {sequences} sequences of {seq_len} need "
                              f"{need}")
    per_batch = min(per_batch, sequences)
    n = sequences // per_batch
    return list(flat[: n * per_batch * seq_len].view(n, per_batch, seq_len))


def lens_data(tokenizer: Any, opts: LensStudyOptions, seq_len: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(training batches [step_sequences, seq_len], held-out batches [4, seq_len]) of the chosen text."""
    from circuitlab.data.packing import tokenize_documents
    from circuitlab.data.realtext import real_documents

    if opts.text:
        split = _file_split(opts.text, tokenizer)
    else:
        split = {}
        for part in ("train", "val"):
            tokens, _ = tokenize_documents(real_documents(opts.text_source, part), tokenizer)
            split[part] = torch.from_numpy(tokens.astype("int64"))
    where = opts.text or opts.text_source
    return (_batches(split["train"], opts.train_sequences, opts.step_sequences, seq_len, f"{where} training"),
            _batches(split["val"], opts.held_out_sequences, 4, seq_len, f"{where} held-out"))


def run_lens(model: "Transformer", tokenizer: Any, options: LensStudyOptions, progress: bool = True) -> StudyResult:
    """The lens study on `model` (see the module docstring)."""
    from circuitlab.analysis.lens.tuned import held_out_agreement, train_tuned_lens
    from circuitlab.model.transformer import lm_loss

    opts = options.check()
    if tokenizer is None:
        raise CircuitlabError("the lens study reads real text: the checkpoint needs its tokenizer")
    if model.cfg.n_layers == 0:
        raise CircuitlabError("a 0-layer model has no layers to read")
    t0 = time.time()
    seq = min(opts.lens_seq_len, model.cfg.n_ctx)
    train, held_out = lens_data(tokenizer, opts, seq)
    lens = train_tuned_lens(model, train, steps=opts.lens_steps, lr=opts.lens_lr, progress=progress,
                            init=opts.lens_init)
    trained = time.time() - t0
    found = held_out_agreement(model, held_out, {"logit": None, "tuned": lens})
    with torch.no_grad():
        loss = sum(float(lm_loss(model(b)[:, :-1].float(), b[:, 1:])) for b in held_out) / len(held_out)
    labels = lens.labels[:-1]   # the translated points; the last one is the model's output
    numbers: dict[str, Any] = {"labels": labels, "held_out_loss": round(loss, 4),
                               "train": {k: (round(v, 6) if isinstance(v, float) else v)
                                         for k, v in lens.train_info.items()},
                               "train_seconds": round(trained, 1)}
    for name, got in found.items():
        numbers[name] = {"kl": [round(float(x), 5) for x in got["kl"][:-1]],
                         "top1": [round(float(x), 4) for x in got["top1"][:-1]]}
    setup = {"text": opts.text or opts.text_source, "train_tokens": sum(b.numel() for b in train),
             "held_out_tokens": sum(b.numel() for b in held_out), "seq_len": seq, "steps": opts.lens_steps,
             "step_sequences": opts.step_sequences, "lr": opts.lens_lr, "init": opts.lens_init}
    return StudyResult("lens", setup, numbers, lens_claims(numbers), seconds={"wall": round(time.time() - t0, 1)})


def lens_claims(n: dict[str, Any]) -> list[Claim]:
    """The papers' claims against the numbers (as run_lens writes them); every verdict states its numbers."""
    logit, tuned, labels = n["logit"], n["tuned"], n["labels"]
    third = max(1, len(labels) // 3)
    early = sum(logit["kl"][:third]) / third
    late = sum(logit["kl"][-third:]) / third
    claims = [Claim(
        "The logit lens: read through the unembedding, the residual stream approaches the final distribution with "
        "depth.",
        f"the logit lens's KL to the final distribution is {early:.2f} nats on average over the first {third} points "
        f"({labels[0]}-{labels[third - 1]}), {late:.2f} over the last {third} ({labels[-third]}-{labels[-1]}) "
        f"({late / early:.0%} of it; approaching means at most {FALLS:.0%})." if early > 0 else
        "the logit lens's KL is 0 over the first points: nothing to approach.", late <= FALLS * early if early > 0
        else None)]
    below = [lab for lab, a, b in zip(labels, logit["kl"], tuned["kl"]) if b < a]
    worse = [lab for lab in labels if lab not in below]
    claims.append(Claim(
        "The tuned lens reads every layer closer to the final distribution than the logit lens.",
        f"the tuned lens's held-out KL is below the logit lens's at {len(below)} of {len(labels)} points"
        + (f" (not at {', '.join(worse)})" if worse else "")
        + f"; on average {sum(tuned['kl']) / len(labels):.3f} against {sum(logit['kl']) / len(labels):.3f} nats.",
        not worse))
    a, b = sum(logit["top1"]) / len(labels), sum(tuned["top1"]) / len(labels)
    claims.append(Claim(
        "The tuned lens's top-1 token agrees with the model's final top-1 more often than the logit lens's.",
        f"top-1 agreement averaged over the {len(labels)} points: tuned lens {b:.1%}, logit lens {a:.1%}.", b > a))
    return claims


def lens_markdown(result: StudyResult) -> list[str]:
    """report.md's body after the claims: the data, the training, KL and top-1 agreement per depth."""
    n, s = result.numbers, result.setup
    lines = ["", f"Text: {s['text']}; the tuned lens trained on {s['train_tokens']:,} tokens ({s['init']} start, "
                 f"{s['steps']} Adam steps of {s['step_sequences']} x {s['seq_len']} tokens, lr {s['lr']:g}; loss "
                 f"{n['train'].get('first_loss', float('nan')):.3f} -> {n['train'].get('final_loss', float('nan')):.3f}"
                 f", {n['train_seconds']:.0f} s here), both lenses measured on {s['held_out_tokens']:,} held-out "
                 f"tokens (the model's own loss there: {n['held_out_loss']:.3f} nats/token).", "",
             "| after | logit lens KL | tuned lens KL | logit lens top-1 | tuned lens top-1 |", "|---|---|---|---|---|"]
    for i, lab in enumerate(n["labels"]):
        lines.append(f"| {lab} | {n['logit']['kl'][i]:.3f} | {n['tuned']['kl'][i]:.3f} | "
                     f"{n['logit']['top1'][i]:.1%} | {n['tuned']['top1'][i]:.1%} |")
    return lines


def lens_figures(result: StudyResult) -> dict[str, "FigureSpec"]:
    """KL to the final distribution and top-1 agreement by depth, both lenses."""
    from circuitlab.viz.parts import Panel, Series
    from circuitlab.viz.spec import FigureSpec

    n = result.numbers
    x = n["labels"]
    panels = [Panel("KL(final ‖ lens) on held-out text", "residual after", "KL (nats per token)", series=[
                  Series(x, n["logit"]["kl"], "logit lens", kind="line+markers"),
                  Series(x, n["tuned"]["kl"], "tuned lens", kind="line+markers")]),
              Panel("Top-1 agreement with the final distribution", "residual after", "share of positions", series=[
                  Series(x, n["logit"]["top1"], "logit lens", kind="line+markers"),
                  Series(x, n["tuned"]["top1"], "tuned lens", kind="line+markers")], y_range=(0.0, 1.0))]
    return {"lenses": FigureSpec(panels, "Logit lens and tuned lens by depth", cols=2)}


# the share of the matmul speed the study reaches: each step's log-softmax and KL over the whole vocabulary at every
# point (SmolLM2: 30 x 128 rows x 49,152 floats, 2.5 GiB) are memory-bound beside the read-out's matmuls (measured on
# SmolLM2, one thread: 208 s of training for 13.3 TFLOP at 171 GFLOP/s)
READOUT_EFFICIENCY = 0.4


def estimate_lens(model: "Transformer", options: LensStudyOptions) -> memory.Estimate:
    """The least-squares pass (one forward per training batch, the Gram matrices), the Adam steps (every
    translator's read-out through the vocabulary, forward and backward, and the final read-out), the held-out
    pass (a forward, both lenses' read-outs at every point)."""
    from circuitlab.analysis.lens.tuned import lens_estimate

    opts = options.check()
    cfg = model.cfg
    seq = min(opts.lens_seq_len, cfg.n_ctx)
    rows = opts.step_sequences * seq
    points = cfg.n_layers   # translators: embed, L0 .. L(n-2)
    readout = 2 * cfg.d_model * cfg.d_vocab   # flops a row and a point
    train_tokens, held = opts.train_sequences * seq, opts.held_out_sequences * seq
    flops = forward_flops(model, train_tokens)
    if opts.lens_init == "lstsq":
        flops += points * train_tokens * 2 * (cfg.d_model + 1) ** 2
    flops += opts.lens_steps * rows * readout * (2 * points + 1)
    flops += forward_flops(model, held) + held * readout * 2 * points
    step = lens_estimate(model, opts.step_sequences, seq, opts.lens_steps, 1)
    parts = {**step.parts, "cached residual streams": train_tokens * (cfg.n_layers + 1) * cfg.d_model * 4}
    return memory.Estimate(f"lens study (tuned lens: {opts.lens_init} start, {opts.lens_steps} steps of {rows} "
                           f"tokens; {held} held-out tokens)", parts, held=memory.tensor_bytes(model), flops=flops,
                           efficiency=READOUT_EFFICIENCY)


STUDY = Study("lens", "The logit lens and the tuned lens", "nostalgebraist 2020, interpreting GPT: the logit lens; "
              "Belrose et al. 2023, Eliciting latent predictions from transformers with the tuned lens",
              LensStudyOptions, run_lens, lens_markdown, lens_figures, estimate_lens)
