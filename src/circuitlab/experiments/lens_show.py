"""`circuitlab lens show`: a prompt read through the logit lens and a saved tuned lens side by side, with each
lens's KL to the model's final distribution per layer (and, with out, the tuned-lens section as report.html).

    shown = show_lens(LensShowOptions(checkpoint="runs/demo/2l", prompt="Once upon a time, Lily"))
    print(shown.both.table())      # shown.both: analysis.lens.tuned.LensComparison on the prompt's tokens
    add_arguments(parser, LensShowOptions); LensShowOptions.from_args(args)   # `lens show`'s flags (circuitlab.spec)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from circuitlab.errors import InputError
from circuitlab.spec import Options, option

if TYPE_CHECKING:
    from circuitlab.analysis.lens.tuned import LensComparison


@dataclass(frozen=True)
class LensShowOptions(Options):
    """What `circuitlab lens show` takes, declared once (circuitlab.spec). lens None: <checkpoint>/tuned_lens
    (analysis.lens.tuned.default_lens_dir); out None: no report written. check() refuses an empty prompt before
    anything is loaded."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    lens: str | Path | None = option(None, help="the lens folder (default: <checkpoint>/tuned_lens)")
    prompt: str = option(None, required=True, help="the text to read layer by layer")
    out: str | Path | None = option(None, help="write report.html here (a folder, or a path ending in .html)")

    def check(self, error: type[Exception] = InputError) -> LensShowOptions:
        opts = super().check(error)
        if not opts.prompt.strip():
            raise error("the prompt is empty: give some text to read")
        return opts


@dataclass
class LensShow:
    folder: Path                     # the tuned lens read
    n_tokens: int                    # the prompt's tokens read (its last n_ctx)
    both: LensComparison             # logit lens and tuned lens on them, top-1 tokens read with the tokenizer
    summary: list[str] = field(default_factory=list)   # the report section's summary (with out)
    report: Path | None = None       # report.html written (with out)


def show_lens(opts: LensShowOptions) -> LensShow:
    """The prompt through both lenses (and report.html when opts.out); a one-line error when the lens folder
    holds no tuned lens or the checkpoint no tokenizer."""
    import torch

    from circuitlab.analysis.lens.tuned import TunedLens, compare_lenses, default_lens_dir
    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    opts = opts.check()
    folder = Path(opts.lens) if opts.lens else default_lens_dir(opts.checkpoint)
    if not TunedLens.exists(folder):
        raise CircuitlabError(f"{folder} holds no tuned lens; train one with `circuitlab lens train --checkpoint "
                              f"{opts.checkpoint}`" + (f" --out {opts.lens}" if opts.lens else ""))
    model, tok, _ = load_checkpoint(opts.checkpoint)
    if tok is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    summary: list[str] = []
    report: Path | None = None
    if opts.out:
        from circuitlab.methods import NoOptions, tuned_lens
        from circuitlab.report.html import write_html_report

        found = tuned_lens.run_tuned_lens(model, tok, Path("."), NoOptions(), opts.prompt, folder)
        report = write_html_report(opts.out, [tuned_lens.tuned_lens_section(found)], "circuitlab lens",
                                   f"{opts.checkpoint}: tuned lens from {folder}")
        summary = list(found.summary)
    ids = tok.encode(opts.prompt)[-model.cfg.n_ctx:]
    both = compare_lenses(model, torch.tensor(ids), TunedLens.load(folder, model), k=1, tokenizer=tok)
    return LensShow(folder, len(ids), both, summary, report)

__all__ = ["LensShow", "LensShowOptions", "show_lens"]
