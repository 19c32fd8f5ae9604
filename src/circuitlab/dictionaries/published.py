"""Published dictionary files: Gemma Scope, Gemma Scope 2, Llama Scope, circuit-tracer transcoder sets.

    sae = SparseDictionary.load(".../gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71")  # layout found
    sae = SparseDictionary.load(path, model=model)      # + checked against the model, hooks bound to it
    tcs = load_transcoders("gemma-2-2b-transcoders", model=model)   # one transcoder per layer, in order
    save_transcoders(tcs, "out/set", model_name="google/gemma-2-2b")    # circuit-tracer's layout again

Each layout is read as its publisher's code reads it, so a loaded dictionary computes what that code
computes on the same activations (tested against a by-hand computation from the file's tensors):

  gemma-scope     params.npz: W_enc [d_in, d_sae], W_dec [d_sae, d_out], b_enc, b_dec, threshold [d_sae];
                  JumpReLU of x @ W_enc + b_enc (no b_dec on the input). The file names no hook: the site
                  and layer come from the hub path (google/gemma-scope-2b-pt-res/layer_20/...): res ->
                  blocks.L.hook_resid_post, mlp -> hook_mlp_out, att -> attn.hook_z, transcoders ->
                  ln2.hook_normalized -> hook_mlp_out (circuit-tracer's reading).
  gemma-scope-2   params.safetensors: w_enc [d_in, d_sae], w_dec [d_sae, d_out], b_enc, b_dec, threshold,
                  optional affine_skip_connection [d_in, d_out] added as x @ A; config.json names the
                  Hugging Face module outputs read (hf_hook_point_in / _out) and the model.
  llama-scope     hyperparams.json (d_model, d_sae, hook_point_in / _out, a scalar jump_relu_threshold,
                  dataset_average_activation_norm) + checkpoints/final.safetensors (encoder.weight
                  [d_sae, d_model], decoder.weight [d_model, d_sae], biases), trained on inputs scaled by
                  s = √d_model / norm_in; read as SAELens reads it: W_enc·s, threshold·s, W_dec/s, b_dec/s.
  circuit-tracer  config.yaml (model_kind: transcoder_set, model_name, feature_input_hook,
                  feature_output_hook, optional `transcoders:` file list, activation, k) +
                  layer_{i}.safetensors: W_enc [d_sae, d_model], W_dec [d_sae, d_out], b_enc, b_dec,
                  optional W_skip [d_out, d_in] added as x @ W_skipᵀ, optional activation_function.threshold
                  (JumpReLU; without it ReLU, or TopK when the config says activation: topk).

Hook names are mapped to ours (TransformerLens's): HF module paths (model.layers.3.output ->
blocks.3.hook_resid_post), circuit-tracer's per-layer names (ln2.hook_normalized -> blocks.3.ln2...),
TransformerLens's hook_mlp_in (-> hook_resid_mid). circuit-tracer's ln2.hook_normalized is TransformerLens's:
in a LayerNorm block that is after the gain and bias (ours is before), so bound to a LayerNorm model it is
read as mlp.hook_in (a set save_transcoders writes says `hook_names: circuitlab` where its names are ours).
Two of the field's reading points need the model:
the MLP's input after ln2's gain (circuit-tracer's mlp.hook_in, HF pre_feedforward_layernorm: no hook of
ours) and the MLP's output before a post-norm (mlp.hook_out, a hook of ours only in blocks with a post-MLP norm).
A dictionary reading them keeps those names until it is bound to a model (`bind`, or `load(...,
model=model)`): the gain (and bias) of ln2 is folded into its encoder so it reads
blocks.L.ln2.hook_normalized exactly; mlp.hook_out stays blocks.L.mlp.hook_out where the block has a
post-MLP norm and is hook_mlp_out (the same output) where it has none. Binding also checks the base model
(name, width) and that every hook exists.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.dictionaries.config import DictionaryConfig
from circuitlab.dictionaries.sae import CONFIG_FILE, LOAD_ANY, WEIGHTS_FILE, SparseDictionary, check_base_model
from circuitlab.dictionaries.saelens import is_saelens_folder, load_saelens
from circuitlab.errors import CircuitlabError, did_you_mean
from circuitlab.model.storage import resolve_dtypes
from circuitlab.textfile import read_text

GEMMA_SCOPE, GEMMA_SCOPE_2, LLAMA_SCOPE = "params.npz", "params.safetensors", "hyperparams.json"
LLAMA_SCOPE_WEIGHTS, CT_CONFIG = "checkpoints/final.safetensors", "config.yaml"
MLP_IN, MLP_OUT = "mlp.hook_in", "mlp.hook_out"  # reading points that need a model to become hooks of ours
LN2_NORMALIZED = "ln2.hook_normalized"
# circuit-tracer names hooks as TransformerLens does, whose LayerNorm hook_normalized is after the gain and bias
# (ours, and TransformerLens's RMSNorm's, before): a set we write marks that its names are ours.
CT_OUR_NAMES = ("hook_names", "circuitlab")


# ---------------------------------------------------------------------------- hook names

# Hugging Face module paths after "model.layers.{i}." -> our hook under blocks.{i}.
_HF_HOOKS = {"output": "hook_resid_post", "": "hook_resid_post", "self_attn.o_proj.input": "attn.hook_z",
             "pre_feedforward_layernorm.output": MLP_IN, "mlp.input": MLP_IN, "mlp.output": MLP_OUT,
             "post_feedforward_layernorm.output": "hook_mlp_out", "mlp.down_proj.input": "mlp.hook_post"}
_TL_ALIASES = {"hook_mlp_in": "hook_resid_mid"}  # TransformerLens's hook_mlp_in is the residual before ln2


def our_hook(name: str, layer: int | None = None) -> str:
    """A published hook name as ours: "model.layers.3.output" -> "blocks.3.hook_resid_post";
    a per-layer name with its layer ("ln2.hook_normalized", 3) -> "blocks.3.ln2.hook_normalized"."""
    m = re.fullmatch(r"(?:model\.)?(?:language_model\.)?layers\.(\d+)(?:\.(.*))?", name)
    if m:
        rest = m.group(2) or ""
        if rest not in _HF_HOOKS:
            raise CircuitlabError(f"no circuitlab hook for the Hugging Face module point {name!r}; "
                                  f"known: model.layers.N.{{{', '.join(k for k in _HF_HOOKS if k)}}}")
        return f"blocks.{m.group(1)}.{_HF_HOOKS[rest]}"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if m:
        i, rest = int(m.group(1)), m.group(2)
    elif layer is None or name.startswith(("hook_embed", "hook_pos_embed", "ln_final")):
        return name
    else:
        i, rest = layer, name
    return f"blocks.{i}.{_TL_ALIASES.get(rest, rest)}"


def _hf_name(hook: str) -> str:
    """Ours -> the Hugging Face module point Gemma Scope 2 names (for saving)."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    back = {"hook_resid_post": "output", "attn.hook_z": "self_attn.o_proj.input", "mlp.hook_post": "mlp.down_proj.input",
            MLP_IN: "pre_feedforward_layernorm.output", MLP_OUT: "mlp.output",
            "hook_mlp_out": "post_feedforward_layernorm.output"}  # Gemma's MLP output is after its post-norm
    if not m or m.group(2) not in back:
        raise CircuitlabError(f"Gemma Scope 2 files name Hugging Face module points; {hook!r} has none "
                              f"(use one of blocks.N.{{{', '.join(sorted(back.values()))}}})")
    return f"model.layers.{m.group(1)}.{back[m.group(2)]}"


