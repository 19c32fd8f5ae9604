"""Cross-layer transcoders (CLTs): one encoder per layer, decoders from each layer to its own MLP output and every later one.

    cfg = CLTConfig("topk", n_layers=4, d_model=128, d_sae=512, k=16)
    clt = CrossLayerTranscoder(cfg)
    acts = clt.encode_layer(x_l, l)             # MLP input of layer l [..., d_model] -> [..., d_sae]
    out = clt.decode_layer(acts, l)             # [..., d_sae] -> [..., n_layers - l, d_model]: what layer l's
                                                #   features write into the MLP outputs of layers l..L-1 (no bias)
    y_hat, acts = clt(xs)                       # xs [..., L, d_model] -> ([..., L, d_model], [..., L, d_sae])
    clt.save("dicts/clt"); clt = CrossLayerTranscoder.load("dicts/clt")   # also circuit-tracer / sparsify folders

The output at layer l' is Σ_{l ≤ l'} W_dec^{l→l'} a^l + b_dec^{l'} (+ W_skip^{l'} x^{l'} with a skip). A *tied*
CLT has one decoder per source layer, shared by every layer it writes to. The inputs are read at
`input_hook` (default each block's MLP input, ``blocks.{layer}.ln2.hook_normalized``) and the outputs
predict `output_hook` (``blocks.{layer}.hook_mlp_out``). Inference only: training lives in clt_train.py.
A saved CLT takes raw activations (training's scaling is folded into its weights), and a BatchTopK
CLT is saved as the JumpReLU it is at inference.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from circuitlab.atomic import atomic_dir, json_text
import circuitlab.dictionaries.clt_formats as clt_formats
from circuitlab.dictionaries.arch import get_architecture
from circuitlab.dictionaries.module import DictionaryModule, map_weights, read_own_folder, write_own_folder
from circuitlab.dictionaries.clt_config import CLT_ARCHITECTURES, CLT_FORMAT, CLTConfig  # noqa: F401 - re-exported
from circuitlab.errors import CircuitlabError
from circuitlab.model.storage import stored_matmul

if TYPE_CHECKING:
    from circuitlab.dictionaries.sae import SparseDictionary
    from circuitlab.model import Transformer

WEIGHTS_FILE, CONFIG_FILE = "clt.safetensors", "config.json"
from circuitlab.dictionaries.module import DTYPES as _DTYPES  # one table of config dtype names


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """Each feature's decoder, all its blocks together ([d_sae, T, d] -> norm over T and d), scaled to norm 1."""
    return t / t.flatten(1).norm(dim=-1).clamp(min=1e-12)[:, None, None]


