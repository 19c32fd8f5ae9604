"""The dictionaries a folder holds, grouped as a user names them.

    sets = dictionary_sets("runs/clt-demo")   # {"clt-batchtopk": CrossLayerTranscoder,
                                              #  "transcoders": {"transcoders-0": SparseDictionary, ...}}

A folder is a `circuitlab sae train` run (its dictionaries/) or any folder of dictionary folders, one
cross-layer transcoder (any layout CrossLayerTranscoder.load reads), one circuit-tracer per-layer set
(config.yaml + layer_{i}.safetensors), or one dictionary's own folder (ours or SAELens's). In a folder of
dictionary folders, each CLT is a set named by its folder; transcoders that write a layer's MLP output are
grouped per layer: the `kind: transcoders` entry of `sae train` names them <set>-<layer> (transcoders-2 is
in the set "transcoders"), any others form the set "per-layer"; every other dictionary (an SAE) stands alone.
`circuitlab graph --transcoder-set` and `circuitlab sae export --only` pick by these names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from circuitlab.dictionaries.sae import WEIGHTS_FILE, SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.names import layer_of

PER_LAYER = "per-layer"  # the set of per-layer transcoders not named <set>-<layer>


def is_dictionary_folder(folder: Path) -> bool:
    """One dictionary's own folder (ours or SAELens's), as opposed to a folder of them."""
    from circuitlab.dictionaries.saelens import is_saelens_folder

    return (folder / WEIGHTS_FILE).is_file() or is_saelens_folder(folder)


def is_per_layer_transcoder(d: SparseDictionary) -> bool:
    """A transcoder writing one layer's MLP output (what a replacement model takes per layer)."""
    layer = layer_of(d.cfg.out_hook_name)
    return bool(d.cfg.is_transcoder) and layer is not None and d.cfg.out_hook_name == f"blocks.{layer}.hook_mlp_out"


def _layer(d: SparseDictionary) -> int:
    """The layer a per-layer transcoder writes (is_per_layer_transcoder found it)."""
    layer = layer_of(d.cfg.out_hook_name)
    assert layer is not None
    return layer


def _set_of(name: str, layer: int) -> str:
    stem, _, tail = name.rpartition("-")
    return stem if stem and tail == str(layer) else PER_LAYER


def dictionary_sets(folder: str | Path, dtype: Any = None, compute_dtype: Any = None,
                    mmap: bool = False) -> dict[str, Any]:
    """name -> a CrossLayerTranscoder, a per-layer transcoder set ({member folder name: SparseDictionary}, in
    layer order) or a SparseDictionary (one standing alone), in name order; see the module's docstring.
    dtype, compute_dtype, mmap: as SparseDictionary.load (each dictionary cast as soon as it is read)."""
    loading = {"dtype": dtype, "compute_dtype": compute_dtype, "mmap": mmap}

    def clt(path: Path) -> Any:
        found = CrossLayerTranscoder.load(path, mmap=mmap)
        return found.set_dtypes(dtype, compute_dtype) if dtype is not None or compute_dtype is not None else found

    from circuitlab.dictionaries.clt import CrossLayerTranscoder, is_clt_folder
    from circuitlab.dictionaries.published import CT_CONFIG, load_transcoders

    folder = Path(folder)
    if not folder.is_dir():
        raise CircuitlabError(f"dictionary folder not found: {folder}")
    if is_clt_folder(folder):
        return {folder.name: clt(folder)}
    if (folder / CT_CONFIG).is_file():
        return {folder.name: {f"layer_{i}": d for i, d in enumerate(load_transcoders(folder, **loading))}}
    if is_dictionary_folder(folder):
        return {folder.name: SparseDictionary.load(folder, **loading)}
    if (folder / "dictionaries").is_dir():
        folder = folder / "dictionaries"
    sets: dict[str, Any] = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if is_clt_folder(sub):
            sets[sub.name] = clt(sub)
        elif is_dictionary_folder(sub):
            d = SparseDictionary.load(sub, **loading)
            if is_per_layer_transcoder(d):
                sets.setdefault(_set_of(sub.name, _layer(d)), {})[sub.name] = d
            else:
                sets[sub.name] = d
    for name, found in sets.items():
        if isinstance(found, dict):
            sets[name] = dict(sorted(found.items(), key=lambda kv: _layer(kv[1])))
    return dict(sorted(sets.items()))


def describe_sets(sets: dict[str, Any]) -> str:
    """"clt-batchtopk (a cross-layer transcoder), transcoders (4 per-layer transcoders), ..." for messages."""
    def what(found: Any) -> str:
        if isinstance(found, dict):
            return f"{len(found)} per-layer transcoder{'s' if len(found) != 1 else ''}"
        return "a transcoder" if isinstance(found, SparseDictionary) and found.cfg.is_transcoder else \
            "an SAE" if isinstance(found, SparseDictionary) else "a cross-layer transcoder"
    return ", ".join(f"{name} ({what(found)})" for name, found in sets.items())