def _layer_of(hook: str) -> int | None:
    m = re.match(r"blocks\.(\d+)\.", hook)
    return int(m.group(1)) if m else None


def _hook_width(model: Any, hook: str) -> int | None:
    """The width of a hook's activation (trailing axes joined) from the model's config; None if unknown."""
    c = model.cfg
    d_head = getattr(c, "d_head", None) or c.d_model // c.n_heads
    site = hook.split(".", 2)[2] if hook.startswith("blocks.") else hook
    widths = {"mlp.hook_pre": c.d_mlp, "mlp.hook_post": c.d_mlp, "attn.hook_z": c.n_heads * d_head}
    if site in widths:
        return widths[site]
    if site.startswith(("hook_resid", "hook_attn_out", "hook_mlp_out", "hook_embed")) or site.endswith("hook_normalized"):
        return c.d_model
    return None


# ---------------------------------------------------------------------------- binding to a model

def _name_key(name: str) -> str:
    return name.strip().rstrip("/").split("/")[-1].lower()


def check_published_base(sae: SparseDictionary, model: Any, where: str = "the dictionary") -> None:
    """A published dictionary names its base model (e.g. google/gemma-2-2b) and width: refuse another model."""
    rec = sae.cfg.base_model or {}
    if rec.get("config_sha"):  # ours: check_base_model compares the exact identity
        return
    d_model, name = rec.get("d_model"), rec.get("name")
    ours = str(getattr(model.cfg, "name", "") or "")
    if name and ours and _name_key(name) != _name_key(ours):
        raise CircuitlabError(f"{where} was made for {name}, not for this model ({ours}); load it with that model")
    if d_model and int(d_model) != model.cfg.d_model:
        raise CircuitlabError(f"{where} was made for {name or 'a model'} with d_model {d_model}, but this model "
                              f"has d_model {model.cfg.d_model}")


