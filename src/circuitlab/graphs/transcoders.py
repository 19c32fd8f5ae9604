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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from circuitlab.dictionaries.sae import SparseDictionary, check_base_model
from circuitlab.errors import CircuitlabError, InputError

MLP_OUT = "blocks.{}.hook_mlp_out"


def _layer_of(hook: str) -> int | None:
    parts = hook.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else None


def transcoder_sets(folder: str | Path) -> dict[str, Any]:
    """The transcoder sets a folder holds (dictionaries.sets.dictionary_sets, SAEs left out): name -> a
    CrossLayerTranscoder or a list of per-layer transcoders (SparseDictionary) in layer order."""
    from circuitlab.dictionaries.sets import dictionary_sets

    return {name: list(found.values()) if isinstance(found, dict) else found
            for name, found in dictionary_sets(folder).items() if not isinstance(found, SparseDictionary)}


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
    def per_layer(cls, model: Any, dictionaries: Sequence[SparseDictionary], allow_partial: bool = False
                  ) -> "Transcoders":
        """One transcoder per layer, each reading a hook of its layer and writing blocks.{l}.hook_mlp_out.

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
            if layer is None or c.out_hook_name != MLP_OUT.format(layer):
                raise InputError(f"the transcoder writes {c.out_hook_name}; a replacement model needs transcoders "
                                 "that write blocks.L.hook_mlp_out")
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
    def load(cls, model: Any, folder: str | Path, allow_partial: bool = False, set_name: str | None = None
             ) -> "Transcoders":
        """Transcoders from a folder: a cross-layer transcoder (ours, circuit-tracer's cross_layer_transcoder
        layout or sparsify's), circuit-tracer's per-layer layout (config.yaml + layer_{i}.safetensors, read by
        circuitlab.dictionaries.load_transcoders), one transcoder's own folder (a partial set), or a folder of
        dictionary folders / a `circuitlab sae train` run. A run may hold several sets (clt-demo: a CLT beside
        a transcoder per layer): `set_name` names one (transcoder_sets lists them); without it a run holding
        more than one is refused, naming them."""
        from circuitlab.dictionaries.clt import CrossLayerTranscoder, is_clt_folder

        folder = Path(folder)
        if not folder.is_dir():
            raise InputError(f"transcoder folder not found: {folder}")
        from circuitlab.dictionaries.sets import is_dictionary_folder

        if is_clt_folder(folder) or (folder / "config.yaml").is_file() or is_dictionary_folder(folder):
            if set_name is not None:
                raise InputError(f"{folder} is one transcoder set: drop the set name {set_name!r} (it picks one set "
                                 "of a run's dictionaries/)")
            if is_clt_folder(folder):
                return cls.cross_layer(model, CrossLayerTranscoder.load(folder))
            if (folder / "config.yaml").is_file():  # circuit-tracer's per-layer set
                from circuitlab.dictionaries import load_transcoders

                return cls.per_layer(model, load_transcoders(folder, model=None if allow_partial else model),
                                     allow_partial=allow_partial)
            return cls.per_layer(model, [SparseDictionary.load(folder)], allow_partial=allow_partial)
        sets = transcoder_sets(folder)
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
        return MLP_OUT.format(layer)

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
        return self._dicts[layer].W_enc[:, features].T

    def decoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """features [n] -> [n, len(writes(layer)), d_model]: what one unit of each feature adds to each
        layer it writes."""
        return self._dicts[layer].W_dec[features][:, None, :]

    def decode(self, layer: int, acts: dict[int, torch.Tensor]) -> torch.Tensor:
        """The reconstruction of layer's MLP output from the features of the layers writing into it.
        acts: {source layer: [..., d_sae]} -> [..., d_model] (decoder bias included, skip not)."""
        d = self._dicts[layer]
        return acts[layer].to(d.W_dec.dtype) @ d.W_dec + d.b_dec

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """The linear skip path x [..., d_in] -> [..., d_model], or None when the transcoder has none."""
        d = self._dicts[layer]
        return x.to(d.W_skip.dtype) @ d.W_skip if d.cfg.skip else None

    def to(self, dtype: torch.dtype) -> "Transcoders":
        """A copy with every dictionary in dtype (float64 for exact checks)."""
        return Transcoders(self.n_layers, self.d_model, {k: v.to(dtype) for k, v in self._dicts.items()})

    @classmethod
    def cross_layer(cls, model: Any, clt: Any) -> "CrossLayerTranscoders":
        """A cross-layer transcoder (circuitlab.dictionaries.clt.CrossLayerTranscoder): layer l's features
        read layer l's MLP input and write every MLP output l' >= l. Checked against the model (layers,
        width, hooks, base model); a BatchTopK CLT is used as the JumpReLU it is at inference."""
        from circuitlab.dictionaries.clt import check_clt_fits

        c = clt.cfg
        if c.n_layers != model.cfg.n_layers or c.d_model != model.cfg.d_model:
            raise InputError(f"the cross-layer transcoder has {c.n_layers} layers of width {c.d_model}; the model "
                             f"{model.cfg.n_layers} of width {model.cfg.d_model} (a transcoder of another model?)")
        if any(c.out_hook(layer) != MLP_OUT.format(layer) for layer in range(c.n_layers)):
            raise InputError(f"the cross-layer transcoder writes {c.output_hook}; a replacement model needs one that "
                             "writes blocks.{layer}.hook_mlp_out")
        check_clt_fits(clt, model, "the cross-layer transcoder")
        return CrossLayerTranscoders(clt.for_inference() if hasattr(clt, "for_inference") else clt)

    def describe(self) -> str:
        first = self._dicts[self.layers[0]].cfg
        return (f"{len(self.layers)} per-layer {first.architecture} transcoders (d_sae {first.d_sae}, reading "
                f"{first.hook_name.split('.', 2)[-1]}{', with skip' if first.skip else ''})")

    def check_model(self, model: Any) -> None:
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

    def dictionary(self, layer: int) -> Any:
        return self.clt

    def input_hook(self, layer: int) -> str:
        return self.clt.cfg.in_hook(layer)

    def d_sae(self, layer: int) -> int:
        return self.clt.cfg.d_sae

    def writes(self, layer: int) -> range:
        return range(layer, self.n_layers)

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.clt.pre_acts(x, layer)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self.clt.encode_layer(x, layer)

    def encoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        return self.clt.W_enc[layer][:, features].T

    def decoder_vectors(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.clt.decoder(layer, t)[features] for t in self.writes(layer)], dim=1)

    def decode(self, layer: int, acts: dict[int, torch.Tensor]) -> torch.Tensor:
        out = self.clt.b_dec[layer]
        for src in range(layer + 1):
            dec = self.clt.decoder(src, layer)
            out = out + acts[src].to(dec.dtype) @ dec
        return out

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        if not self.clt.cfg.skip:
            return None
        w = self.clt.W_skip[layer]
        return x.to(w.dtype) @ w

    def to(self, dtype: torch.dtype) -> "CrossLayerTranscoders":
        return CrossLayerTranscoders(copy.deepcopy(self.clt).to(dtype))  # Module.to works in place: copy first

    def describe(self) -> str:
        c = self.clt.cfg
        return (f"a {c.architecture} cross-layer transcoder over {c.n_layers} layers (d_sae {c.d_sae} per layer"
                f"{', with skip' if c.skip else ''})")
