"""Gemma Scope (params.npz), Gemma Scope 2 (params.safetensors + config.json) and Llama Scope (hyperparams.json +
checkpoints/final.safetensors): JumpReLU dictionaries, read and written (see the package docstring)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.dictionaries.arch import JumpReLU, architecture_in, format_names
from circuitlab.dictionaries.published.names import GEMMA_SCOPE, GEMMA_SCOPE_2, LLAMA_SCOPE, LLAMA_SCOPE_WEIGHTS, hf_name, our_hook
from circuitlab.dictionaries.published.reading import build, need, read_or_refuse
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.textfile import read_text

_GS_SITES = {"res": ("hook_resid_post", None), "mlp": ("hook_mlp_out", None), "att": ("attn.hook_z", None),
             "transcoders": ("ln2.hook_normalized", "hook_mlp_out")}
_GS_D_MODEL = {"2b": 2304, "9b": 3584, "27b": 4608}


def load_gemma_scope(file: str | Path, hook_name: str | None = None, out_hook_name: str | None = None) -> SparseDictionary:
    """A Gemma Scope params.npz; its hook and model come from the hub path unless hook_name is given."""
    import numpy as np

    file = Path(file)
    with read_or_refuse(file, lambda: np.load(file, allow_pickle=False)) as z:
        tensors = read_or_refuse(file, lambda: {k: torch.from_numpy(np.array(z[k])) for k in z.files})
    need(tensors, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), str(file))
    path = file.as_posix()
    # the hub's gemma-scope-2b-pt-res/..., or gemma-scope-res/... (no model named) as `circuitlab sae export` writes
    repo = re.search(r"gemma-scope-(?:(\d+b)-(pt|it)-)?(res|mlp|att|transcoders)", path)
    layer = re.search(r"/layer_(\d+)/", path)
    base: dict[str, Any] = {}
    if repo and repo.group(1):
        size, kind, site = repo.groups()
        base = {"name": f"google/gemma-2-{size}" + ("-it" if kind == "it" else ""), "d_model": _GS_D_MODEL.get(size)}
    if hook_name is None:
        if not (repo and layer):
            raise CircuitlabError(f"{file} names no hook (Gemma Scope's params.npz does not): keep it under its hub "
                                  "path (.../gemma-scope-2b-pt-res/layer_20/width_16k/.../params.npz) or pass hook_name=")
        inp, out = _GS_SITES[repo.group(3)]
        hook_name, out_hook_name = f"blocks.{layer.group(1)}.{inp}", out and f"blocks.{layer.group(1)}.{out}"
    base = {k: v for k, v in base.items() if v}
    return build(str(file), tensors, architecture=JumpReLU.name, hook_name=our_hook(hook_name),
                  out_hook_name=out_hook_name and our_hook(out_hook_name), base_model=base,
                  apply_b_dec_to_input=None if out_hook_name else False,
                  metadata={"source": "gemma-scope", "file": str(file)})


def _gemma_3_name(name: str) -> str:
    name = name.replace("-v3", "-3").replace("gemma-scope-2", "gemma-3")
    return name if "/" in name else f"google/{name}"


def load_gemma_scope_2(file: str | Path) -> SparseDictionary:
    """A Gemma Scope 2 params.safetensors, with the config.json beside it (or its hub path) naming the hooks."""
    file = Path(file)
    t = read_or_refuse(file, lambda: load_file(str(file)))
    need(t, ("w_enc", "w_dec", "b_enc", "b_dec", "threshold"), str(file))
    if t["w_dec"].dim() != 2:
        raise CircuitlabError(f"{file} is a cross-layer transcoder (w_dec {tuple(t['w_dec'].shape)}); "
                              "load it with load_transcoders")
    cfg_file = file.parent / "config.json"
    raw = read_or_refuse(cfg_file, lambda: json.loads(read_text(cfg_file, "dictionary config"))) if cfg_file.is_file() else _infer_gs2(file)
    arch = architecture_in("gemma-scope-2", raw.get("architecture", "jump_relu"))
    if arch is None:
        raise CircuitlabError(f"{cfg_file}: architecture {raw.get('architecture')!r}; Gemma Scope 2 files are "
                              f"{' or '.join(format_names('gemma-scope-2'))}")
    if not raw.get("hf_hook_point_in"):
        raise CircuitlabError(f"{cfg_file} names no hf_hook_point_in")
    tensors = {"W_enc": t["w_enc"], "W_dec": t["w_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"], "threshold": t["threshold"]}
    if "affine_skip_connection" in t:
        tensors["W_skip"] = t["affine_skip_connection"]  # [d_in, d_out], added as x @ A: our W_skip as it is
    out_hf = raw.get("hf_hook_point_out")
    transcoder = bool(out_hf) and out_hf != raw["hf_hook_point_in"]
    base: dict[str, Any] = {"d_model": int(t["b_dec"].shape[0]) if not transcoder else None}
    if raw.get("model_name"):
        base["name"] = _gemma_3_name(str(raw["model_name"]))
    return build(str(file), tensors, architecture=arch.name, hook_name=our_hook(str(raw["hf_hook_point_in"])),
                  out_hook_name=our_hook(str(out_hf)) if transcoder else None, skip="W_skip" in tensors,
                  base_model={k: v for k, v in base.items() if v}, apply_b_dec_to_input=None if transcoder else False,
                  metadata={"source": "gemma-scope-2", "file": str(file)})


def _infer_gs2(file: Path) -> dict[str, Any]:
    """Gemma Scope 2 folders without config.json: the site and layer from the folder name."""
    path = file.as_posix()
    layer = re.search(r"layer_(\d+)", file.parent.name)
    if not layer:
        raise CircuitlabError(f"{file} has no config.json and its folder does not name a layer (layer_N_...)")
    i = layer.group(1)
    sites = {"resid_post": (f"model.layers.{i}.output", None),
             "attn_out": (f"model.layers.{i}.self_attn.o_proj.input", None),
             "mlp_out": (f"model.layers.{i}.post_feedforward_layernorm.output", None),
             "transcoder": (f"model.layers.{i}.pre_feedforward_layernorm.output",
                            f"model.layers.{i}.post_feedforward_layernorm.output")}
    site = next((s for s in sites if s in path), None)
    if site is None:
        raise CircuitlabError(f"{file} has no config.json and its path names no site ({', '.join(sites)})")
    repo = re.search(r"gemma-scope-2-[^/]+?-(?:pt|it)", path)
    raw = {"architecture": "jump_relu", "hf_hook_point_in": sites[site][0], "hf_hook_point_out": sites[site][1]}
    if repo:
        raw["model_name"] = repo.group(0).split("--")[-1]
    return raw


def load_llama_scope(folder: str | Path) -> SparseDictionary:
    """A Llama Scope folder: hyperparams.json + checkpoints/final.safetensors (dataset-wise norm folded in)."""
    folder = Path(folder)
    hp = read_or_refuse(folder / LLAMA_SCOPE, lambda: json.loads(read_text(folder / LLAMA_SCOPE, "dictionary config")))
    need(hp, ("d_model", "d_sae", "hook_point_in", "jump_relu_threshold"), str(folder / LLAMA_SCOPE))
    weights = folder / LLAMA_SCOPE_WEIGHTS
    if not weights.is_file():
        raise CircuitlabError(f"Llama Scope dictionary {folder} is incomplete: {LLAMA_SCOPE_WEIGHTS} is missing")
    t = read_or_refuse(weights, lambda: load_file(str(weights)))
    need(t, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"), str(weights))
    arch = architecture_in("llama-scope", hp.get("act_fn", "jumprelu"))
    if arch is None:
        raise CircuitlabError(f"{folder}: act_fn {hp.get('act_fn')!r}; only Llama Scope's JumpReLU is read")
    d = int(hp["d_model"])
    hook_in, hook_out = hp["hook_point_in"], hp.get("hook_point_out") or hp["hook_point_in"]
    transcoder = hook_out != hook_in
    norms = hp.get("dataset_average_activation_norm") or {}
    s_in = math.sqrt(d) / float(norms["in"]) if norms.get("in") else 1.0
    s_out = (math.sqrt(d) / float(norms["out"]) if norms.get("out") else 1.0) if transcoder else s_in
    f64 = {k: v.to(torch.float64) for k, v in t.items()}
    tensors = {"W_enc": f64["encoder.weight"].T * s_in, "b_enc": f64["encoder.bias"],
               "W_dec": f64["decoder.weight"].T / s_out, "b_dec": f64["decoder.bias"] / s_out,
               "threshold": torch.full((int(hp["d_sae"]),), float(hp["jump_relu_threshold"]) * s_in, dtype=torch.float64)}
    base = {"name": hp.get("model_name") or "meta-llama/Llama-3.1-8B", "d_model": d}
    return build(str(folder), tensors, architecture=arch.name, hook_name=our_hook(hook_in),
                  out_hook_name=our_hook(hook_out) if transcoder else None, base_model=base,
                  apply_b_dec_to_input=None if transcoder else False,
                  metadata={"source": "llama-scope", "folder": str(folder), "norm_scale_in": s_in, "norm_scale_out": s_out})


def _centred(sae: SparseDictionary, layout: str) -> SparseDictionary:
    """sae as a JumpReLU (ReLU = threshold 0) that reads x, not x − b_dec (the published layouts' encoder)."""
    sae = sae.for_inference()
    threshold = sae.cfg.arch.jumprelu_threshold(sae.latent_threshold(), sae.b_enc)  # ReLU's: 0
    if threshold is None:
        raise CircuitlabError(f"{layout} files hold JumpReLU dictionaries; a {sae.cfg.architecture} one cannot be "
                              "written there (save it with sae.save() or save_saelens)")
    if not sae.cfg.arch.has_threshold or sae.cfg.apply_b_dec_to_input:
        cfg = sae.cfg.replace(architecture=JumpReLU.name, apply_b_dec_to_input=None if sae.cfg.is_transcoder else False)
        new = SparseDictionary(cfg).to(sae.W_enc.dtype)
        state = {k: v.detach().clone() for k, v in sae.state_dict().items()}
        state.setdefault("threshold", threshold.detach().clone())
        if sae.cfg.apply_b_dec_to_input:  # (x − b_dec) W + b_enc = x W + (b_enc − b_dec W)
            state["b_enc"] = (state["b_enc"].double() - state["b_dec"].double() @ state["W_enc"].double()).to(state["b_enc"].dtype)
        new.load_state_dict(state)
        sae = new
    return sae


def _np(t: torch.Tensor) -> Any:
    return t.detach().cpu().float().numpy() if t.dtype == torch.bfloat16 else t.detach().cpu().numpy()


def save_gemma_scope(sae: SparseDictionary, folder: str | Path) -> Path:
    """Write params.npz (Gemma Scope). The file names no hook: keep it under a path naming the site and layer
    (gemma-scope-2b-pt-res/layer_3/...) or load it with hook_name=. No skip connection."""
    import io

    import numpy as np

    sae = _centred(sae, "Gemma Scope")
    if sae.cfg.skip:
        raise CircuitlabError("Gemma Scope files have no skip connection; use save_gemma_scope_2 or save_transcoders")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {k: _np(getattr(sae, k)) for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}

    def write(tmp: str) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        Path(tmp).write_bytes(buf.getvalue())

    atomic_write_file(folder / GEMMA_SCOPE, write)
    return folder


def save_gemma_scope_2(sae: SparseDictionary, folder: str | Path, model_name: str | None = None) -> Path:
    """Write params.safetensors + config.json (Gemma Scope 2), hooks as Hugging Face module points."""
    sae = _centred(sae, "Gemma Scope 2")
    c = sae.cfg
    t = {"w_enc": sae.W_enc, "w_dec": sae.W_dec, "b_enc": sae.b_enc, "b_dec": sae.b_dec, "threshold": sae.threshold}
    if c.skip:
        t["affine_skip_connection"] = sae.W_skip
    raw = {"architecture": c.arch.format_name("gemma-scope-2"), "model_name": model_name or c.base_model.get("name", ""),
           "hf_hook_point_in": hf_name(c.hook_name), "hf_hook_point_out": hf_name(c.out_hook_name or c.hook_name),
           "affine_connection": c.skip}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plain = {k: v.detach().cpu().contiguous() for k, v in t.items()}
    atomic_write_file(folder / GEMMA_SCOPE_2, lambda tmp: save_file(plain, tmp))
    atomic_write_text(folder / "config.json", json_text(raw, indent=2))
    return folder


def save_llama_scope(sae: SparseDictionary, folder: str | Path, model_name: str | None = None) -> Path:
    """Write hyperparams.json + checkpoints/final.safetensors (Llama Scope). Its threshold is one number, so
    every latent's threshold must be the same; written with norm scale 1 (the weights take raw activations)."""
    sae = _centred(sae, "Llama Scope")
    c = sae.cfg
    if c.skip:
        raise CircuitlabError("Llama Scope files have no skip connection")
    thr = sae.threshold.detach()
    if not bool((thr == thr[0]).all()):
        raise CircuitlabError("Llama Scope stores one JumpReLU threshold for all latents; this dictionary's differ "
                              f"({float(thr.min()):.4g} .. {float(thr.max()):.4g})")
    d = c.d_in
    hp = {"d_model": d, "d_sae": c.d_sae, "hook_point_in": c.hook_name, "hook_point_out": c.out_hook_name or c.hook_name,
          "act_fn": c.arch.format_name("llama-scope"), "jump_relu_threshold": float(thr[0]), "norm_activation": "dataset-wise",
          "dataset_average_activation_norm": {"in": math.sqrt(d), "out": math.sqrt(c.d_out)},
          "model_name": model_name or c.base_model.get("name", "")}
    t = {"encoder.weight": sae.W_enc.T, "encoder.bias": sae.b_enc, "decoder.weight": sae.W_dec.T, "decoder.bias": sae.b_dec}
    t = {k: v.detach().cpu().contiguous() for k, v in t.items()}
    folder = Path(folder)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    atomic_write_file(folder / LLAMA_SCOPE_WEIGHTS, lambda tmp: save_file(t, tmp))
    atomic_write_text(folder / LLAMA_SCOPE, json_text(hp, indent=2))
    return folder