@torch.no_grad()
def bind(sae: SparseDictionary, model: Any, where: str | None = None) -> SparseDictionary:
    """Check sae against model (base model, hooks, widths) and resolve the reading points that need the
    model (see the module docstring). Returns sae itself when nothing changes, else a bound copy."""
    where = where or f"the dictionary for {sae.cfg.hook_name}"
    check_published_base(sae, model, where)
    cfg, layer = sae.cfg, _layer_of(sae.cfg.hook_name)
    blocks = getattr(model, "blocks", [])
    out = sae
    # TransformerLens's ln2.hook_normalized in a LayerNorm block is the MLP's input (after the gain and bias)
    tl_ln = (cfg.hook_name.endswith(LN2_NORMALIZED) and cfg.metadata.get("tl_hook_names") and layer is not None
             and layer < len(blocks) and getattr(getattr(blocks[layer], "ln2", None), "kind", None) == "layernorm")
    if (cfg.hook_name.endswith(MLP_IN) or tl_ln) and layer is not None and layer < len(blocks):
        norm = getattr(blocks[layer], "ln2", None)
        if not cfg.is_transcoder:
            raise CircuitlabError(f"{where} reconstructs the MLP input after ln2's gain, which circuitlab has no "
                                  "hook for; only transcoders reading it can be bound")
        if norm is None:
            raise CircuitlabError(f"{where} reads the MLP input after ln2, but block {layer} has no ln2")
        w = getattr(norm, "w", None)
        hook = f"blocks.{layer}.ln2.hook_normalized" if w is not None else f"blocks.{layer}.hook_resid_mid"
        meta = {k: v for k, v in {**cfg.metadata, "read_as": cfg.hook_name}.items() if k != "tl_hook_names"}
        out = sae._copy_with(cfg.replace(hook_name=hook, metadata=meta))
        if w is not None:  # (x̂·w + b) @ W = x̂ @ (diag(w) W) + b @ W, the same for the skip
            b = getattr(norm, "b", None)
            w = w.to(out.W_enc.dtype)
            if b is not None:
                out.b_enc.add_(b.to(out.W_enc.dtype) @ out.W_enc)
                if cfg.skip:
                    out.b_dec.add_(b.to(out.W_enc.dtype) @ out.W_skip)
            out.W_enc.mul_(w[:, None])
            if cfg.skip:
                out.W_skip.mul_(w[:, None])
    if (out.cfg.out_hook_name or "").endswith(MLP_OUT):
        # The MLP's output before a post-MLP norm: blocks.i.mlp.hook_out, a hook only in blocks that have that
        # norm (Gemma's ln2_post, OLMo-2's); in a pre-norm block the same output is hook_mlp_out.
        i = _layer_of(out.cfg.out_hook_name)
        if i is not None and f"blocks.{i}.{MLP_OUT}" not in model.hook_points():
            out = out._copy_with(out.cfg.replace(out_hook_name=f"blocks.{i}.hook_mlp_out"))
    check_base_model(out, model, where)
    names = set(model.hook_names())
    for hook, width, what in ((out.cfg.hook_name, out.cfg.d_in, "reads"), (out.cfg.out_hook_name, out.cfg.d_out, "writes")):
        if hook is None:
            continue
        if hook not in names:
            raise CircuitlabError(f"{where} {what} {hook!r}, which this model has no hook for"
                                  f"{did_you_mean(hook, sorted(names), n=3, cutoff=0.3)}")
        have = _hook_width(model, hook)
        if have is not None and have != width:
            raise CircuitlabError(f"{where} {what} width {width} at {hook}, but this model's activation there has "
                                  f"width {have}: it was made for another model")
    return out


