"""circuit-tracer's per-layer transcoder sets (config.yaml + layer_{i}.safetensors), read and written (see the
package docstring); its cross-layer transcoders are clt_formats.py's."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_write_file, atomic_write_text
from circuitlab.dictionaries.arch import architecture_in, format_names, get_architecture
from circuitlab.names import layer_of
from circuitlab.dictionaries.published.names import CT_CONFIG, CT_OUR_NAMES, LN2_NORMALIZED, our_hook
from circuitlab.dictionaries.published.reading import build, need, read_or_refuse, stored
from circuitlab.dictionaries.published.scope import load_gemma_scope
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.textfile import read_text

if TYPE_CHECKING:
    from circuitlab.model import Transformer

def _ct_config(folder: Path) -> dict[str, Any]:
    import yaml

    raw = read_or_refuse(folder / CT_CONFIG, lambda: yaml.safe_load(read_text(folder / CT_CONFIG, "transcoder config")))
    if not isinstance(raw, dict):
        raise CircuitlabError(f"{folder / CT_CONFIG} is not a mapping")
    kind = raw.get("model_kind", "transcoder_set")
    if kind != "transcoder_set":
        raise CircuitlabError(f"{folder / CT_CONFIG}: model_kind {kind!r} is not read yet (per-layer sets are: transcoder_set)")
    need(raw, ("feature_input_hook", "feature_output_hook"), str(folder / CT_CONFIG))
    return raw


def _ct_files(folder: Path, raw: dict[str, Any]) -> list[Path]:
    if raw.get("transcoders"):
        files = []
        for entry in raw["transcoders"]:
            files.append(_local_file(folder, str(entry)))
        return files
    files, i = [], 0
    while (folder / f"layer_{i}.safetensors").is_file():
        files.append(folder / f"layer_{i}.safetensors")
        i += 1
    if not files:
        raise CircuitlabError(f"{folder} has {CT_CONFIG} but no layer_0.safetensors and no `transcoders:` list")
    extra = sorted(p.name for p in folder.glob("layer_*.safetensors") if p not in files)
    if extra:
        raise CircuitlabError(f"{folder}: layers must run 0..N without gaps; {extra[0]} follows a missing layer_{i}")
    return files


def _local_file(folder: Path, entry: str) -> Path:
    """A `transcoders:` entry as a local file: a path (relative to the folder), or hf://org/repo/file from the
    local Hugging Face cache (never downloaded)."""
    if entry.startswith("hf://"):
        parts = entry[5:].split("?", 1)[0].split("/", 2)
        if len(parts) == 3:
            try:
                from huggingface_hub import try_to_load_from_cache
                hit = try_to_load_from_cache(f"{parts[0]}/{parts[1]}", parts[2])
            except ImportError:
                hit = None
            if isinstance(hit, str):
                return Path(hit)
        raise CircuitlabError(f"{entry} is not in the local Hugging Face cache; download it first "
                              "(huggingface-cli download ...) or list local files in config.yaml")
    path = Path(entry).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise CircuitlabError(f"{folder / CT_CONFIG} lists {entry}, which does not exist")
    return path


def load_ct_layer(folder: Path, layer: int, file: Path | None = None, raw: dict[str, Any] | None = None) -> SparseDictionary:
    """Layer `layer` of a circuit-tracer per-layer set as a transcoder."""
    raw = raw or _ct_config(folder)
    file = file or _ct_files(folder, raw)[layer]
    hook_in, hook_out = our_hook(raw["feature_input_hook"], layer), our_hook(raw["feature_output_hook"], layer)
    base = {"name": raw["model_name"]} if raw.get("model_name") else {}
    # TransformerLens's meaning of the names (circuit-tracer's), unless the set was written by us with our own
    names = {} if raw.get(CT_OUR_NAMES[0]) == CT_OUR_NAMES[1] else {"tl_hook_names": True}
    if file.suffix == ".npz":  # Gemma Scope transcoders listed by the set
        sae = load_gemma_scope(file, hook_name=hook_in, out_hook_name=hook_out)
        return sae._copy_with(sae.cfg.replace(base_model={**sae.cfg.base_model, **base},
                                              metadata={**sae.cfg.metadata, **names}))
    t = read_or_refuse(file, lambda: load_file(str(file)))
    need(t, ("W_enc", "W_dec", "b_enc", "b_dec"), str(file))
    tensors = {"W_enc": t["W_enc"].T, "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"]}
    if "W_skip" in t:
        tensors["W_skip"] = t["W_skip"].T  # circuit-tracer adds x @ W_skipᵀ
    act, k = raw.get("activation"), raw.get("k")
    # a set that names no activation holds JumpReLUs when its files have thresholds, else ReLUs
    arch = architecture_in("circuit-tracer", act or ("jumprelu" if "activation_function.threshold" in t else "relu"))
    if arch is None or (arch.has_threshold and "activation_function.threshold" not in t):
        raise CircuitlabError(f"{folder / CT_CONFIG}: activation {act!r} is not read "
                              f"({', '.join(sorted(format_names('circuit-tracer')))})")
    if arch.has_threshold:
        tensors["threshold"] = t["activation_function.threshold"]
    if arch.uses_k:
        k = int(k if k is not None else t["k"]) if (k is not None or "k" in t) else None
        if k is None:
            raise CircuitlabError(f"{folder / CT_CONFIG} says activation: {act} but gives no k")
    if base:
        base["d_model"] = int(t["W_enc"].shape[1])
    return build(str(file), tensors, architecture=arch.name, k=k if arch.uses_k else None, hook_name=hook_in,
                  out_hook_name=hook_out, skip="W_skip" in tensors, base_model=base,
                  metadata={"source": "circuit-tracer", "file": str(file), "layer": layer, **names})


def _load_ct_set(folder: Path, device: Any, model: Transformer, dtype: Any = None, compute_dtype: Any = None,
                 mmap: bool = False) -> list[SparseDictionary]:
    if mmap:
        raise CircuitlabError(f"{folder} is circuit-tracer's layout, converted as it is read: only circuitlab's own "
                              "transcoder folders can be memory-mapped; save them as ours once (save_transcoders)")
    raw = _ct_config(folder)
    files = _ct_files(folder, raw)
    return [stored(load_ct_layer(folder, i, f, raw).to(device), dtype, compute_dtype) for i, f in enumerate(files)]


def _is_ct_set(folder: Path) -> bool:
    return (folder / CT_CONFIG).is_file()


def save_transcoders(saes: list[SparseDictionary], folder: str | Path, model_name: str | None = None) -> Path:
    """Write a per-layer set in circuit-tracer's layout: config.yaml + layer_{i}.safetensors.

    saes[i] must be a transcoder reading blocks.{i}.<X> and writing blocks.{i}.<Y>, the same X and Y for all."""
    import yaml

    if not saes:
        raise CircuitlabError("nothing to save: give one transcoder per layer")
    sites = set()
    for i, s in enumerate(saes):
        c = s.cfg
        if not c.is_transcoder or layer_of(c.hook_name) != i or layer_of(c.out_hook_name) != i:
            raise CircuitlabError(f"saes[{i}] ({c.hook_name} -> {c.out_hook_name}) is not a transcoder of layer {i}; "
                                  "give one transcoder per layer, in layer order")
        sites.add((c.hook_name.split(".", 2)[2], c.out_hook_name.split(".", 2)[2]))
    if len(sites) != 1:
        raise CircuitlabError(f"the transcoders read and write different sites {sorted(sites)}; a set has one pair")
    (hook_in, hook_out), = sites
    archs = {s.for_inference().cfg.architecture for s in saes}
    if len(archs) != 1:
        raise CircuitlabError(f"the transcoders mix architectures {sorted(archs)}; a set has one")
    arch = get_architecture(archs.pop())
    if arch.format_name("circuit-tracer") is None:
        raise CircuitlabError(f"circuit-tracer's transcoder sets hold {', '.join(sorted(format_names('circuit-tracer')))} "
                              f"transcoders; a {arch.name} set cannot be written there (save each with sae.save())")
    name = model_name or saes[0].cfg.base_model.get("name") or ""
    raw: dict[str, Any] = {"model_name": name, "model_kind": "transcoder_set", "feature_input_hook": hook_in,
                           "feature_output_hook": hook_out, "scan": name}
    if hook_in == LN2_NORMALIZED and not all(s.cfg.metadata.get("tl_hook_names") for s in saes):
        raw[CT_OUR_NAMES[0]] = CT_OUR_NAMES[1]   # ours: before a LayerNorm's gain (see CT_OUR_NAMES)
    if not arch.has_threshold:  # a JumpReLU set names no activation: its threshold tensors say it
        raw["activation"] = arch.format_name("circuit-tracer")
    if arch.uses_k:
        raw["k"] = int(saes[0].cfg.k)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(saes):
        s = s.for_inference()
        t = {"W_enc": s.W_enc.T, "W_dec": s.W_dec, "b_enc": s.b_enc, "b_dec": s.b_dec}
        if arch.has_threshold:
            t["activation_function.threshold"] = s.threshold
        if arch.uses_k:
            t["k"] = torch.tensor(int(s.cfg.k))
        if s.cfg.skip:
            t["W_skip"] = s.W_skip.T
        t = {k: v.detach().cpu().contiguous() for k, v in t.items()}
        atomic_write_file(folder / f"layer_{i}.safetensors", lambda tmp, t=t: save_file(t, tmp))
    atomic_write_text(folder / CT_CONFIG, yaml.safe_dump(raw, sort_keys=False))
    return folder
