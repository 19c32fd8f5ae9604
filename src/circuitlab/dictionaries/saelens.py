"""SAELens-format dictionaries (cfg.json + sae_weights.safetensors) in and out of a local folder.

    sae = load_saelens("path/to/sae")      # a SparseDictionary; SparseDictionary.load finds these too
    save_saelens(sae, "out/sae")           # SAE.load_from_disk("out/sae") in sae-lens reads it

Covered: SAELens 6 "standard", "topk" (with or without rescale_acts_by_decoder_norm, folded on
load), "jumprelu", and the transcoders ("transcoder", "skip_transcoder", "jumprelu_transcoder",
"jumprelu_skip_transcoder"); pre-6.0 configs (hook_point, activation_fn="topk") are read too.
Inputs must be raw activations: run-time normalisations (layer_norm, constant_norm_rescale,
whitening) are refused with a message.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.dictionaries.arch import architecture_in, architecture_names, format_names, get_architecture
from circuitlab.dictionaries.config import DICTIONARY_DTYPE, DictionaryConfig
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.textfile import read_text

SAELENS_WEIGHTS, SAELENS_CONFIG = "sae_weights.safetensors", "cfg.json"
# Each architecture's SAELens names (Architecture.formats): an SAE's, a transcoder's, a skip transcoder's.
LAYOUTS = ("saelens", "saelens-transcoder", "saelens-skip-transcoder")
_PRE_6 = {"topk": "topk"}  # SAELens before 6.0 named an activation_fn, not an architecture: all else was "standard"


def is_saelens_folder(folder: str | Path) -> bool:
    return (Path(folder) / SAELENS_CONFIG).is_file() and (Path(folder) / SAELENS_WEIGHTS).is_file()


def load_saelens(folder: str | Path, device: str | torch.device = "cpu") -> SparseDictionary:
    """A SAELens folder as a SparseDictionary with the same latents and reconstructions."""
    folder = Path(folder)
    if not is_saelens_folder(folder):
        raise CircuitlabError(f"{folder} is not a SAELens dictionary (expected {SAELENS_CONFIG} and {SAELENS_WEIGHTS})")
    try:
        raw = json.loads(read_text(folder / SAELENS_CONFIG, "SAELens config"))  # names the byte if not UTF-8
        tensors = load_file(str(folder / SAELENS_WEIGHTS))
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CircuitlabError(f"SAELens dictionary {folder} is corrupt or truncated ({type(e).__name__}: {e})") from None
    cfg = _config_from_saelens(raw, folder)
    tensors = {k: v.to(torch.float64) for k, v in tensors.items()}
    if raw.get("rescale_acts_by_decoder_norm"):  # fold the decoder norms into the encoder: same latents
        norms = tensors["W_dec"].norm(dim=-1)
        tensors["W_enc"] = tensors["W_enc"] * norms
        tensors["b_enc"] = tensors["b_enc"] * norms
        tensors["W_dec"] = tensors["W_dec"] / norms[:, None]
    out = {name: tensors[name] for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
    if cfg.arch.has_threshold:
        out["threshold"] = tensors["threshold"] if "threshold" in tensors else tensors["log_threshold"].exp()
    if cfg.skip:
        out["W_skip"] = tensors["W_skip"].T  # SAELens stores [d_out, d_in]
    return SparseDictionary.from_tensors(cfg, out, str(folder)).to(device)


def _config_from_saelens(raw: dict[str, Any], folder: Path) -> DictionaryConfig:
    meta = raw.get("metadata") or {}
    activation: Any = raw.get("activation_fn")   # JSON values, checked by DictionaryConfig below
    arch = raw.get("architecture") or _PRE_6.get(activation, "standard")
    k: Any = raw.get("k") or (raw.get("activation_fn_kwargs") or {}).get("k")
    hook = meta.get("hook_name") or raw.get("hook_name") or raw.get("hook_point") or ""
    norm = raw.get("normalize_activations", "none")
    if norm not in ("none", "expected_average_only_in", None):
        raise CircuitlabError(f"SAELens dictionary {folder} normalises its input at run time ({norm}); "
                              "only dictionaries taking raw activations can be loaded")
    layout = next((lay for lay in LAYOUTS if architecture_in(lay, arch) is not None), None)
    if layout is None:
        archs = [get_architecture(name) for name in architecture_names()]
        supported = format_names(LAYOUTS[0]) + [n for a in archs for n in map(a.format_name, LAYOUTS[1:]) if n]
        raise CircuitlabError(f"SAELens architecture {arch!r} in {folder} is not supported; "
                              f"supported: {', '.join(supported)}")
    here, skip = architecture_in(layout, arch), layout == LAYOUTS[2]
    assert here is not None  # the layout was chosen for reading it
    out_hook = (meta.get("hook_name_out") or raw.get("hook_name_out") or f"{hook}.out") if layout != LAYOUTS[0] else None
    base = {"name": meta.get("model_name") or raw.get("model_name")} if (meta.get("model_name") or raw.get("model_name")) else {}
    return DictionaryConfig(
        architecture=here.name, d_in=int(raw["d_in"]), d_sae=int(raw["d_sae"]), hook_name=hook,
        out_hook_name=out_hook, d_out=int(raw.get("d_out", raw["d_in"])), k=int(k) if here.uses_k else None,
        skip=skip, base_model=base, dtype=str(raw.get("dtype", DICTIONARY_DTYPE)).replace("torch.", ""),
        metadata={"source": "saelens", "saelens_architecture": arch},
        apply_b_dec_to_input=None if out_hook else bool(raw.get("apply_b_dec_to_input", True)),
    )


SAELENS_FORMAT = "6.0.0"  # the SAELens folder layout save_saelens writes (recorded when sae-lens is not installed)


def _saelens_version() -> str:
    """The installed sae-lens's version, read from its package metadata (importing sae_lens would pull in
    its whole stack, and it is an optional peer); SAELENS_FORMAT when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sae-lens")
    except PackageNotFoundError:
        return SAELENS_FORMAT