# ---------------------------------------------------------------------------- single dictionaries

def _build(where: str, tensors: dict[str, torch.Tensor], **cfg: Any) -> SparseDictionary:
    d_in, d_sae = tensors["W_enc"].shape
    cfg = DictionaryConfig(d_in=int(d_in), d_sae=int(d_sae), d_out=int(tensors["W_dec"].shape[1]), **cfg)
    return SparseDictionary.from_tensors(cfg, {k: v.to(torch.float32) for k, v in tensors.items()}, where)


def _need(tensors: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise CircuitlabError(f"{where} lacks {', '.join(missing)} (has {', '.join(sorted(tensors))}): not the layout it looks like")


def _read(where: Path, reader: Callable[[], Any]) -> Any:
    try:
        return reader()
    except CircuitlabError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file is the user's to replace
        raise CircuitlabError(f"{where} is corrupt or truncated ({type(e).__name__}: {e})") from None


_GS_SITES = {"res": ("hook_resid_post", None), "mlp": ("hook_mlp_out", None), "att": ("attn.hook_z", None),
             "transcoders": ("ln2.hook_normalized", "hook_mlp_out")}
_GS_D_MODEL = {"2b": 2304, "9b": 3584, "27b": 4608}


def load_gemma_scope(file: str | Path, hook_name: str | None = None, out_hook_name: str | None = None) -> SparseDictionary:
    """A Gemma Scope params.npz; its hook and model come from the hub path unless hook_name is given."""
    import numpy as np

    file = Path(file)
    with _read(file, lambda: np.load(file, allow_pickle=False)) as z:
        tensors = _read(file, lambda: {k: torch.from_numpy(np.array(z[k])) for k in z.files})
    _need(tensors, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), str(file))
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
    return _build(str(file), tensors, architecture="jumprelu", hook_name=our_hook(hook_name),
                  out_hook_name=out_hook_name and our_hook(out_hook_name), base_model=base,
                  apply_b_dec_to_input=None if out_hook_name else False,
                  metadata={"source": "gemma-scope", "file": str(file)})


def _gemma_3_name(name: str) -> str:
    name = name.replace("-v3", "-3").replace("gemma-scope-2", "gemma-3")
    return name if "/" in name else f"google/{name}"


