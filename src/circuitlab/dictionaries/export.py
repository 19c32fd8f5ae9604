"""Dictionaries written out in every layout circuitlab reads: the engine of `circuitlab sae export`.

    written = export_dictionaries("runs/clt-demo", "circuit-tracer", "exports/clt-demo-ct")
    # {"clt-batchtopk": ["clt-batchtopk"], "transcoders": ["transcoders"]}: paths under the out folder
    ExportOptions.from_args(args)    # the command's options (its flags are ExportOptions' fields)

What each layout holds, and where an item of the source (dictionaries.sets: a CLT, a per-layer transcoder set,
another dictionary) goes under OUT:

  circuitlab      ours (config.json + weights): OUT/<name>/ for a CLT or a dictionary, OUT/<member>/ per layer
  saelens         SAELens 6 folders (cfg.json + sae_weights.safetensors): dictionaries and per-layer members
  circuit-tracer  a per-layer set as OUT/<set>/ (config.yaml + layer_{i}.safetensors, layers 0..N), a CLT in its
                  cross_layer_transcoder layout; SAEs have no place there
  sparsify        a TopK CLT (OUT/<name>/blocks.{i}.mlp/); circuitlab reads no other sparsify layout
  gemma-scope     params.npz under OUT/<name>/gemma-scope-<site>/layer_<L>/width_<d_sae>/ (the file names no hook:
                  the path does, as on the hub): resid_post SAEs (res), hook_mlp_out SAEs (mlp), attn.hook_z SAEs
                  (att), ln2.hook_normalized -> hook_mlp_out transcoders (transcoders); JumpReLU / ReLU, no skip
  gemma-scope-2   params.safetensors + config.json (Hugging Face module points), skip allowed
  llama-scope     hyperparams.json + checkpoints/final.safetensors; one JumpReLU threshold for all latents

Everything is written into a temporary folder first: a refusal (a TopK dictionary in Gemma Scope, an SAE in
circuit-tracer's layout, ...) leaves nothing. Each item is read back by our own readers and compared with the
source (the same latents and reconstructions on random inputs) before the folder is swapped in.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.spec import Options, option

LAYOUTS = ("circuitlab", "saelens", "circuit-tracer", "sparsify", "gemma-scope", "gemma-scope-2", "llama-scope")
MANIFEST = "export.json"


@dataclass(frozen=True)
class ExportOptions(Options):
    """What `circuitlab sae export` writes, in which layout, where (its arguments are these fields, in this order;
    export_dictionaries takes the same)."""

    source: str = option(None, required=True, flag="source", metavar="SOURCE",
                         help="a `sae train` run, a folder of dictionaries, one CLT or circuit-tracer set, or one "
                              "dictionary")
    layout: str = option(None, required=True, choices=LAYOUTS, help="the layout to write")
    out: str = option(None, required=True, metavar="DIR", help="where to write (an earlier export there is set aside "
                                                               "as DIR.<time> once the new one is complete)")
    only: tuple[str, ...] | None = option(None, nargs="+", metavar="NAME",
                                          help="the sets / dictionaries to export (default all): a CLT's or "
                                               "dictionary's folder name, or a per-layer set's name (transcoders); "
                                               "an unknown name lists them")
    overwrite: bool = option(False, help="replace an earlier export in --out instead")
# Gemma Scope's sites, as its hub paths name them: (input hook, output hook or None) -> site
_GS_SITE: dict[tuple[str | None, str | None], str]
_GS_SITE = {("hook_resid_post", None): "res", ("hook_mlp_out", None): "mlp", ("attn.hook_z", None): "att",
            ("ln2.hook_normalized", "hook_mlp_out"): "transcoders"}


def _site(hook: str | None) -> str | None:
    return hook.split(".", 2)[2] if hook and hook.startswith("blocks.") else hook


def _gemma_scope_path(sae: SparseDictionary, where: str) -> Path:
    from circuitlab.names import layer_of

    c = sae.cfg
    site = _GS_SITE.get((_site(c.hook_name), _site(c.out_hook_name)))
    if site is None:
        raise CircuitlabError(f"{where} reads {c.hook_name}{f' -> {c.out_hook_name}' if c.out_hook_name else ''}: Gemma "
                              "Scope's paths name resid_post, mlp_out or attn z SAEs and ln2 -> mlp_out transcoders only "
                              "(use layout gemma-scope-2, saelens or circuitlab)")
    return Path(f"gemma-scope-{site}") / f"layer_{layer_of(c.hook_name)}" / f"width_{c.d_sae}"


def _write_dictionary(sae: SparseDictionary, layout: str, folder: Path, where: str) -> Path:
    """One dictionary in `layout` at folder; returns the folder its reader takes."""
    from circuitlab.dictionaries import published
    from circuitlab.dictionaries.saelens import save_saelens

    if layout == "circuitlab":
        return sae.save(folder)
    if layout == "saelens":
        return save_saelens(sae, folder)
    if layout == "gemma-scope":
        return published.save_gemma_scope(sae, folder / _gemma_scope_path(sae, where))
    if layout == "gemma-scope-2":
        return published.save_gemma_scope_2(sae, folder)
    if layout == "llama-scope":
        return published.save_llama_scope(sae, folder)
    if layout == "circuit-tracer":
        raise CircuitlabError(f"{where} is {'a transcoder outside a per-layer set' if sae.cfg.is_transcoder else 'an SAE'}: "
                              "circuit-tracer's layouts hold per-layer transcoder sets and CLTs (leave it out: --only)")
    raise CircuitlabError(f"{where} is a dictionary: sparsify's layout is read for CLTs only (leave it out: --only)")


def _write(name: str, found: Any, layout: str, out: Path) -> list[Path]:
    """Item `name` of the source in `layout` under out; returns the folders written (each one a reader takes)."""
    from circuitlab.dictionaries import published

    if isinstance(found, SparseDictionary):
        return [_write_dictionary(found, layout, out / name, name)]
    if isinstance(found, dict):  # a per-layer transcoder set
        if layout == "circuit-tracer":
            return [published.save_transcoders(list(found.values()), out / name)]
        if layout == "sparsify":
            raise CircuitlabError(f"{name} is a per-layer transcoder set: sparsify's layout is read for CLTs only "
                                  "(leave it out: --only)")
        return [_write_dictionary(d, layout, out / member, f"{member} (of {name})") for member, d in found.items()]
    if layout not in ("circuitlab", "circuit-tracer", "sparsify"):
        raise CircuitlabError(f"{name} is a cross-layer transcoder: {layout} files hold one layer's dictionary "
                              "(CLTs go to circuitlab, circuit-tracer or sparsify; or leave it out: --only)")
    return [found.save(out / name, layout=layout)]


def _same(a: Any, b: Any, where: str) -> None:
    """a and b compute the same latents and reconstructions (float64, on random inputs), else CircuitlabError."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder

    g = torch.Generator().manual_seed(0)
    a, b = copy.deepcopy(a.for_inference()).double(), copy.deepcopy(b.for_inference()).double()  # .double() is in place
    if isinstance(a, CrossLayerTranscoder):
        xs = torch.randn(16, a.cfg.n_layers, a.cfg.d_model, generator=g, dtype=torch.float64)
    else:
        xs = torch.randn(16, a.cfg.d_in, generator=g, dtype=torch.float64)
    with torch.no_grad():
        (ya, fa), (yb, fb) = a(xs), b(xs)
    if not (torch.allclose(fa, fb, atol=1e-5, rtol=1e-4) and torch.allclose(ya, yb, atol=1e-5, rtol=1e-4)):
        raise CircuitlabError(f"{where} does not read back as it was written (max |latent difference| "
                              f"{float((fa - fb).abs().max()):.3g}): not exported")