def save_saelens(sae: SparseDictionary, folder: str | Path) -> Path:
    """Write sae as a SAELens 6 folder (BatchTopK as its inference JumpReLU); each file atomically."""
    sae = sae.for_inference()
    c = sae.cfg
    arch = c.arch.format_name(LAYOUTS[2] if c.skip else LAYOUTS[1] if c.is_transcoder else LAYOUTS[0])
    if arch is None:
        raise CircuitlabError(f"SAELens has no {c.architecture} {'transcoder' if c.is_transcoder else 'SAE'}; "
                              "save it with sae.save() instead")
    saelens_version = _saelens_version()

    meta = {"model_name": c.base_model.get("name", ""), "hook_name": c.hook_name,
            "sae_lens_version": saelens_version, "sae_lens_training_version": saelens_version}
    if c.is_transcoder:
        meta["hook_name_out"] = c.out_hook_name
    cfg = {"architecture": arch, "d_in": c.d_in, "d_sae": c.d_sae, "dtype": c.dtype, "device": "cpu",
           "apply_b_dec_to_input": c.apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "hook_z" if c.hook_name.endswith("hook_z") else "none", "metadata": meta}
    if c.is_transcoder:
        cfg["d_out"] = c.d_out
    if c.arch.uses_k:
        cfg.update(k=c.k, rescale_acts_by_decoder_norm=False)
    tensors = {k: v.detach().cpu().contiguous() for k, v in sae.state_dict().items()}
    if c.skip:
        tensors["W_skip"] = tensors["W_skip"].T.contiguous()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_file(folder / SAELENS_WEIGHTS, lambda tmp: save_file(tensors, tmp))
    atomic_write_text(folder / SAELENS_CONFIG, json_text(cfg, indent=2))
    return folder