def load_gemma_scope_2(file: str | Path) -> SparseDictionary:
    """A Gemma Scope 2 params.safetensors, with the config.json beside it (or its hub path) naming the hooks."""
    file = Path(file)
    t = _read(file, lambda: load_file(str(file)))
    _need(t, ("w_enc", "w_dec", "b_enc", "b_dec", "threshold"), str(file))
    if t["w_dec"].dim() != 2:
        raise CircuitlabError(f"{file} is a cross-layer transcoder (w_dec {tuple(t['w_dec'].shape)}); "
                              "load it with load_transcoders")
    cfg_file = file.parent / "config.json"
    raw = _read(cfg_file, lambda: json.loads(read_text(cfg_file, "dictionary config"))) if cfg_file.is_file() else _infer_gs2(file)
    if raw.get("architecture", "jump_relu") != "jump_relu":
        raise CircuitlabError(f"{cfg_file}: architecture {raw.get('architecture')!r}; Gemma Scope 2 files are jump_relu")
    if not raw.get("hf_hook_point_in"):
        raise CircuitlabError(f"{cfg_file} names no hf_hook_point_in")
    tensors = {"W_enc": t["w_enc"], "W_dec": t["w_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"], "threshold": t["threshold"]}
    if "affine_skip_connection" in t:
        tensors["W_skip"] = t["affine_skip_connection"]  # [d_in, d_out], added as x @ A: our W_skip as it is
    out_hf = raw.get("hf_hook_point_out")
    transcoder = bool(out_hf) and out_hf != raw["hf_hook_point_in"]
    base = {"d_model": int(t["b_dec"].shape[0]) if not transcoder else None}
    if raw.get("model_name"):
        base["name"] = _gemma_3_name(str(raw["model_name"]))
    return _build(str(file), tensors, architecture="jumprelu", hook_name=our_hook(raw["hf_hook_point_in"]),
                  out_hook_name=our_hook(out_hf) if transcoder else None, skip="W_skip" in tensors,
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
    hp = _read(folder / LLAMA_SCOPE, lambda: json.loads(read_text(folder / LLAMA_SCOPE, "dictionary config")))
    _need(hp, ("d_model", "d_sae", "hook_point_in", "jump_relu_threshold"), str(folder / LLAMA_SCOPE))
    weights = folder / LLAMA_SCOPE_WEIGHTS
    if not weights.is_file():
        raise CircuitlabError(f"Llama Scope dictionary {folder} is incomplete: {LLAMA_SCOPE_WEIGHTS} is missing")
    t = _read(weights, lambda: load_file(str(weights)))
    _need(t, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"), str(weights))
    if hp.get("act_fn", "jumprelu") not in ("jumprelu", "jump_relu"):
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
    return _build(str(folder), tensors, architecture="jumprelu", hook_name=our_hook(hook_in),
                  out_hook_name=our_hook(hook_out) if transcoder else None, base_model=base,
                  apply_b_dec_to_input=None if transcoder else False,
                  metadata={"source": "llama-scope", "folder": str(folder), "norm_scale_in": s_in, "norm_scale_out": s_out})


def load_dictionary(path: str | Path, device: str | torch.device = "cpu", model: Any = None,
                    dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
                    mmap: bool = False) -> SparseDictionary:
    """Any single dictionary: ours, SAELens, Gemma Scope (1 and 2), Llama Scope, or one layer of a
    circuit-tracer set (its layer_{i}.safetensors); the folder or the file. With model: bound to it.
    dtype / compute_dtype: hold its matrices in dtype and compute in compute_dtype (DictionaryModule.set_dtypes;
    both None: as read). mmap: map the weights of our own layout from their file, read when used (published
    layouts are converted as they are read: save one as ours to map it)."""
    _check_dtypes(dtype, compute_dtype, device)
    path = Path(path)
    if not path.exists():
        raise CircuitlabError(f"dictionary not found: {path}")
    folder = path if path.is_dir() else path.parent
    if path.is_file() and re.fullmatch(r"layer_\d+\.safetensors", path.name) and (folder / CT_CONFIG).is_file():
        sae = load_ct_layer(folder, int(path.name[6:-12]), path)
    elif (folder / WEIGHTS_FILE).is_file():
        sae = SparseDictionary.load_own(folder, device, mmap=mmap)
        if mmap and dtype is not None and sae.storage_dtype != resolve_dtypes(dtype, None, device)[0]:
            raise CircuitlabError(f"{folder / WEIGHTS_FILE} holds {str(sae.storage_dtype)[6:]}; a memory-mapped "
                                  f"dictionary is held in its file's dtype, not {dtype} (save it in {dtype}, or "
                                  "load it without mmap)")
    elif mmap:
        raise CircuitlabError(f"{folder} is a published layout, converted as it is read: only circuitlab's own "
                              f"({WEIGHTS_FILE}) can be memory-mapped; save it as ours once (sae.save(folder))")
    elif is_saelens_folder(folder):
        sae = load_saelens(folder)
    elif (folder / GEMMA_SCOPE).is_file():
        sae = load_gemma_scope(folder / GEMMA_SCOPE)
    elif (folder / GEMMA_SCOPE_2).is_file():
        sae = load_gemma_scope_2(folder / GEMMA_SCOPE_2)
    elif (folder / LLAMA_SCOPE).is_file():
        sae = load_llama_scope(folder)
    elif (folder / CT_CONFIG).is_file():
        raise CircuitlabError(f"{folder} is a set of transcoders (circuit-tracer's {CT_CONFIG}): load it with "
                              "circuitlab.dictionaries.load_transcoders, or one layer_N.safetensors of it")
    else:
        raise CircuitlabError(f"{folder} holds no dictionary (ours: {WEIGHTS_FILE} + {CONFIG_FILE}; SAELens: cfg.json + "
                              f"sae_weights.safetensors; Gemma Scope: {GEMMA_SCOPE}; Gemma Scope 2: {GEMMA_SCOPE_2}; "
                              f"Llama Scope: {LLAMA_SCOPE})")
    sae = _stored(sae.to(device), dtype, compute_dtype)
    return bind(sae, model, f"the dictionary in {path}") if model is not None else sae


def _check_dtypes(dtype: Any, compute_dtype: Any, device: Any) -> None:
    """Bad dtype names fail before any file is read."""
    if dtype is not None or compute_dtype is not None:
        resolve_dtypes(dtype, compute_dtype, device)


def _stored(d: Any, dtype: Any, compute_dtype: Any) -> Any:
    """d held in dtype and computing in compute_dtype, cast as soon as it is read (one float32 copy at a time)."""
    return d.set_dtypes(dtype, compute_dtype) if dtype is not None or compute_dtype is not None else d


# ---------------------------------------------------------------------------- transcoder sets

def _ct_config(folder: Path) -> dict[str, Any]:
    import yaml

    raw = _read(folder / CT_CONFIG, lambda: yaml.safe_load(read_text(folder / CT_CONFIG, "transcoder config")))
    if not isinstance(raw, dict):
        raise CircuitlabError(f"{folder / CT_CONFIG} is not a mapping")
    kind = raw.get("model_kind", "transcoder_set")
    if kind != "transcoder_set":
        raise CircuitlabError(f"{folder / CT_CONFIG}: model_kind {kind!r} is not read yet (per-layer sets are: transcoder_set)")
    _need(raw, ("feature_input_hook", "feature_output_hook"), str(folder / CT_CONFIG))
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
    t = _read(file, lambda: load_file(str(file)))
    _need(t, ("W_enc", "W_dec", "b_enc", "b_dec"), str(file))
    tensors = {"W_enc": t["W_enc"].T, "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"]}
    if "W_skip" in t:
        tensors["W_skip"] = t["W_skip"].T  # circuit-tracer adds x @ W_skipᵀ
    act, k = raw.get("activation"), raw.get("k")
    if "activation_function.threshold" in t and act in (None, "jumprelu"):
        arch = "jumprelu"
        tensors["threshold"] = t["activation_function.threshold"]
    elif act == "topk":
        arch, k = "topk", int(k if k is not None else t["k"]) if (k is not None or "k" in t) else None
        if k is None:
            raise CircuitlabError(f"{folder / CT_CONFIG} says activation: topk but gives no k")
    elif act in (None, "relu"):
        arch = "relu"
    else:
        raise CircuitlabError(f"{folder / CT_CONFIG}: activation {act!r} is not read (jumprelu, relu, topk)")
    if base:
        base["d_model"] = int(t["W_enc"].shape[1])
    return _build(str(file), tensors, architecture=arch, k=k if arch == "topk" else None, hook_name=hook_in,
                  out_hook_name=hook_out, skip="W_skip" in tensors, base_model=base,
                  metadata={"source": "circuit-tracer", "file": str(file), "layer": layer, **names})


def _load_ct_set(folder: Path, device: Any, model: Any, dtype: Any = None, compute_dtype: Any = None,
                 mmap: bool = False) -> list[SparseDictionary]:
    if mmap:
        raise CircuitlabError(f"{folder} is circuit-tracer's layout, converted as it is read: only circuitlab's own "
                              "transcoder folders can be memory-mapped; save them as ours once (save_transcoders)")
    raw = _ct_config(folder)
    files = _ct_files(folder, raw)
    return [_stored(load_ct_layer(folder, i, f, raw).to(device), dtype, compute_dtype) for i, f in enumerate(files)]


def _is_ct_set(folder: Path) -> bool:
    return (folder / CT_CONFIG).is_file()


def _is_our_set(folder: Path) -> bool:
    return any((sub / WEIGHTS_FILE).is_file() for sub in folder.iterdir() if sub.is_dir())


def _load_our_set(folder: Path, device: Any, model: Any, dtype: Any = None, compute_dtype: Any = None,
                  mmap: bool = False) -> list[SparseDictionary]:
    saes = [load_dictionary(sub, device, dtype=dtype, compute_dtype=compute_dtype, mmap=mmap)
            for sub in sorted(folder.iterdir()) if (sub / WEIGHTS_FILE).is_file()]
    saes = [s for s in saes if s.cfg.is_transcoder]
    return sorted(saes, key=lambda s: _layer_of(s.cfg.hook_name) if _layer_of(s.cfg.hook_name) is not None else -1)


def _load_clt(folder: Path, device: Any, model: Any, dtype: Any = None, compute_dtype: Any = None,
              mmap: bool = False):
    """A cross-layer transcoder (ours, circuit-tracer's model_kind: cross_layer_transcoder, sparsify's), checked
    against the model when given."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder, bind_clt, check_clt_fits

    clt = _stored(CrossLayerTranscoder.load(folder, device=device, mmap=mmap), None if mmap else dtype, compute_dtype)
    if model is not None:
        clt = bind_clt(clt, model, f"the CLT in {folder}")
        check_clt_fits(clt, model, f"the CLT in {folder}")
    return clt


def _is_clt(folder: Path) -> bool:
    from circuitlab.dictionaries.clt import is_clt_folder

    return is_clt_folder(folder)


# (name, detect(folder), load(folder, device, model)) tried in order; a CLT first (its circuit-tracer folder
# has a config.yaml too).
SET_LAYOUTS: list[tuple[str, Callable[[Path], bool], Callable[..., Any]]] = [
    ("cross-layer transcoder", _is_clt, _load_clt),
    ("circuit-tracer transcoder set", _is_ct_set, _load_ct_set),
    ("folder of circuitlab transcoders", _is_our_set, _load_our_set),
]


def load_transcoders(path: str | Path, device: str | torch.device = "cpu", model: Any = None,
                     dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
                     mmap: bool = False) -> list[SparseDictionary] | Any:
    """A set of per-layer transcoders, one per layer in layer order (circuit-tracer's config.yaml +
    layer_{i}.safetensors, or a folder of our transcoder folders). With model: each bound and checked,
    and the set must cover every layer of the model. A cross-layer transcoder folder (any of
    CrossLayerTranscoder.load's layouts) gives the CrossLayerTranscoder itself. dtype / compute_dtype: each
    transcoder held in dtype as soon as it is read (DictionaryModule.set_dtypes; both None: as read). mmap: map
    our own layout's weights from their files, read when used (load_dictionary)."""
    _check_dtypes(dtype, compute_dtype, device)
    folder = Path(path)
    if not folder.is_dir():
        raise CircuitlabError(f"transcoder set not found: {folder} (a folder)")
    for name, detect, load in SET_LAYOUTS:
        if detect(folder):
            out = load(folder, device, model, dtype, compute_dtype, mmap)
            break
    else:
        raise CircuitlabError(f"{folder} holds no transcoder set ({', '.join(n for n, _, _ in SET_LAYOUTS)})")
    if isinstance(out, list):
        if not out:
            raise CircuitlabError(f"{folder} holds no transcoders")
        layers = [_layer_of(s.cfg.hook_name) for s in out]
        if layers != list(range(len(out))):
            raise CircuitlabError(f"{folder}: the transcoders read layers {layers}, not 0..{len(out) - 1} in order")
        if model is not None:
            if len(out) != model.cfg.n_layers:
                raise CircuitlabError(f"{folder} has transcoders for {len(out)} layers but the model has {model.cfg.n_layers}")
            out = [bind(s, model, f"the transcoder for layer {i} in {folder}") for i, s in enumerate(out)]
    return out


# ---------------------------------------------------------------------------- saving

def _centred(sae: SparseDictionary, layout: str) -> SparseDictionary:
    """sae as a JumpReLU (ReLU = threshold 0) that reads x, not x − b_dec (the published layouts' encoder)."""
    sae = sae.for_inference()
    if sae.cfg.architecture not in ("jumprelu", "relu"):
        raise CircuitlabError(f"{layout} files hold JumpReLU dictionaries; a {sae.cfg.architecture} one cannot be "
                              "written there (save it with sae.save() or save_saelens)")
    if sae.cfg.architecture == "relu" or sae.cfg.apply_b_dec_to_input:
        cfg = sae.cfg.replace(architecture="jumprelu", apply_b_dec_to_input=None if sae.cfg.is_transcoder else False)
        new = SparseDictionary(cfg).to(sae.W_enc.dtype)
        state = {k: v.detach().clone() for k, v in sae.state_dict().items()}
        state.setdefault("threshold", torch.zeros_like(state["b_enc"]))
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
    raw = {"architecture": "jump_relu", "model_name": model_name or c.base_model.get("name", ""),
           "hf_hook_point_in": _hf_name(c.hook_name), "hf_hook_point_out": _hf_name(c.out_hook_name or c.hook_name),
           "affine_connection": c.skip}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    t = {k: v.detach().cpu().contiguous() for k, v in t.items()}
    atomic_write_file(folder / GEMMA_SCOPE_2, lambda tmp: save_file(t, tmp))
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
          "act_fn": "jumprelu", "jump_relu_threshold": float(thr[0]), "norm_activation": "dataset-wise",
          "dataset_average_activation_norm": {"in": math.sqrt(d), "out": math.sqrt(c.d_out)},
          "model_name": model_name or c.base_model.get("name", "")}
    t = {"encoder.weight": sae.W_enc.T, "encoder.bias": sae.b_enc, "decoder.weight": sae.W_dec.T, "decoder.bias": sae.b_dec}
    t = {k: v.detach().cpu().contiguous() for k, v in t.items()}
    folder = Path(folder)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    atomic_write_file(folder / LLAMA_SCOPE_WEIGHTS, lambda tmp: save_file(t, tmp))
    atomic_write_text(folder / LLAMA_SCOPE, json_text(hp, indent=2))
    return folder


def save_transcoders(saes: list[SparseDictionary], folder: str | Path, model_name: str | None = None) -> Path:
    """Write a per-layer set in circuit-tracer's layout: config.yaml + layer_{i}.safetensors.

    saes[i] must be a transcoder reading blocks.{i}.<X> and writing blocks.{i}.<Y>, the same X and Y for all."""
    import yaml

    if not saes:
        raise CircuitlabError("nothing to save: give one transcoder per layer")
    sites = set()
    for i, s in enumerate(saes):
        c = s.cfg
        if not c.is_transcoder or _layer_of(c.hook_name) != i or _layer_of(c.out_hook_name) != i:
            raise CircuitlabError(f"saes[{i}] ({c.hook_name} -> {c.out_hook_name}) is not a transcoder of layer {i}; "
                                  "give one transcoder per layer, in layer order")
        sites.add((c.hook_name.split(".", 2)[2], c.out_hook_name.split(".", 2)[2]))
    if len(sites) != 1:
        raise CircuitlabError(f"the transcoders read and write different sites {sorted(sites)}; a set has one pair")
    (hook_in, hook_out), = sites
    archs = {s.for_inference().cfg.architecture for s in saes}
    if len(archs) != 1:
        raise CircuitlabError(f"the transcoders mix architectures {sorted(archs)}; a set has one")
    arch = archs.pop()
    name = model_name or saes[0].cfg.base_model.get("name") or ""
    raw: dict[str, Any] = {"model_name": name, "model_kind": "transcoder_set", "feature_input_hook": hook_in,
                           "feature_output_hook": hook_out, "scan": name}
    if hook_in == LN2_NORMALIZED and not all(s.cfg.metadata.get("tl_hook_names") for s in saes):
        raw[CT_OUR_NAMES[0]] = CT_OUR_NAMES[1]   # ours: before a LayerNorm's gain (see CT_OUR_NAMES)
    if arch == "topk":
        raw.update(activation="topk", k=int(saes[0].cfg.k))
    elif arch == "relu":
        raw["activation"] = "relu"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(saes):
        s = s.for_inference()
        t = {"W_enc": s.W_enc.T, "W_dec": s.W_dec, "b_enc": s.b_enc, "b_dec": s.b_dec}
        if arch == "jumprelu":
            t["activation_function.threshold"] = s.threshold
        if arch == "topk":
            t["k"] = torch.tensor(int(s.cfg.k))
        if s.cfg.skip:
            t["W_skip"] = s.W_skip.T
        t = {k: v.detach().cpu().contiguous() for k, v in t.items()}
        atomic_write_file(folder / f"layer_{i}.safetensors", lambda tmp, t=t: save_file(t, tmp))
    atomic_write_text(folder / CT_CONFIG, yaml.safe_dump(raw, sort_keys=False))
    return folder


LOAD_ANY.append(load_dictionary)  # SparseDictionary.load reads every layout through this module
