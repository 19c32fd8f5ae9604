"""The transcoders a replacement model stands on, seen through one small interface.

    tc = Transcoders.per_layer(model, [SparseDictionary.load(d) for d in folders])   # one per layer
    acts = tc.encode(layer, x)                       # [..., d_in] -> [..., d_sae]
    dec = tc.decoder_vectors(layer, features)        # [n, n_writes, d_model]: rows into layers writes(layer)
    y = tc.decode(layer, acts_by_layer)              # what layer's MLP output is rebuilt as (sources <= layer)

A per-layer transcoder (ours, SAELens-format, circuit-tracer-format once read into a SparseDictionary)
writes only into its own layer's MLP output; a cross-layer transcoder writes from layer l into every
layer l' >= l. Everything that reads transcoders (the replacement model, attribution, interventions)
goes through this class, so both kinds work everywhere.
"""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.dictionaries.sae import SparseDictionary, base_model_id, check_base_model
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.model import model_dtype
from circuitlab.model.storage import stored_matmul

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MLP_OUT = "blocks.{}.hook_mlp_out"
MLP_OUT_BEFORE_NORM = "blocks.{}.mlp.hook_out"   # before a post-MLP norm (circuit-tracer's mlp.hook_out)
SAMPLE = 4096   # entries of each tensor an identity hashes: every tensor is read, none in full


def _layer_of(hook: str) -> int | None:
    parts = hook.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else None


def transcoder_sets(folder: str | Path, **loading: Any) -> dict[str, Any]:
    """The transcoder sets a folder holds (dictionaries.sets.dictionary_sets, SAEs left out): name -> a
    CrossLayerTranscoder or a list of per-layer transcoders (SparseDictionary) in layer order. loading: dtype,
    compute_dtype, mmap (dictionary_sets)."""
    from circuitlab.dictionaries.sets import dictionary_sets

    return {name: list(found.values()) if isinstance(found, dict) else found
            for name, found in dictionary_sets(folder, **loading).items() if not isinstance(found, SparseDictionary)}


def _describe_sets(sets: dict[str, Any]) -> str:
    from circuitlab.dictionaries.sets import describe_sets

    return describe_sets({name: {i: d for i, d in enumerate(s)} if isinstance(s, list) else s for name, s in sets.items()})


