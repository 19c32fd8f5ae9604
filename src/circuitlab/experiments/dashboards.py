"""`circuitlab sae dashboards`: a dictionary's feature dashboards on held-out text, saved and drawn.

    found = build_dashboards(DashboardOptions(dictionary="runs/sae/dict", checkpoint="runs/features/model"))
    found.report        # <out>/report.html;  found.folder: dashboards.safetensors + dashboards.json
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitlab.checks import COUNT, Number
from circuitlab.errors import CircuitlabError
from circuitlab.training.outputs import check_output_folder, output_folder


# All the text is tokenised and held at once; dashboards settle long before this.
TOKENS = Number(int, low=1, high=4_194_304, why="the text is tokenised and held in memory at once")


@dataclass
class DashboardOptions:
    dictionary: Path | str
    checkpoint: Path | str
    out: Path | str | None = None      # default: <dictionary>/dashboards
    data: str = "stories"              # any text source of circuitlab.data.sources
    n_tokens: int = 32_768
    seq_len: int = 64
    features: list[int] | None = None  # cards in the report (default: the 50 most frequent)
    k: int = 10
    device: str = "cpu"
    progress: bool = True
    overwrite: bool = False            # replace earlier dashboards in out (default: keep them, renamed)


@dataclass
class DashboardResult:
    folder: Path
    report: Path
    summary: dict[str, Any]
    kept: Path | None = None  # where earlier dashboards in the folder were set aside

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "report": str(self.report), **self.summary}


def build_dashboards(opts: DashboardOptions) -> DashboardResult:
    from circuitlab.dictionaries import SparseDictionary
    from circuitlab.dictionaries.features import feature_dashboards, text_batches
    from circuitlab.report.features import write_dashboards_report
    from circuitlab.training import load_checkpoint

    model, tokenizer, _ = load_checkpoint(opts.checkpoint, device=opts.device)
    if tokenizer is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it, so text cannot be encoded")
    sae = SparseDictionary.load(opts.dictionary, device=opts.device, model=model)  # checked, hooks bound
    TOKENS.check(opts.n_tokens, "tokens")
    COUNT.check(opts.seq_len, "seq_len")
    folder = Path(opts.out) if opts.out is not None else Path(opts.dictionary) / "dashboards"
    check_output_folder(folder, "dashboards", overwrite=opts.overwrite, is_previous=_is_dashboards)
    bad = [f for f in opts.features or [] if not 0 <= f < sae.cfg.d_sae]
    if bad:
        raise CircuitlabError(f"--features {bad} are outside the dictionary's {sae.cfg.d_sae} features")
    batches = text_batches(tokenizer, opts.data, opts.n_tokens, min(opts.seq_len, model.cfg.n_ctx))
    dash = feature_dashboards(model.eval(), sae, batches, k=opts.k, tokenizer=tokenizer, progress=opts.progress)
    kept = output_folder(folder, "dashboards", overwrite=opts.overwrite, is_previous=_is_dashboards)
    dash.save(folder)
    report = write_dashboards_report(folder, dash, opts.features)
    return DashboardResult(folder, report, dash.summary(), kept)


def _is_dashboards(folder: Path) -> bool:
    """Dashboards written before output folders were marked."""
    from circuitlab.dictionaries.features import META_FILE

    return (folder / META_FILE).is_file()
