"""Published dictionary files (this package reads and writes them): Gemma Scope, Gemma Scope 2, Llama Scope, circuit-tracer transcoder sets.

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

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.dictionaries.published.binding import bind, check_published_base
from circuitlab.dictionaries.published.circuit_tracer import _is_ct_set, _load_ct_set, load_ct_layer, save_transcoders
from circuitlab.dictionaries.published.names import (
    CT_CONFIG, CT_OUR_NAMES, GEMMA_SCOPE, GEMMA_SCOPE_2, LLAMA_SCOPE, LLAMA_SCOPE_WEIGHTS, LN2_NORMALIZED, MLP_IN, MLP_OUT,
    our_hook,
)
from circuitlab.dictionaries.published.reading import check_dtypes, stored
from circuitlab.dictionaries.published.scope import (
    load_gemma_scope, load_gemma_scope_2, load_llama_scope, save_gemma_scope, save_gemma_scope_2, save_llama_scope,
)
from circuitlab.dictionaries.sae import CONFIG_FILE, LOAD_ANY, WEIGHTS_FILE, SparseDictionary
from circuitlab.dictionaries.saelens import is_saelens_folder, load_saelens
from circuitlab.errors import CircuitlabError
from circuitlab.names import layer_of
from circuitlab.model.storage import resolve_dtypes

if TYPE_CHECKING:
    from circuitlab.dictionaries.clt import CrossLayerTranscoder
    from circuitlab.model import Transformer

__all__ = ["CT_CONFIG", "CT_OUR_NAMES", "GEMMA_SCOPE", "GEMMA_SCOPE_2", "LLAMA_SCOPE", "LLAMA_SCOPE_WEIGHTS",
           "LN2_NORMALIZED", "MLP_IN", "MLP_OUT", "SET_LAYOUTS", "bind", "check_published_base", "load_ct_layer",
           "load_dictionary", "load_gemma_scope", "load_gemma_scope_2", "load_llama_scope", "load_transcoders",
           "our_hook", "save_gemma_scope", "save_gemma_scope_2", "save_llama_scope", "save_transcoders"]


def load_dictionary(path: str | Path, device: str | torch.device = "cpu", model: Transformer | None = None,
                    dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
                    mmap: bool = False) -> SparseDictionary:
    """Any single dictionary: ours, SAELens, Gemma Scope (1 and 2), Llama Scope, or one layer of a
    circuit-tracer set (its layer_{i}.safetensors); the folder or the file. With model: bound to it.
    dtype / compute_dtype: hold its matrices in dtype and compute in compute_dtype (DictionaryModule.set_dtypes;
    both None: as read). mmap: map the weights of our own layout from their file, read when used (published
    layouts are converted as they are read: save one as ours to map it)."""
    check_dtypes(dtype, compute_dtype, device)
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
    sae = stored(sae.to(device), dtype, compute_dtype)
    return bind(sae, model, f"the dictionary in {path}") if model is not None else sae


def _is_our_set(folder: Path) -> bool:
    return any((sub / WEIGHTS_FILE).is_file() for sub in folder.iterdir() if sub.is_dir())


def _load_our_set(folder: Path, device: Any, model: Transformer, dtype: Any = None, compute_dtype: Any = None,
                  mmap: bool = False) -> list[SparseDictionary]:
    saes = [load_dictionary(sub, device, dtype=dtype, compute_dtype=compute_dtype, mmap=mmap)
            for sub in sorted(folder.iterdir()) if (sub / WEIGHTS_FILE).is_file()]
    saes = [s for s in saes if s.cfg.is_transcoder]
    def layer(s: SparseDictionary) -> int:
        found = layer_of(s.cfg.hook_name)
        return found if found is not None else -1

    return sorted(saes, key=layer)


def _load_clt(folder: Path, device: Any, model: Transformer, dtype: Any = None, compute_dtype: Any = None,
              mmap: bool = False) -> CrossLayerTranscoder:
    """A cross-layer transcoder (ours, circuit-tracer's model_kind: cross_layer_transcoder, sparsify's), checked
    against the model when given."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder, bind_clt, check_clt_fits

    clt = stored(CrossLayerTranscoder.load(folder, device=device, mmap=mmap), None if mmap else dtype, compute_dtype)
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


def load_transcoders(path: str | Path, device: str | torch.device = "cpu", model: Transformer | None = None,
                     dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
                     mmap: bool = False) -> list[SparseDictionary] | Any:
    """A set of per-layer transcoders, one per layer in layer order (circuit-tracer's config.yaml +
    layer_{i}.safetensors, or a folder of our transcoder folders). With model: each bound and checked,
    and the set must cover every layer of the model. A cross-layer transcoder folder (any of
    CrossLayerTranscoder.load's layouts) gives the CrossLayerTranscoder itself. dtype / compute_dtype: each
    transcoder held in dtype as soon as it is read (DictionaryModule.set_dtypes; both None: as read). mmap: map
    our own layout's weights from their files, read when used (load_dictionary)."""
    check_dtypes(dtype, compute_dtype, device)
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
        layers = [layer_of(s.cfg.hook_name) for s in out]
        if layers != list(range(len(out))):
            raise CircuitlabError(f"{folder}: the transcoders read layers {layers}, not 0..{len(out) - 1} in order")
        if model is not None:
            if len(out) != model.cfg.n_layers:
                raise CircuitlabError(f"{folder} has transcoders for {len(out)} layers but the model has {model.cfg.n_layers}")
            out = [bind(s, model, f"the transcoder for layer {i} in {folder}") for i, s in enumerate(out)]
    return out


LOAD_ANY.append(load_dictionary)  # SparseDictionary.load reads every layout through this module
