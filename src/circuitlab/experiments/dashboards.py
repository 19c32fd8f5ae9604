"""`circuitlab sae dashboards`: a dictionary's feature dashboards on held-out text, saved and drawn.

    found = build_dashboards(DashboardOptions(dictionary="runs/transcoder-demo/dictionaries/transcoders-0",
                                              checkpoint="runs/features/model"))
    found.report        # <out>/report.html;  found.folder: dashboards.safetensors + dashboards.json
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from circuitlab.atomic import json_text
from circuitlab.checks import CARD_TOKENS, COUNT, INT, Number
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.spec import Options, option
from circuitlab.training.outputs import check_output_folder, output_folder


# All the text is tokenised and held at once; dashboards settle long before this. The same cap as a graph
# report's feature cards (checks.CARD_TOKENS: `circuitlab graph --dashboard-tokens`, 0 = no cards).
TOKENS = Number(int, low=1, high=CARD_TOKENS.high, why=CARD_TOKENS.why)


DICTIONARY_HELP = ("a dictionary folder or file: ours, SAELens, Gemma Scope (params.npz), Gemma Scope 2, Llama Scope, or "
                   "one layer_N.safetensors of a circuit-tracer set")


@dataclass(frozen=True)
class DashboardOptions(Options):
    """What `circuitlab sae dashboards` draws and where (its flags are these fields, in this order). device, seq_len
    and k are the Python API's alone: device's flag is written in commands/sae.py (from this default: the package
    writes device="cpu" as the default of ~20 loaders, so it is no option here), seq_len and k have none."""

    dictionary: str = option(None, required=True, metavar="DIR", help=DICTIONARY_HELP)
    checkpoint: str = option(None, required=True, metavar="DIR", help="the run or checkpoint it was trained on")
    out: str | None = option(None, metavar="DIR", help="where to write (default: DICTIONARY/dashboards)")
    data: str = option("stories", help="text for the contexts: stories (held-out built-in stories), file:PATH, "
                                       "folder:PATH, hf:NAME")   # any text source of circuitlab.data.sources
    n_tokens: int = option(32_768, TOKENS, flag="--tokens", metavar="TOKENS",
                           help=f"tokens to run (default {{default}}, at most {TOKENS.high})")
    overwrite: bool = option(False, help="replace earlier dashboards in --out (default: keep them, renamed)")
    features: tuple[int, ...] | None = option(None, INT, nargs="+", metavar="N",
                                              help="features to draw cards for in report.html (default: the 50 most "
                                                   "frequent)")
    layer: int | None = option(None, INT, metavar="L", help="for a cross-layer transcoder: the layer whose features "
                                                            "to draw (their cards list the layers they write to)")
    device: str = "cpu"
    progress: bool = option(True, flag="--no-progress", help="no progress bar")
    seq_len: int = 64
    k: int = 10                        # contexts per feature

    def __post_init__(self) -> None:   # folders given as Paths are text here
        for name in ("dictionary", "checkpoint", "out"):
            if isinstance(getattr(self, name), PurePath):
                object.__setattr__(self, name, str(getattr(self, name)))

    def check(self, error: type[Exception] = InputError) -> "DashboardOptions":
        COUNT.check(self.seq_len, "seq_len", error)
        COUNT.check(self.k, "k", error)
        return super().check(error)


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

    opts = opts.check()
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