class Transcoders:
    """Per-layer transcoders (``per_layer``) or a cross-layer transcoder, for one model.

    layers: the model layers that have a transcoder (all of them unless a partial set was allowed);
    a layer without one keeps its real MLP output as an error term.
    """

    def __init__(self, n_layers: int, d_model: int, dictionaries: dict[int, SparseDictionary]) -> None:
        self.n_layers, self.d_model = n_layers, d_model
        self._dicts = dict(sorted(dictionaries.items()))
        self.layers = list(self._dicts)

    # ------------------------------------------------------------------ construction
    @classmethod
    def per_layer(cls, model: Transformer, dictionaries: Sequence[SparseDictionary], allow_partial: bool = False
                  ) -> "Transcoders":
        """One transcoder per layer, each reading a hook of its layer and writing blocks.{l}.hook_mlp_out (or, in
        a block with a post-MLP norm, the MLP's output before it: blocks.{l}.mlp.hook_out; the frozen norm then
        carries what the transcoder writes into the residual stream).

        Checks that they are transcoders of this model (width, base model record, hooks) and that every
        layer is covered (unless allow_partial)."""
        cfg = model.cfg
        if not cfg.has_mlp:
            raise InputError("this model has no MLPs: there is nothing for transcoders to replace")
        by_layer: dict[int, SparseDictionary] = {}
        for d in dictionaries:
            c = d.cfg
            if not c.is_transcoder:
                raise InputError(f"the dictionary for {c.hook_name} is an SAE, not a transcoder: a replacement "
                                 "model needs transcoders that read the MLP's input and write its output")
            layer = _layer_of(c.out_hook_name or "")
            if layer is None or c.out_hook_name not in (MLP_OUT.format(layer), MLP_OUT_BEFORE_NORM.format(layer)):
                raise InputError(f"the transcoder writes {c.out_hook_name}; a replacement model needs transcoders "
                                 "that write blocks.L.hook_mlp_out (or blocks.L.mlp.hook_out)")
            if layer >= cfg.n_layers:
                raise InputError(f"a transcoder writes layer {layer} but the model has {cfg.n_layers} layers "
                                 "(transcoders of another model?)")
            if _layer_of(c.hook_name) != layer:
                raise InputError(f"the transcoder for layer {layer} reads {c.hook_name}, not a hook of its own layer")
            if c.d_out != cfg.d_model:
                raise InputError(f"the transcoder for layer {layer} writes width {c.d_out} but the model's d_model "
                                 f"is {cfg.d_model} (transcoders of another model?)")
            if layer in by_layer:
                raise InputError(f"two transcoders write layer {layer}; give one per layer")
            check_base_model(d, model, f"the transcoder for layer {layer}")
            by_layer[layer] = d.for_inference()
        missing = [layer for layer in range(cfg.n_layers) if layer not in by_layer]
        if missing and not allow_partial:
            raise InputError(f"the transcoders cover layers {sorted(by_layer) or 'none'} but not {missing}; "
                             "give one per layer (or allow a partial graph: --partial)")
        if not by_layer:
            raise InputError("no transcoders given")
        return cls(cfg.n_layers, cfg.d_model, by_layer)

    @classmethod
    def load(cls, model: Transformer, folder: str | Path, allow_partial: bool = False, set_name: str | None = None,
             dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
             mmap: bool = False) -> "Transcoders":
        """Transcoders from a folder: a cross-layer transcoder (ours, circuit-tracer's cross_layer_transcoder
        layout or sparsify's), circuit-tracer's per-layer layout (config.yaml + layer_{i}.safetensors, read by
        circuitlab.dictionaries.load_transcoders), one transcoder's own folder (a partial set), or a folder of
        dictionary folders / a `circuitlab sae train` run. A run may hold several sets (clt-demo: a CLT beside
        a transcoder per layer): `set_name` names one (transcoder_sets lists them); without it a run holding
        more than one is refused, naming them.
        dtype: hold each transcoder's matrices in it (a set's folder: cast as soon as it is read, so 26 float32
        transcoders of 16,384 latents never sit in memory together); compute_dtype: default the model's. mmap:
        map the weights of circuitlab's own layouts from their files, read as each layer uses them
        (dictionaries/mapped.py)."""
        from circuitlab.dictionaries.clt import CrossLayerTranscoder, is_clt_folder
        from circuitlab.dictionaries.published import load_transcoders

        if dtype is not None and compute_dtype is None:
            compute_dtype = model_dtype(model)
        dtypes: dict[str, Any] = {"dtype": dtype, "compute_dtype": compute_dtype, "mmap": mmap}
        folder = Path(folder)
        if not folder.is_dir():
            raise InputError(f"transcoder folder not found: {folder}")
        from circuitlab.dictionaries.sets import is_dictionary_folder

        if is_clt_folder(folder) or (folder / "config.yaml").is_file() or is_dictionary_folder(folder):
            if set_name is not None:
                raise InputError(f"{folder} is one transcoder set: drop the set name {set_name!r} (it picks one set "
                                 "of a run's dictionaries/)")
            if is_clt_folder(folder):
                return cls.cross_layer(model, load_transcoders(folder, **dtypes))
            if (folder / "config.yaml").is_file():  # circuit-tracer's per-layer set: config.yaml + layer_{i}.safetensors
                from circuitlab.dictionaries.published import bind

                if not allow_partial:
                    return cls.per_layer(model, load_transcoders(folder, model=model, **dtypes))
                # A partial set (fewer layers than the model) is bound layer by layer: its hooks are named as
                # circuit-tracer names them (mlp.hook_in, mlp.hook_out, ...) and become the model's on binding.
                return cls.per_layer(model, [bind(d, model, f"the transcoder for layer {i} in {folder}")
                                             for i, d in enumerate(load_transcoders(folder, **dtypes))],
                                     allow_partial=True)
            return cls.per_layer(model, [SparseDictionary.load(folder, **dtypes)], allow_partial=allow_partial)
        sets = transcoder_sets(folder, **dtypes)
        where = folder / "dictionaries" if (folder / "dictionaries").is_dir() else folder
        if not sets:
            raise InputError(f"{where} holds no transcoders (expected one dictionary folder per layer or a "
                             "cross-layer transcoder)")
        if set_name is None and len(sets) > 1:
            raise InputError(f"{where} holds {len(sets)} transcoder sets: {_describe_sets(sets)}; name one "
                             "(--transcoder-set NAME; in Python set_name=NAME)")
        if set_name is not None and set_name not in sets:
            raise InputError(f"{where} holds no transcoder set {set_name!r}; it holds {_describe_sets(sets)}")
        found = sets[set_name if set_name is not None else next(iter(sets))]
        if isinstance(found, CrossLayerTranscoder):
            return cls.cross_layer(model, found)
        return cls.per_layer(model, found, allow_partial=allow_partial)

    # ------------------------------------------------------------------ the interface
    def has(self, layer: int) -> bool:
        return layer in self._dicts

    def dictionary(self, layer: int) -> SparseDictionary:
        return self._dicts[layer]

    def input_hook(self, layer: int) -> str:
        """The hook the encoder of `layer` reads (e.g. blocks.0.ln2.hook_normalized)."""
        return self._dicts[layer].cfg.hook_name

    def output_hook(self, layer: int) -> str:
        """The hook where layer's MLP output is rebuilt: the transcoder's (hook_mlp_out, or mlp.hook_out before a
        post-MLP norm); hook_mlp_out for a layer without a transcoder (kept whole as an error)."""
        return self._dicts[layer].cfg.out_hook_name if layer in self._dicts else MLP_OUT.format(layer)

    def d_sae(self, layer: int) -> int:
        return self._dicts[layer].cfg.d_sae

    def writes(self, layer: int) -> range:
        """The layers whose MLP output a feature of `layer` writes into (one for a per-layer transcoder)."""
        return range(layer, layer + 1)

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] -> encoder pre-activations [..., d_sae]."""
        return self._dicts[layer].pre_acts(x)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] -> feature activations [..., d_sae]."""
        return self._dicts[layer].encode(x)

    def encoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """features [n] -> [n, d_in]: the direction each feature's pre-activation reads."""
        self._dicts[layer].check_mapped()
        return self._dicts[layer].W_enc[:, features].T

    def decoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """features [n] -> [n, len(writes(layer)), d_model]: what one unit of each feature adds to each
        layer it writes."""
        self._dicts[layer].check_mapped()
        return self._dicts[layer].W_dec[features][:, None, :]

    def decoder_rows(self, layer: int, target: int, features: torch.Tensor) -> torch.Tensor:
        """features [n] -> [n, d_model]: what one unit of each feature adds to layer `target` (one of
        writes(layer)), in the storage dtype: decoder_vectors(layer, features)[:, i] without the other layers."""
        self._dicts[layer].check_mapped()
        return self._dicts[layer].W_dec[features]

    def decode(self, layer: int, acts: dict[int, torch.Tensor]) -> torch.Tensor:
        """The reconstruction of layer's MLP output from the features of the layers writing into it.
        acts: {source layer: [..., d_sae]} -> [..., d_model] (decoder bias included, skip not)."""
        d = self._dicts[layer]
        d.check_mapped()
        return stored_matmul(acts[layer].to(d.compute_dtype), d.W_dec) + d.b_dec

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """The linear skip path x [..., d_in] -> [..., d_model], or None when the transcoder has none."""
        d = self._dicts[layer]
        return stored_matmul(x.to(d.compute_dtype), d.W_skip) if d.cfg.skip else None

    def set_dtypes(self, dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None
                   ) -> "Transcoders":
        """Every dictionary's matrices held in dtype, computing in compute_dtype (DictionaryModule.set_dtypes),
        in place. Returns self."""
        for d in self._dicts.values():
            d.set_dtypes(dtype, compute_dtype)
        return self

    def to(self, dtype: torch.dtype) -> "Transcoders":
        """A copy with every dictionary in dtype (float64 for exact checks)."""
        return Transcoders(self.n_layers, self.d_model,   # Module.to works in place: copy first
                           {k: copy.deepcopy(v).to(dtype).set_dtypes(dtype, dtype) for k, v in self._dicts.items()})

    @classmethod
    def cross_layer(cls, model: Transformer, clt: Any) -> "CrossLayerTranscoders":
        """A cross-layer transcoder (circuitlab.dictionaries.clt.CrossLayerTranscoder): layer l's features
        read layer l's MLP input and write every MLP output l' >= l. Checked against the model (layers,
        width, hooks, base model); a BatchTopK CLT is used as the JumpReLU it is at inference."""
        from circuitlab.dictionaries.clt import bind_clt, check_clt_fits

        clt = bind_clt(clt, model, "the cross-layer transcoder")   # circuit-tracer's names (mlp.hook_in, ...)
        c = clt.cfg
        if c.n_layers != model.cfg.n_layers or c.d_model != model.cfg.d_model:
            raise InputError(f"the cross-layer transcoder has {c.n_layers} layers of width {c.d_model}; the model "
                             f"{model.cfg.n_layers} of width {model.cfg.d_model} (a transcoder of another model?)")
        if any(c.out_hook(layer) not in (MLP_OUT.format(layer), MLP_OUT_BEFORE_NORM.format(layer))
               for layer in range(c.n_layers)):
            raise InputError(f"the cross-layer transcoder writes {c.output_hook}; a replacement model needs one that "
                             "writes blocks.{layer}.hook_mlp_out (or blocks.{layer}.mlp.hook_out)")
        check_clt_fits(clt, model, "the cross-layer transcoder")
        return CrossLayerTranscoders(clt.for_inference() if hasattr(clt, "for_inference") else clt)

    def describe(self) -> str:
        first = self._dicts[self.layers[0]].cfg
        return (f"{len(self.layers)} per-layer {first.architecture} transcoders (d_sae {first.d_sae}, reading "
                f"{first.hook_name.split('.', 2)[-1]}{', with skip' if first.skip else ''})")

    def modules(self) -> dict[str, Any]:
        """{name: dictionary module} of every dictionary this set reads (for its identity)."""
        return {f"layer{k}": v for k, v in self._dicts.items()}

    def identity(self) -> dict[str, Any]:
        """What identifies these transcoders for a graph made with them: a hash of every weight (a strided
        sample of each tensor, as float32: a float64 or half-precision copy of float32 weights hashes alike)
        and the shapes."""
        h = hashlib.sha256()
        for name, module in sorted(self.modules().items()):
            for key, t in sorted(module.state_dict().items()):
                flat = t.detach().flatten()
                sample = flat[::max(1, len(flat) // SAMPLE)][:SAMPLE].to(torch.float32).cpu()
                h.update(f"{name}.{key}:{tuple(t.shape)}:".encode())
                h.update(sample.numpy().tobytes())
        return {"weights_sha": h.hexdigest()[:16], "layers": list(self.layers), "describe": self.describe()}

    def check_model(self, model: Transformer) -> None:
        if model.cfg.n_layers != self.n_layers or model.cfg.d_model != self.d_model:
            raise CircuitlabError(f"these transcoders are for a model of {self.n_layers} layers and d_model "
                                  f"{self.d_model}, not this one")


class CrossLayerTranscoders(Transcoders):
    """A cross-layer transcoder through the same interface: writes(l) = l .. n_layers - 1, and a layer's MLP
    output is rebuilt from the features of every layer at or below it."""

    def __init__(self, clt: Any) -> None:
        c = clt.cfg
        self.n_layers, self.d_model, self.clt = c.n_layers, c.d_model, clt
        self.layers = list(range(c.n_layers))
        self._dicts = {}

    def has(self, layer: int) -> bool:
        return 0 <= layer < self.n_layers

    def modules(self) -> dict[str, Any]:
        return {"clt": self.clt}

    def dictionary(self, layer: int) -> Any:
        return self.clt

    def input_hook(self, layer: int) -> str:
        return self.clt.cfg.in_hook(layer)

    def output_hook(self, layer: int) -> str:
        return self.clt.cfg.out_hook(layer)

    def d_sae(self, layer: int) -> int:
        return self.clt.cfg.d_sae

    def writes(self, layer: int) -> range:
        return range(layer, self.n_layers)

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.clt.pre_acts(x, layer)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.clt.encode_layer(x, layer)

    def encoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        self.clt.check_mapped()
        return self.clt.W_enc[layer][:, features].T

    def decoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        self.clt.check_mapped()
        return torch.stack([self.clt.decoder(layer, t)[features] for t in self.writes(layer)], dim=1)

    def decoder_rows(self, layer: int, target: int, features: torch.Tensor) -> torch.Tensor:
        self.clt.check_mapped()
        return self.clt.decoder(layer, target)[features]

    def decode(self, layer: int, acts: dict[int, torch.Tensor]) -> torch.Tensor:
        self.clt.check_mapped()
        out = self.clt.b_dec[layer]
        for src in range(layer + 1):
            dec = self.clt.decoder(src, layer)
            out = out + stored_matmul(acts[src].to(self.clt.dtype), dec)
        return out

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        if not self.clt.cfg.skip:
            return None
        return stored_matmul(x.to(self.clt.dtype), self.clt.W_skip[layer])

    def set_dtypes(self, dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None
                   ) -> "CrossLayerTranscoders":
        self.clt.set_dtypes(dtype, compute_dtype)
        return self

    def to(self, dtype: torch.dtype) -> "CrossLayerTranscoders":
        return CrossLayerTranscoders(copy.deepcopy(self.clt).to(dtype))  # Module.to works in place: copy first

    def describe(self) -> str:
        c = self.clt.cfg
        return (f"a {c.architecture} cross-layer transcoder over {c.n_layers} layers (d_sae {c.d_sae} per layer"
                f"{', with skip' if c.skip else ''})")


# ---------------------------------------------------------------------------- what a graph was made with

def made_with(model: Transformer, transcoders: Transcoders) -> dict[str, Any]:
    """The identity a graph records of the model and transcoders it was made with: {"model":
    dictionaries.base_model_id (config and weights hashes, d_model, n_layers), "transcoders":
    Transcoders.identity()}."""
    return {"model": base_model_id(model, getattr(model.cfg, "name", "") or None),
            "transcoders": transcoders.identity()}


def differs(recorded: Any, now: dict[str, Any]) -> str | None:
    """What differs between a graph's recorded identity and made_with(...) of what is loaded, in words
    ("another model: ...", "other transcoders: ..."), "unrecorded" when the graph records none, or None."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("model"), dict) \
            or not isinstance(recorded.get("transcoders"), dict):
        return "unrecorded"
    rec = {k: _short(v) for k, v in recorded["model"].items()}   # read from a file: shown, never trusted
    cur = now["model"]
    shape = f"d_model {cur['d_model']}, {cur['n_layers']} layers"
    if rec.get("config_sha") != cur["config_sha"]:
        name = f" ({rec['name']})" if rec.get("name") else ""
        if (rec.get("d_model"), rec.get("n_layers")) != (cur["d_model"], cur["n_layers"]):
            return (f"another model: the graph's{name} has d_model {rec.get('d_model')} and {rec.get('n_layers')} "
                    f"layers, the loaded one {shape}")
        return f"another model: the graph's{name} has the same shape ({shape}) but another configuration"
    if rec.get("weights_sha") != cur["weights_sha"]:
        return (f"another model: the same configuration ({shape}) with other weights (weights hash "
                f"{_short(rec.get('weights_sha'))} recorded, {cur['weights_sha']} loaded)")
    rt, ct = {k: _short(v) for k, v in recorded["transcoders"].items()}, now["transcoders"]
    if rt.get("weights_sha") != ct["weights_sha"]:
        return (f"other transcoders: the graph's are {rt.get('describe') or 'not described'} (weights hash "
                f"{rt.get('weights_sha')}), the loaded ones {ct['describe']} ({ct['weights_sha']})")
    return None


def _short(value: Any) -> Any:
    """A recorded value as shown in a message: numbers as they are, anything else as text of at most 80 chars."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)[:80]
