"""SparseDictionary: a sparse autoencoder or transcoder as a plain torch module.

    sae = SparseDictionary(DictionaryConfig("topk", d_in=128, d_sae=1024, k=32, hook_name=...))
    acts = sae.encode(x)            # [..., d_in] -> [..., d_sae], non-negative, sparse
    x_hat = sae.decode(acts)        # [..., d_sae] -> [..., d_out]
    x_hat, acts = sae(x)
    sae.save("dicts/l0"); sae = SparseDictionary.load("dicts/l0")

Inference only: the training-time activations (batch top-k, the JumpReLU straight-through
estimator, auxiliary losses) live in arch/ and objectives.py. A saved dictionary takes raw
activations: any input scaling used in training is folded into its weights (`folded`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from circuitlab.atomic import json_text
from circuitlab.dictionaries.config import DictionaryConfig
from circuitlab.dictionaries.module import DictionaryModule, map_weights, read_own_folder, write_own_folder
from circuitlab.errors import CircuitlabError
from circuitlab.model.storage import stored_matmul

if TYPE_CHECKING:
    from circuitlab.model import Transformer

WEIGHTS_FILE, CONFIG_FILE = "dictionary.safetensors", "config.json"
from circuitlab.dictionaries.module import DTYPES as _DTYPES  # one table of config dtype names

# The reader of every layout SparseDictionary.load accepts: dictionaries/published/'s load_dictionary, which
# registers itself here when the package is imported (its __init__ imports published/). So this module,
# which every layout reader imports, imports none of them: no import circle.
LOAD_ANY: list[Callable[..., Any]] = []


class SparseDictionary(DictionaryModule):
    """W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out]
    (+ threshold [d_sae] when the architecture has one (JumpReLU, BatchTopK), W_skip [d_in, d_out] for a skip
    transcoder).

    Initialised the way training starts: unit-norm random decoder rows, W_enc = W_dec^T, zero biases.
    """

    def __init__(self, cfg: DictionaryConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        dtype = _DTYPES[cfg.dtype]
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        d_out = cfg.d_out
        assert d_out is not None  # DictionaryConfig.__post_init__ sets it (d_in by default)
        W_dec = torch.randn(cfg.d_sae, d_out, generator=gen, dtype=torch.float64)
        W_dec = (W_dec / W_dec.norm(dim=-1, keepdim=True)).to(dtype)
        self.W_dec = nn.Parameter(W_dec)
        W_enc = W_dec.T.clone() if cfg.d_in == cfg.d_out else torch.randn(cfg.d_in, cfg.d_sae, generator=gen).to(dtype) / cfg.d_in**0.5
        self.W_enc = nn.Parameter(W_enc.contiguous())
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype))
        if cfg.arch.has_threshold:
            # JumpReLU learns it; BatchTopK estimates it in training and uses it at inference.
            self.threshold = nn.Parameter(torch.full((cfg.d_sae,), 1e-3, dtype=dtype),
                                          requires_grad=cfg.arch.learns_threshold)
        if cfg.skip:
            self.W_skip = nn.Parameter(torch.zeros(cfg.d_in, d_out, dtype=dtype))

    # ------------------------------------------------------------------ forward
    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] -> encoder pre-activations [..., d_sae]."""
        self._check_width(x, self.cfg.d_in, "input")
        self.check_mapped()
        x = x.to(self.compute_dtype)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return stored_matmul(x, self.W_enc) + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """Inference activation of pre-activations [..., d_sae] (the architecture's: ReLU, TopK, JumpReLU, ...)."""
        return self.cfg.arch.activate(pre, self.cfg.k, self.latent_threshold())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_in] -> latent activations [..., d_sae] (non-negative, sparse)."""
        return self.activate(self.pre_acts(x))

    def decode(self, acts: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """acts [..., d_sae] -> reconstruction [..., d_out]. A skip transcoder also needs its input x [..., d_in]."""
        self.check_mapped()
        out = stored_matmul(acts.to(self.compute_dtype), self.W_dec) + self.b_dec
        if self.cfg.skip:
            if x is None:
                raise CircuitlabError("a skip transcoder's decode needs its input x too: decode(acts, x)")
            out = out + stored_matmul(x.to(self.compute_dtype), self.W_skip)
        return out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., d_in] -> (reconstruction [..., d_out], acts [..., d_sae])."""
        acts = self.encode(x)
        return self.decode(acts, x), acts

    def _check_width(self, x: torch.Tensor, want: int, what: str) -> None:
        if x.shape[-1] != want:
            raise CircuitlabError(f"{what} has width {x.shape[-1]} but the dictionary for "
                                  f"{self.cfg.hook_name or 'its hook'} expects d_in={want}")

    # ------------------------------------------------------------------ views
    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def decoder_norms(self) -> torch.Tensor:
        """[d_sae] norm of each decoder row (feature direction)."""
        return self.W_dec.to(self.compute_dtype).norm(dim=-1)

    @torch.no_grad()
    def folded(self, in_scale: float, out_scale: float | None = None) -> "SparseDictionary":
        """A copy taking raw inputs, from one trained on inputs scaled by in_scale (outputs by out_scale).

        The latents are unchanged (so the threshold is), and the copy's output is the raw-scale
        reconstruction: folded(s)(x) == self(x * s) / s for an SAE.
        """
        out_scale = in_scale if out_scale is None else out_scale
        norm = {**self.cfg.normalisation, "in_scale": float(in_scale), "out_scale": float(out_scale), "folded": True}
        new = self._copy_with(self.cfg.replace(normalisation=norm))
        new.W_enc.mul_(in_scale)
        new.W_dec.div_(out_scale)
        new.b_dec.div_(out_scale)
        if self.cfg.skip:
            new.W_skip.mul_(in_scale / out_scale)
        return new

    # ------------------------------------------------------------------ disk
    def save(self, folder: str | Path) -> Path:
        """Write dictionary.safetensors (the config in its header too) and config.json, each atomically.

        A BatchTopK dictionary is saved as the JumpReLU it is at inference.
        """
        sae = self.for_inference()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_own_folder(folder, sae.state_dict(), json_text(sae.cfg.to_dict(), indent=2), WEIGHTS_FILE, CONFIG_FILE)
        return folder

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", model: Transformer | None = None,
             dtype: str | torch.dtype | None = None, compute_dtype: str | torch.dtype | None = None,
             mmap: bool = False) -> "SparseDictionary":
        """Load a folder written by save(), or a published layout (the folder or its file): SAELens, Gemma
        Scope 1 and 2, Llama Scope, one layer of a circuit-tracer set (see dictionaries/published/).

        model: check the dictionary against it (base model, hooks, widths) and bind the reading points
        that need it (a published transcoder reading the MLP input after ln2's gain).
        dtype / compute_dtype: hold the matrices in dtype, compute in compute_dtype (set_dtypes). mmap: map our
        own folder's weights from its file, read when used (load_own)."""
        return LOAD_ANY[0](path, device=device, model=model, dtype=dtype, compute_dtype=compute_dtype, mmap=mmap)

    @classmethod
    def load_own(cls, folder: str | Path, device: str | torch.device = "cpu", mmap: bool = False
                 ) -> "SparseDictionary":
        """Load a folder written by save() (dictionary.safetensors + config.json). mmap: map the weights from
        the file instead of reading them (CPU; held in the file's dtype, read when used; dictionaries/mapped.py)."""
        folder = Path(folder)
        if not (folder / WEIGHTS_FILE).is_file():
            raise CircuitlabError(f"{folder} holds no dictionary (expected {WEIGHTS_FILE} and {CONFIG_FILE})")
        mapped = map_weights(folder / WEIGHTS_FILE, device) if mmap else None
        cfg, tensors = read_own_folder(folder, "dictionary", WEIGHTS_FILE, CONFIG_FILE, DictionaryConfig.from_dict,
                                       device, mapped)
        if mapped is not None:
            return cls._mapped_from(cfg, mapped, tensors, f"dictionary {folder} does not match its config "
                                    f"(d_in={cfg.d_in}, d_sae={cfg.d_sae})")
        return cls.from_tensors(cfg, tensors, str(folder)).to(device)

    @classmethod
    def from_tensors(cls, cfg: DictionaryConfig, tensors: dict[str, torch.Tensor], where: str = "tensors"
                     ) -> "SparseDictionary":
        """Build from a config and a state dict, checking every shape against the config."""
        return cls(cfg)._load_checked(tensors, f"dictionary {where} does not match its config "
                                      f"(d_in={cfg.d_in}, d_sae={cfg.d_sae})")

    def extra_repr(self) -> str:
        c = self.cfg
        kind = "transcoder" if c.is_transcoder else "SAE"
        k = f", k={c.k}" if c.k else ""
        return f"{c.architecture} {kind} {c.hook_name}: d_in={c.d_in}, d_sae={c.d_sae}{k}"