class CrossLayerTranscoder(DictionaryModule):
    """Per layer l: W_enc[l] [d_model, d_sae], b_enc[l] [d_sae], W_dec[l] [d_sae, T_l, d_model] (T_l = L - l
    blocks for layers l..L-1; 1 when tied), b_dec[l] [d_model] (of output layer l), threshold[l] [d_sae]
    (when the architecture has one: JumpReLU, BatchTopK), W_skip[l] [d_model, d_model] (skip).

    Initialised the way training starts: each feature's decoder (all its blocks together) a random unit
    vector, each encoder column a random unit vector, zero biases.
    """

    def __init__(self, cfg: CLTConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        dtype = _DTYPES[cfg.dtype]
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        L, d, n = cfg.n_layers, cfg.d_model, cfg.d_sae

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64)

        enc = [randn(d, n) for _ in range(L)]
        self.W_enc = nn.ParameterList([(e / e.norm(dim=0, keepdim=True)).to(dtype) for e in enc])
        self.b_enc = nn.ParameterList([torch.zeros(n, dtype=dtype) for _ in range(L)])
        self.W_dec = nn.ParameterList([_unit_rows(randn(n, cfg.n_targets(l), d)).to(dtype) for l in range(L)])
        self.b_dec = nn.ParameterList([torch.zeros(d, dtype=dtype) for _ in range(L)])
        if cfg.arch.has_threshold:
            self.threshold = nn.ParameterList([torch.full((n,), 1e-3, dtype=dtype) for _ in range(L)])
            for t in self.threshold:
                t.requires_grad_(cfg.arch.learns_threshold)
        if cfg.skip:
            self.W_skip = nn.ParameterList([torch.zeros(d, d, dtype=dtype) for _ in range(L)])

    # ------------------------------------------------------------------ forward
    @property
    def device(self) -> torch.device:
        return self.W_enc[0].device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the CLT computes in (its compute dtype; the matrices may be stored in half precision)."""
        return self.compute_dtype

    def _check(self, x: torch.Tensor, layer: int) -> None:
        if not 0 <= layer < self.cfg.n_layers:
            raise CircuitlabError(f"layer {layer} is outside the CLT's {self.cfg.n_layers} layers")
        if x.shape[-1] != self.cfg.d_model:
            raise CircuitlabError(f"the input has width {x.shape[-1]} but the CLT expects d_model={self.cfg.d_model}")

    def pre_acts(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """x [..., d_model] (layer `layer`'s MLP input) -> pre-activations [..., d_sae]."""
        self._check(x, layer)
        self.check_mapped()
        return stored_matmul(x.to(self.dtype), self.W_enc[layer]) + self.b_enc[layer]

    def activate(self, pre: torch.Tensor, layer: int) -> torch.Tensor:
        """Inference activation [..., d_sae] (the architecture's; TopK: k per layer)."""
        return self.cfg.arch.activate(pre, self.cfg.k, self.latent_threshold(layer))

    def encode_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Layer `layer`'s MLP input x [..., d_model] -> its feature activations [..., d_sae]."""
        return self.activate(self.pre_acts(x, layer), layer)

    def encode(self, xs: torch.Tensor) -> torch.Tensor:
        """Every layer's MLP input xs [..., L, d_model] -> feature activations [..., L, d_sae]."""
        self._check_stack(xs)
        return torch.stack([self.encode_layer(xs[..., l, :], l) for l in range(self.cfg.n_layers)], dim=-2)

    def decoder(self, source: int, target: int) -> torch.Tensor:
        """W_dec^{source→target} [d_sae, d_model]: how layer `source`'s features write into layer `target`'s MLP output."""
        if not 0 <= source <= target < self.cfg.n_layers:
            raise CircuitlabError(f"a CLT decodes from layer {source} only to layers {source}..{self.cfg.n_layers - 1}, "
                                  f"not {target}")
        return self.W_dec[source][:, 0 if self.cfg.tied else target - source]

    def decode_layer(self, acts: torch.Tensor, source: int) -> torch.Tensor:
        """Layer `source`'s activations [..., d_sae] -> what they write into the MLP outputs of layers
        source..L-1 [..., L - source, d_model] (no bias, no skip)."""
        self.check_mapped()
        W = self.W_dec[source]
        out = stored_matmul(acts.to(self.dtype), W.flatten(1))                # [..., T * d_model]
        out = out.unflatten(-1, W.shape[1:])
        if self.cfg.tied:
            out = out.expand(*out.shape[:-2], self.cfg.n_layers - source, self.cfg.d_model)
        return out

    def decode(self, acts: torch.Tensor, xs: torch.Tensor | None = None) -> torch.Tensor:
        """acts [..., L, d_sae] -> every layer's MLP output [..., L, d_model]. A skip CLT also needs xs [..., L, d_model]."""
        L = self.cfg.n_layers
        parts = [self.decode_layer(acts[..., l, :], l) for l in range(L)]
        outs = []
        for t in range(L):
            y = self.b_dec[t] + sum(parts[s][..., t - s, :] for s in range(t + 1))
            if self.cfg.skip:
                if xs is None:
                    raise CircuitlabError("a skip CLT's decode needs its inputs too: decode(acts, xs)")
                y = y + stored_matmul(xs[..., t, :].to(self.dtype), self.W_skip[t])
            outs.append(y)
        return torch.stack(outs, dim=-2)

    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """xs [..., L, d_model] -> (every layer's predicted MLP output [..., L, d_model], acts [..., L, d_sae])."""
        acts = self.encode(xs)
        return self.decode(acts, xs), acts

    def _check_stack(self, xs: torch.Tensor) -> None:
        if xs.dim() < 2 or xs.shape[-2] != self.cfg.n_layers or xs.shape[-1] != self.cfg.d_model:
            raise CircuitlabError(f"a CLT takes every layer's input stacked [..., {self.cfg.n_layers}, {self.cfg.d_model}], "
                                  f"got {tuple(xs.shape)}")

    # ------------------------------------------------------------------ views
    def decoder_norms(self) -> torch.Tensor:
        """[L, d_sae]: the norm of each feature's whole decoder (all the layers it writes to together)."""
        return torch.stack([W.flatten(1).to(self.dtype).norm(dim=-1) for W in self.W_dec])

    def write_norms(self, layer: int) -> torch.Tensor:
        """[d_sae, L - layer]: how strongly each feature of `layer` writes into each layer from `layer` on."""
        norms = self.W_dec[layer].to(self.dtype).norm(dim=-1)
        return norms.expand(-1, self.cfg.n_layers - layer) if self.cfg.tied else norms

    @torch.no_grad()
    def residual_view(self, layer: int) -> SparseDictionary:
        """Layer `layer`'s features as a SparseDictionary: its encoder (threshold, k), and as decoder each
        feature's total direct write into the residual stream, Σ_{t ≥ layer} W_dec^{layer→t} [d_sae, d_model]
        (every MLP output adds into it). For dashboards and logit effects; metadata.clt_write_norms
        [d_sae][L - layer] says how strongly each feature writes into each layer from `layer` on."""
        from circuitlab.dictionaries.config import DictionaryConfig
        from circuitlab.dictionaries.sae import SparseDictionary

        c = self.cfg
        if not 0 <= layer < c.n_layers:
            raise CircuitlabError(f"layer {layer} is outside the CLT's {c.n_layers} layers")
        arch = get_architecture(c.arch.saved_as or c.architecture)  # BatchTopK as the JumpReLU it is
        meta = {"clt_layer": layer, "clt_n_layers": c.n_layers,
                "clt_write_norms": [[round(float(v), 5) for v in row] for row in self.write_norms(layer)]}
        cfg = DictionaryConfig(arch.name, d_in=c.d_model, d_sae=c.d_sae, k=c.k if arch.uses_k else None,
                               hook_name=c.in_hook(layer), out_hook_name=c.out_hook(layer), base_model=c.base_model,
                               dtype=c.dtype, metadata=meta)
        view = SparseDictionary(cfg).to(device=self.device, dtype=self.dtype)
        view.W_enc.copy_(self.W_enc[layer])
        view.b_enc.copy_(self.b_enc[layer])
        view.W_dec.copy_(self.decode_layer(torch.eye(c.d_sae, dtype=self.dtype, device=self.device), layer).sum(-2))
        view.b_dec.zero_()
        if arch.has_threshold:
            view.threshold.copy_(self.threshold[layer])
        return view

    @torch.no_grad()
    def folded(self, in_scales: list[float], out_scales: list[float]) -> "CrossLayerTranscoder":
        """A copy taking raw activations, from one trained on layer l's inputs times in_scales[l] and outputs
        times out_scales[l] (a tied CLT needs one out scale for all layers). Latents are unchanged."""
        L = self.cfg.n_layers
        if len(in_scales) != L or len(out_scales) != L:
            raise CircuitlabError(f"folded needs {L} input and output scales")
        if self.cfg.tied and len(set(out_scales)) > 1:
            raise CircuitlabError("a tied CLT shares each decoder across layers: it needs one output scale for all")
        norm = {**self.cfg.normalisation, "in_scales": [float(s) for s in in_scales],
                "out_scales": [float(s) for s in out_scales], "folded": True}
        new = self._copy_with(self.cfg.replace(normalisation=norm))
        out = torch.tensor(out_scales, dtype=torch.float64)
        for l in range(L):
            new.W_enc[l].mul_(in_scales[l])
            per_target = out[l:] if not self.cfg.tied else out[:1]
            new.W_dec[l].div_(per_target.to(new.dtype)[None, :, None])
            new.b_dec[l].div_(out_scales[l])
            if self.cfg.skip:
                new.W_skip[l].mul_(in_scales[l] / out_scales[l])
        return new

    def extra_repr(self) -> str:
        c = self.cfg
        k = f", k={c.k}" if c.k else ""
        return (f"{c.architecture} CLT: {c.n_layers} layers x d_sae={c.d_sae}{k}, d_model={c.d_model}"
                f"{', tied' if c.tied else ''}{', skip' if c.skip else ''}")

    # ------------------------------------------------------------------ disk
    def save(self, folder: str | Path, layout: str = "circuitlab") -> Path:
        """Write the CLT as a folder, whole or not at all: layout "circuitlab" (clt.safetensors + config.json),
        "circuit-tracer" or "sparsify" (see clt_formats)."""
        clt = self.for_inference()
        writers = {"circuitlab": _write_ours, "circuit-tracer": clt_formats.write_circuit_tracer,
                   "sparsify": clt_formats.write_sparsify}
        if layout not in writers:
            raise CircuitlabError(f"unknown CLT layout {layout!r}; use one of {', '.join(writers)}")
        clt_formats.check_layout_takes(clt, layout)
        folder = Path(folder)
        with atomic_dir(folder) as tmp:
            writers[layout](clt, tmp)
        return folder

    @classmethod
    def load(cls, folder: str | Path, device: str | torch.device = "cpu", mmap: bool = False) -> "CrossLayerTranscoder":
        """Load a CLT folder in any of the three layouts (found from its files). mmap: map our own layout's
        weights from its file, read when used (dictionaries/mapped.py)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise CircuitlabError(f"CLT folder not found: {folder}")
        if mmap and not (folder / WEIGHTS_FILE).is_file():
            raise CircuitlabError(f"{folder} is a published CLT layout, which is converted as it is read: only "
                                  f"circuitlab's own ({WEIGHTS_FILE}) can be memory-mapped; save it as ours once")
        if (folder / WEIGHTS_FILE).is_file():
            if mmap:
                map_weights(folder / WEIGHTS_FILE, device)  # the device check, before anything is read
            clt = _read_ours(folder, mmap)
        elif (folder / "W_enc_0.safetensors").is_file():
            clt = cls.from_tensors(*clt_formats.read_circuit_tracer(folder), str(folder))
        elif clt_formats.is_sparsify_clt(folder):
            clt = cls.from_tensors(*clt_formats.read_sparsify(folder), str(folder))
        else:
            raise CircuitlabError(f"{folder} holds no CLT (expected {WEIGHTS_FILE}, circuit-tracer's W_enc_0.safetensors, "
                                  "or sparsify's one folder per layer with cfg.json and sae.safetensors)")
        return clt.to(device)

    @classmethod
    def from_tensors(cls, cfg: CLTConfig, tensors: dict[str, torch.Tensor], where: str = "tensors") -> "CrossLayerTranscoder":
        """Build from a config and a state dict (names like W_dec.2), checking every shape against the config."""
        return cls(cfg)._load_checked(tensors, f"CLT {where} does not match its config ({cfg.n_layers} layers, "
                                      f"d_model={cfg.d_model}, d_sae={cfg.d_sae}{', tied' if cfg.tied else ''})")


def is_clt_folder(folder: str | Path) -> bool:
    """Whether a folder holds a CLT in one of the layouts CrossLayerTranscoder.load reads."""
    folder = Path(folder)
    if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
        return True
    return folder.is_dir() and ((folder / "W_enc_0.safetensors").is_file() or clt_formats.is_sparsify_clt(folder))


def _clt_config(data: dict) -> CLTConfig:
    if data.get("format") != CLT_FORMAT:
        raise CircuitlabError(f"its {CONFIG_FILE} is not a CLT's (format {data.get('format')!r})")
    return CLTConfig.from_dict(data)


def _write_ours(clt: CrossLayerTranscoder, folder: Path) -> None:
    write_own_folder(folder, clt.state_dict(), json_text(clt.cfg.to_dict(), indent=2), WEIGHTS_FILE, CONFIG_FILE)


def _read_ours(folder: Path, mmap: bool = False) -> CrossLayerTranscoder:
    mapped = map_weights(folder / WEIGHTS_FILE, "cpu") if mmap else None
    cfg, tensors = read_own_folder(folder, "CLT", WEIGHTS_FILE, CONFIG_FILE, _clt_config, mapped=mapped)
    if mapped is not None:
        return CrossLayerTranscoder._mapped_from(cfg, mapped, tensors, f"CLT {folder} does not match its config")
    return CrossLayerTranscoder.from_tensors(cfg, tensors, str(folder))


@torch.no_grad()
def bind_clt(clt: CrossLayerTranscoder, model: Transformer, where: str = "the CLT") -> CrossLayerTranscoder:
    """circuit-tracer's hook names resolved against the model, as published.bind does for a per-layer transcoder:
    mlp.hook_in (and, in a set named as TransformerLens names hooks, a LayerNorm's ln2.hook_normalized, which is
    after its gain and bias there) is read at blocks.L.ln2.hook_normalized with each layer's ln2 gain and bias
    folded into its encoder and skip (hook_resid_mid where blocks have no norm before the MLP); mlp.hook_out is
    hook_mlp_out where blocks have no post-MLP norm. Returns clt itself when nothing changes, else a bound copy."""
    cfg, blocks = clt.cfg, list(getattr(model, "blocks", []))
    site_in = cfg.input_hook.replace("blocks.{layer}.", "")
    site_out = cfg.output_hook.replace("blocks.{layer}.", "")
    norms = [getattr(b, "ln2", None) for b in blocks[:cfg.n_layers]]
    tl_ln = (site_in == "ln2.hook_normalized" and cfg.metadata.get("tl_hook_names")
             and all(getattr(n, "kind", None) == "layernorm" for n in norms))
    fold = site_in == "mlp.hook_in" or tl_ln
    changes: dict[str, str] = {}
    if fold:
        if any(n is None for n in norms):
            raise CircuitlabError(f"{where} reads the MLP's input after ln2, but the model's blocks have no ln2")
        gained = all(getattr(n, "w", None) is not None for n in norms)
        changes["input_hook"] = "blocks.{layer}.ln2.hook_normalized" if gained else "blocks.{layer}.hook_resid_mid"
    if site_out == "mlp.hook_out" and "blocks.0.mlp.hook_out" not in model.hook_points():
        changes["output_hook"] = "blocks.{layer}.hook_mlp_out"   # no post-MLP norm: the same output
    if not changes:
        return clt
    meta = {k: v for k, v in cfg.metadata.items() if k != "tl_hook_names"}
    out = copy.deepcopy(clt)
    out.cfg = cfg.replace(**changes, metadata={**meta, "read_as": cfg.input_hook} if fold else meta)
    if fold and changes["input_hook"].endswith("ln2.hook_normalized"):
        for layer, norm in enumerate(norms):   # (x̂·w + b) @ W = x̂ @ (diag(w) W) + b @ W, the same for the skip
            assert norm is not None  # folding reads ln2, which every such block has
            w, b = norm.w.to(out.dtype), getattr(norm, "b", None)
            if b is not None:
                out.b_enc[layer].add_(b.to(out.dtype) @ out.W_enc[layer])
                if cfg.skip:
                    out.b_dec[layer].add_(b.to(out.dtype) @ out.W_skip[layer])
            out.W_enc[layer].mul_(w[:, None])
            if cfg.skip:
                out.W_skip[layer].mul_(w[:, None])
    return out


def check_clt_fits(clt: CrossLayerTranscoder, model: Transformer, where: str = "the CLT") -> None:
    """Refuse a CLT made for another model: layer count, width, hooks, and (when recorded) the base model's identity."""
    from circuitlab.dictionaries.sae import check_base_model
    from circuitlab.model import hooks as H

    cfg, mcfg = clt.cfg, model.cfg
    if cfg.n_layers != mcfg.n_layers:
        raise CircuitlabError(f"{where} has {cfg.n_layers} layers but the model has {mcfg.n_layers}; a CLT needs one "
                              "encoder and one output per MLP layer")
    if cfg.d_model != mcfg.d_model:
        raise CircuitlabError(f"{where} reads width {cfg.d_model} but the model's d_model is {mcfg.d_model}: "
                              "was it made for another model?")
    points = H.hook_points(model)
    for name in (cfg.in_hook(0), cfg.out_hook(0)):
        H.resolve(points, name)
    check_base_model(clt, model, where)