def _read_back(name: str, found: Any, folders: list[Path]) -> None:
    from circuitlab.dictionaries.clt import CrossLayerTranscoder
    from circuitlab.dictionaries.published import load_transcoders

    if isinstance(found, SparseDictionary):
        _same(found, SparseDictionary.load(folders[0]), name)
    elif isinstance(found, dict) and len(folders) == 1:  # one circuit-tracer set
        for (member, d), back in zip(found.items(), load_transcoders(folders[0]), strict=True):
            _same(d, back, f"{member} (of {name})")
    elif isinstance(found, dict):
        for (member, d), folder in zip(found.items(), folders, strict=True):
            _same(d, SparseDictionary.load(folder), f"{member} (of {name})")
    else:
        _same(found, CrossLayerTranscoder.load(folders[0]), name)


def export_dictionaries(source: str | Path, layout: str, out: str | Path, only: Sequence[str] | None = None,
                        overwrite: bool = False) -> tuple[dict[str, list[str]], Path | None]:
    """Write the dictionaries of `source` (a run, a folder of dictionaries, one set or one dictionary; see
    dictionaries.sets) in `layout` under `out`, whole or not at all, each read back and checked first. only:
    the names (dictionaries.sets) to export, default all. Returns ({name: [folders written, relative to out]},
    where an earlier export in out was set aside, or None). The earlier export is moved only once the new one is
    complete (or replaced: overwrite); a folder holding anything else is refused before any work."""
    from circuitlab.atomic import atomic_dir, atomic_write_json, set_aside
    from circuitlab.dictionaries.sets import describe_sets, dictionary_sets

    out = Path(out)
    if layout not in LAYOUTS:
        raise CircuitlabError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not is_export(out))):
        raise CircuitlabError(f"{out} already holds other files; give a new or empty folder for the export")
    sets = dictionary_sets(source)
    if not sets:
        raise CircuitlabError(f"{source} holds no dictionaries")
    unknown = [n for n in only or [] if n not in sets]
    if unknown:
        raise CircuitlabError(f"{source} holds no {', '.join(unknown)}; it holds {describe_sets(sets)}")
    chosen = {n: sets[n] for n in (only or sets)}
    written: dict[str, list[str]] = {}
    with atomic_dir(out) as tmp:
        for name, found in chosen.items():
            folders = _write(name, found, layout, tmp)
            _read_back(name, found, folders)
            written[name] = [f.relative_to(tmp).as_posix() for f in folders]
        atomic_write_json(tmp / MANIFEST, {"source": str(source), "layout": layout, "written": written}, indent=2)
        kept = None if overwrite else set_aside(out, is_export, "export")  # complete: now make room for it
    return written, kept


def is_export(folder: Path) -> bool:
    """Our own earlier export (its manifest)."""
    return (folder / MANIFEST).is_file()