# ---------------------------------------------------------------------------- base model identity

def base_model_id(model: Transformer, name: str | None = None) -> dict[str, Any]:
    """What identifies a model for a dictionary: its config's hash and a hash of its embedding.

    Two checkpoints of the same architecture trained differently get different ids.
    """
    cfg = model.cfg.to_dict()
    emb = model.embed.weight.detach().flatten()[:4096].double().cpu()
    weights = hashlib.sha256(torch.round(emb * 1e4).to(torch.int64).numpy().tobytes()).hexdigest()[:16]
    config = hashlib.sha256(json_text(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]
    out = {"config_sha": config, "weights_sha": weights, "d_model": cfg["d_model"], "n_layers": cfg["n_layers"]}
    if name:
        out["name"] = str(name)
    return out


def check_base_model(sae: DictionaryModule, model: Transformer, where: str = "the dictionary") -> None:
    """Raise if the dictionary records a base model other than `model` (a missing record passes)."""
    names = model.hook_points() if hasattr(model, "hook_points") else {}
    for hook in (sae.cfg.hook_name, sae.cfg.out_hook_name or ""):
        # mlp.hook_out is a hook of ours under a post-MLP norm; a CLT names a template ({layer})
        if hook.endswith(("mlp.hook_in", "mlp.hook_out")) and hook.replace("{layer}", "0") not in names:
            raise CircuitlabError(f"{where} reads or writes {hook}, which becomes a hook of this model only when "
                                  "bound to it: load it with the model, SparseDictionary.load(path, model=model)")
    rec = sae.cfg.base_model or {}
    if not rec.get("config_sha"):
        return
    now = base_model_id(model)
    if (rec.get("config_sha"), rec.get("weights_sha")) != (now["config_sha"], now["weights_sha"]):
        name = rec.get("name", "another model")
        same_shape = (rec.get("d_model"), rec.get("n_layers")) == (now["d_model"], now["n_layers"])
        if rec.get("config_sha") != now["config_sha"]:   # say what differs: a name and shape can be shared
            what = ("its configuration differs (same d_model and layers, another setting)" if same_shape else
                    f"this one has d_model {now['d_model']} and {now['n_layers']} layers")
        else:
            what = (f"the same configuration with other weights (embedding hash {rec.get('weights_sha')} recorded, "
                    f"{now['weights_sha']} here): another training run or checkpoint")
        raise CircuitlabError(f"{where} was trained on {name} (d_model {rec.get('d_model')}, {rec.get('n_layers')} "
                              f"layers), not on this model: {what}; use the model it was trained on")
