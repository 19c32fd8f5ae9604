"""`circuitlab sae dashboards`: a dictionary's feature dashboards on held-out text, saved and drawn.

    found = build_dashboards(DashboardOptions(dictionary="runs/transcoder-demo/dictionaries/transcoders-0",
                                              checkpoint="runs/features/model"))
    found.report        # <out>/report.html;  found.folder: dashboards.safetensors + dashboards.json
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitlab.atomic import json_text
from circuitlab.checks import COUNT, Number
from circuitlab.errors import CircuitlabError
from circuitlab.graphs.options import CARD_TOKENS
from circuitlab.training.outputs import check_output_folder, output_folder


# All the text is tokenised and held at once; dashboards settle long before this. The same cap as a graph
# report's feature cards (graphs.options.CARD_TOKENS: `circuitlab graph --dashboard-tokens`, 0 = no cards).
TOKENS = Number(int, low=1, high=CARD_TOKENS.high, why=CARD_TOKENS.why)


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
    layer: int | None = None           # a cross-layer transcoder's layer
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

    folder = Path(opts.out) if opts.out is not None else Path(opts.dictionary) / (
        "dashboards" if opts.layer is None else f"dashboards-layer{opts.layer}")
    check_output_folder(folder, "dashboards", overwrite=opts.overwrite, is_previous=_is_dashboards)  # before any work
    model, tokenizer, _ = load_checkpoint(opts.checkpoint, device=opts.device)
    if tokenizer is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it, so text cannot be encoded")
    from circuitlab.dictionaries.clt import CrossLayerTranscoder, check_clt_fits, is_clt_folder

    if is_clt_folder(opts.dictionary):
        clt = CrossLayerTranscoder.load(opts.dictionary, device=opts.device)
        check_clt_fits(clt, model, f"the CLT in {opts.dictionary}")
        if opts.layer is None:
            raise CircuitlabError(f"{opts.dictionary} is a cross-layer transcoder: choose its layer (--layer 0..{clt.cfg.n_layers - 1})")
        sae = clt.residual_view(opts.layer)  # the layer's features; decoder: their whole write into the residual stream
    else:
        if opts.layer is not None:
            raise CircuitlabError("--layer is for a cross-layer transcoder; this dictionary reads one hook")
        sae = SparseDictionary.load(opts.dictionary, device=opts.device, model=model)  # checked, hooks bound
    TOKENS.check(opts.n_tokens, "tokens")
    COUNT.check(opts.seq_len, "seq_len")
    bad = [f for f in opts.features or [] if not 0 <= f < sae.cfg.d_sae]
    if bad:
        raise CircuitlabError(f"--features {bad} are outside the dictionary's {sae.cfg.d_sae} features")
    batches = text_batches(tokenizer, opts.data, opts.n_tokens, min(opts.seq_len, model.cfg.n_ctx))
    dash = feature_dashboards(model.eval(), sae, batches, k=opts.k, tokenizer=tokenizer, progress=opts.progress)
    notes = None
    if "clt_layer" in sae.cfg.metadata:  # a CLT feature's card says which layers it writes into
        layer, writes = sae.cfg.metadata["clt_layer"], sae.cfg.metadata["clt_write_norms"]
        dash.dictionary_info["clt"] = {"layer": layer, "n_layers": sae.cfg.metadata["clt_n_layers"]}
        notes = {f: "Writes into the MLP outputs of layers " + ", ".join(
            f"{layer + j} ({w:.2f})" for j, w in enumerate(writes[f]) if w > 0.05 * max(max(writes[f]), 1e-12))
            + " (decoder norm per layer)." for f in range(sae.cfg.d_sae)}
    kept = output_folder(folder, "dashboards", overwrite=opts.overwrite, is_previous=_is_dashboards)
    dash.save(folder)
    if notes is not None:
        from circuitlab.atomic import atomic_write_text

        atomic_write_text(folder / "clt_writes.json", json_text({"layer": layer, "write_norms": writes}))
    report = write_dashboards_report(folder, dash, opts.features, notes=notes)
    return DashboardResult(folder, report, dash.summary(), kept)


def _is_dashboards(folder: Path) -> bool:
    """Dashboards written before output folders were marked."""
    from circuitlab.dictionaries.features import META_FILE

    return (folder / META_FILE).is_file()
