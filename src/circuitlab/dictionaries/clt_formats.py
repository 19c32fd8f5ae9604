"""The field's CLT folder layouts: circuit-tracer's and sparsify's, read and written.

circuit-tracer (its CrossLayerTranscoder / load_clt): per layer i,

    W_enc_{i}.safetensors   W_enc_{i} [d_sae, d_model] (ours transposed), b_enc_{i} [d_sae], b_dec_{i} [d_model],
                            threshold_{i} [d_sae] (JumpReLU), W_skip_{i} [d_model, d_model] (skip)
    W_dec_{i}.safetensors   W_dec_{i} [d_sae, L - i, d_model]: block j writes into layer i + j
    config.yaml             model_kind: cross_layer_transcoder, model_name, feature_input_hook, feature_output_hook

Its CLT applies the skip as x @ W_skip (no transpose; its per-layer transcoders transpose), as ours does.
It has ReLU and JumpReLU CLTs only: a TopK CLT is refused (save it in sparsify's layout, or train BatchTopK).

sparsify (EleutherAI; a CLT is one transcoder per source layer with n_targets decoders): one folder per
layer named by the MLP module it transcodes (blocks.{i}.mlp), each with

    cfg.json          activation "topk", k, num_latents, transcode: true, n_targets = L - i, per_source_tied, d_in, d_out
    sae.safetensors   encoder.weight [d_sae, d_in], encoder.bias [d_sae], W_decs.{j} [d_sae, d_out] (W_dec when
                      per-source tied), b_decs.{j} [d_out], W_skips.{j} [d_out, d_in] (applied transposed), post_encs.{j}

sparsify gives every (source, target) pair a bias and a skip: on reading, the biases into each layer are
summed and a skip between different layers (which this CLT has not) is refused; on writing, layer i's
bias and skip go to its own target (j = 0) and the others are zero. TopK only.

Both layouts keep circuitlab's own config (base model, hooks, normalisation) under a `circuitlab` key
that the other libraries ignore, so a round trip gives the same tensors bit for bit.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from circuitlab.atomic import json_text
from circuitlab.dictionaries.arch import architecture_in
from circuitlab.dictionaries.clt_config import CLTConfig
from circuitlab.errors import CircuitlabError
from circuitlab.textfile import read_text

CT_CONFIG = "config.yaml"
SP_CONFIG, SP_WEIGHTS = "cfg.json", "sae.safetensors"


def check_layout_takes(clt: Any, layout: str) -> None:  # clt: a CrossLayerTranscoder (clt.py imports this module)
    """A CLT (in its inference form) can be written in `layout` only when the layout has its architecture."""
    arch = clt.cfg.arch
    if layout == "circuit-tracer" and arch.format_name("circuit-tracer-clt") is None:
        raise CircuitlabError(f"circuit-tracer's CLTs are ReLU or JumpReLU; a {arch.name} CLT cannot be written in its "
                              "layout (use layout 'sparsify', or train BatchTopK, which is saved as JumpReLU)")
    if layout == "sparsify" and arch.format_name("sparsify") is None:
        raise CircuitlabError(f"sparsify's CLTs are TopK; a {arch.name} CLT cannot be written in its layout "
                              "(use layout 'circuit-tracer' or 'circuitlab')")


def _suffix(template: str) -> str:
    return template.replace("blocks.{layer}.", "")


def _template(suffix: str) -> str:
    return suffix if "{layer}" in suffix else f"blocks.{{layer}}.{suffix}"


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise CircuitlabError(f"CLT folder {path.parent} is incomplete: {path.name} is missing") from None
    except Exception as e:  # noqa: BLE001
        raise CircuitlabError(f"CLT file {path} is corrupt or truncated ({type(e).__name__}: {e})") from None


def _take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], where: Path) -> torch.Tensor:
    if name not in tensors:
        raise CircuitlabError(f"{where} has no tensor {name!r} (it has {', '.join(sorted(tensors)) or 'none'})")
    t = tensors[name]
    if tuple(t.shape) != shape:
        raise CircuitlabError(f"{where}: {name} has shape {tuple(t.shape)}, expected {shape} for a CLT of "
                              "this many layers and this width")
    return t


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------- circuit-tracer

def write_circuit_tracer(clt: Any, folder: Path) -> None:
    cfg, L = clt.cfg, clt.cfg.n_layers
    for i in range(L):
        enc = {f"W_enc_{i}": clt.W_enc[i].T, f"b_enc_{i}": clt.b_enc[i], f"b_dec_{i}": clt.b_dec[i]}
        if cfg.arch.has_threshold:
            enc[f"threshold_{i}"] = clt.threshold[i]
        if cfg.skip:
            enc[f"W_skip_{i}"] = clt.W_skip[i]
        W = clt.W_dec[i]
        dec = {f"W_dec_{i}": W.expand(-1, L - i, -1) if cfg.tied else W}
        for name, tensors in ((f"W_enc_{i}.safetensors", enc), (f"W_dec_{i}.safetensors", dec)):
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(folder / name))
    meta = {"model_kind": "cross_layer_transcoder", "model_name": cfg.base_model.get("name", "unknown"),
            "feature_input_hook": _suffix(cfg.input_hook), "feature_output_hook": _suffix(cfg.output_hook),
            "circuitlab": cfg.to_dict()}
    (folder / CT_CONFIG).write_text(yaml.safe_dump(meta, sort_keys=False))


def read_circuit_tracer(folder: Path) -> tuple[CLTConfig, dict[str, torch.Tensor]]:
    meta: dict[str, Any] = {}
    if (folder / CT_CONFIG).is_file():
        try:
            meta = yaml.safe_load(read_text(folder / CT_CONFIG, "transcoder config")) or {}
        except yaml.YAMLError as e:
            raise CircuitlabError(f"{folder / CT_CONFIG} is not valid YAML ({e})") from None
        if meta.get("model_kind", "cross_layer_transcoder") != "cross_layer_transcoder":
            raise CircuitlabError(f"{folder} holds a circuit-tracer {meta.get('model_kind')}, not a cross-layer transcoder")
    L = len(list(folder.glob("W_enc_*.safetensors")))
    first = _tensors(folder / "W_enc_0.safetensors")
    if "W_enc_0" not in first or first["W_enc_0"].dim() != 2:
        raise CircuitlabError(f"{folder / 'W_enc_0.safetensors'} has no W_enc_0 [d_sae, d_model]")
    d_sae, d_model = first["W_enc_0"].shape
    if "circuitlab" in meta:
        cfg = CLTConfig.from_dict(meta["circuitlab"])
        if (cfg.n_layers, cfg.d_model, cfg.d_sae) != (L, d_model, d_sae):
            raise CircuitlabError(f"{folder}: its files hold {L} layers of {d_sae} x {d_model}, but its config says "
                                  f"{cfg.n_layers} layers of {cfg.d_sae} x {cfg.d_model}")
    else:
        base = {"name": str(meta["model_name"])} if meta.get("model_name") else {}
        cfg = CLTConfig("jumprelu" if "threshold_0" in first else "relu", n_layers=L, d_model=int(d_model),
                        d_sae=int(d_sae), skip="W_skip_0" in first, dtype=_dtype_name(first["W_enc_0"]),
                        input_hook=_template(meta.get("feature_input_hook", "ln2.hook_normalized")),
                        output_hook=_template(meta.get("feature_output_hook", "hook_mlp_out")), base_model=base,
                        metadata={"source": "circuit-tracer", "tl_hook_names": True})   # TransformerLens's names
    state: dict[str, torch.Tensor] = {}
    for i in range(L):
        where = folder / f"W_enc_{i}.safetensors"
        enc = first if i == 0 else _tensors(where)
        state[f"W_enc.{i}"] = _take(enc, f"W_enc_{i}", (d_sae, d_model), where).T.contiguous()
        state[f"b_enc.{i}"] = _take(enc, f"b_enc_{i}", (d_sae,), where)
        state[f"b_dec.{i}"] = _take(enc, f"b_dec_{i}", (d_model,), where)
        if cfg.arch.has_threshold:
            state[f"threshold.{i}"] = _take(enc, f"threshold_{i}", (d_sae,), where)
        if cfg.skip:
            state[f"W_skip.{i}"] = _take(enc, f"W_skip_{i}", (d_model, d_model), where)
        where = folder / f"W_dec_{i}.safetensors"
        W = _take(_tensors(where), f"W_dec_{i}", (d_sae, L - i, d_model), where)
        if cfg.tied:
            if not bool((W == W[:, :1]).all()):
                raise CircuitlabError(f"{where}: the config says tied, but layer {i}'s decoder blocks differ")
            W = W[:, :1].contiguous()
        state[f"W_dec.{i}"] = W
    return cfg, state


# ---------------------------------------------------------------------------- sparsify

_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _sparsify_layers(folder: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for sub in folder.iterdir():
        if sub.is_dir() and (sub / SP_CONFIG).is_file():
            m = _LAYER.search(sub.name)
            if m:
                found[int(m.group(1))] = sub
    return found


def is_sparsify_clt(folder: Path) -> bool:
    return bool(_sparsify_layers(folder))


def write_sparsify(clt: Any, folder: Path) -> None:
    cfg, L = clt.cfg, clt.cfg.n_layers
    for i in range(L):
        sub = folder / f"blocks.{i}.mlp"
        sub.mkdir()
        T = L - i
        zeros_out = torch.zeros(cfg.d_model, dtype=clt.dtype)
        tensors = {"encoder.weight": clt.W_enc[i].T, "encoder.bias": clt.b_enc[i]}
        if cfg.tied:
            tensors["W_dec"] = clt.W_dec[i][:, 0]
        else:
            tensors.update({f"W_decs.{j}": clt.W_dec[i][:, j] for j in range(T)})
        tensors.update({f"b_decs.{j}": clt.b_dec[i] if j == 0 else zeros_out for j in range(T)})
        if cfg.skip:
            zeros_skip = torch.zeros(cfg.d_model, cfg.d_model, dtype=clt.dtype)
            tensors.update({f"W_skips.{j}": clt.W_skip[i].T if j == 0 else zeros_skip for j in range(T)})
        tensors.update({f"post_encs.{j}": torch.zeros(cfg.d_sae, dtype=clt.dtype) for j in range(T)})
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(sub / SP_WEIGHTS))
        meta = {"activation": cfg.arch.format_name("sparsify"), "expansion_factor": 0, "normalize_decoder": True, "num_latents": cfg.d_sae,
                "k": cfg.k, "multi_topk": False, "skip_connection": cfg.skip, "transcode": True, "n_targets": T,
                "n_sources": i, "per_source_tied": cfg.tied, "coalesce_topk": "none", "d_in": cfg.d_model,
                "d_out": cfg.d_model, "circuitlab": {**cfg.to_dict(), "layer": i}}
        (sub / SP_CONFIG).write_text(json_text(meta, indent=2))


def read_sparsify(folder: Path) -> tuple[CLTConfig, dict[str, torch.Tensor]]:
    layers = _sparsify_layers(folder)
    L = max(layers) + 1
    if sorted(layers) != list(range(L)):
        missing = sorted(set(range(L)) - set(layers))
        raise CircuitlabError(f"{folder} is a sparsify CLT without layer(s) {missing}: a CLT needs every layer from 0")
    metas = []
    for i in range(L):
        try:
            metas.append(json.loads(read_text(layers[i] / SP_CONFIG, "transcoder config")))
        except json.JSONDecodeError as e:
            raise CircuitlabError(f"{layers[i] / SP_CONFIG} is not valid JSON ({e})") from None
    m0 = metas[0]
    if not m0.get("transcode"):
        raise CircuitlabError(f"{folder} holds sparsify SAEs (transcode is false), not a cross-layer transcoder")
    arch = architecture_in("sparsify", m0.get("activation", "topk"))
    if arch is None:
        raise CircuitlabError(f"{folder}: sparsify activation {m0.get('activation')!r} is not supported (TopK only)")
    if m0.get("coalesce_topk", "none") != "none" or m0.get("normalize_io") or m0.get("post_encoder_scale"):
        raise CircuitlabError(f"{folder}: sparsify's coalesced top-k, normalize_io and post-encoder scales are not supported")
    d_model, d_sae = int(m0["d_in"]), int(m0.get("num_latents") or m0["d_in"] * m0.get("expansion_factor", 0))
    if int(m0.get("d_out") or d_model) != d_model:
        raise CircuitlabError(f"{folder}: a CLT writes MLP outputs of width d_model={d_model}, not d_out={m0['d_out']}")
    tied = bool(m0.get("per_source_tied"))
    if "circuitlab" in m0:
        cfg = CLTConfig.from_dict({k: v for k, v in m0["circuitlab"].items() if k != "layer"})
        if (cfg.n_layers, cfg.d_model, cfg.d_sae) != (L, d_model, d_sae):
            raise CircuitlabError(f"{folder}: its folders hold {L} layers of {d_sae} x {d_model}, but its config says "
                                  f"{cfg.n_layers} layers of {cfg.d_sae} x {cfg.d_model}")
    else:
        cfg = CLTConfig(arch.name, n_layers=L, d_model=d_model, d_sae=d_sae, k=int(m0.get("k", 32)), tied=tied,
                        skip=bool(m0.get("skip_connection")), metadata={"source": "sparsify"})
    state: dict[str, torch.Tensor] = {}
    biases: list[list[tuple[int, torch.Tensor]]] = [[] for _ in range(L)]   # (source layer, bias) per target
    for i, meta in enumerate(metas):
        where = layers[i] / SP_WEIGHTS
        if int(meta.get("d_in", -1)) != d_model or int(meta.get("num_latents") or d_sae) != d_sae or meta.get("k") != m0.get("k"):
            raise CircuitlabError(f"{layers[i]}: its widths or k differ from layer 0's; not one CLT")
        T = int(meta.get("n_targets") or 1)
        if T > L - i:
            raise CircuitlabError(f"{layers[i]}: layer {i} writes {T} layers ahead, past the last of {L} layers")
        t = _tensors(where)
        dtype = t["encoder.weight"].dtype if "encoder.weight" in t else torch.float32
        state[f"W_enc.{i}"] = _take(t, "encoder.weight", (d_sae, d_model), where).T.contiguous()
        state[f"b_enc.{i}"] = _take(t, "encoder.bias", (d_sae,), where)
        for j in range(T):
            post = t.get(f"post_encs.{j}")
            if post is not None and bool(post.any()):
                raise CircuitlabError(f"{where}: post_encs.{j} is non-zero (a per-target activation offset this CLT has not)")
        if cfg.tied:
            state[f"W_dec.{i}"] = _take(t, "W_dec", (d_sae, d_model), where)[:, None].contiguous()
        else:
            blocks = [_take(t, f"W_decs.{j}", (d_sae, d_model), where) for j in range(T)]
            blocks += [torch.zeros(d_sae, d_model, dtype=dtype)] * (L - i - T)  # a limited reach writes nothing further
            state[f"W_dec.{i}"] = torch.stack(blocks, dim=1)
        for j in range(T):
            b = t.get(f"b_decs.{j}", t.get("b_dec") if j == 0 else None)
            if b is not None:
                biases[i + j].append((i, _take({"b": b}, "b", (d_model,), where)))
        if cfg.skip:
            state[f"W_skip.{i}"] = _take(t, "W_skips.0" if "W_skips.0" in t else "W_skip", (d_model, d_model), where).T.contiguous()
            for j in range(1, T):
                if f"W_skips.{j}" in t and bool(t[f"W_skips.{j}"].any()):
                    raise CircuitlabError(f"{where}: W_skips.{j} skips from layer {i} to layer {i + j}; this CLT's skips "
                                          "stay within a layer")
    for target in range(L):
        own = [b for s, b in biases[target] if s == target]
        others = [b for s, b in biases[target] if s != target and bool(b.any())]  # zeros add nothing (and keep -0.0)
        total = own[0] if own else torch.zeros(d_model, dtype=state["W_enc.0"].dtype)
        for b in others:
            total = total + b
        state[f"b_dec.{target}"] = total
    return cfg, state
