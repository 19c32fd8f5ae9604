"""DictionaryModule: what a SparseDictionary and a CrossLayerTranscoder share — a copy of itself under another
config (same weights), the form it is used in at inference (BatchTopK becomes the JumpReLU it is), and our
folder layout (weights.safetensors with the config in its header and its hash, beside config.json)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from circuitlab.atomic import atomic_write_file, atomic_write_text
from circuitlab.dictionaries.arch import get_architecture
from circuitlab.dictionaries.mapped import MappedSafetensors
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.model.storage import cast_parameters, compute_of, resolve_dtypes
from circuitlab.textfile import read_text

if TYPE_CHECKING:
    from typing_extensions import Self

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DictionaryModule(nn.Module):
    """Base of the dictionary modules: subclasses are built as `cls(cfg)` and have `cfg` with `architecture`,
    `arch`, `k`, `metadata` and `replace(...)`."""

    cfg: Any
    threshold: Any   # when the architecture has one: [d_sae] (an SAE's), one per layer (a CLT's)
    _compute_dtype: torch.dtype | None = None  # None: the parameters' own dtype (set_dtypes stores them apart)
    _mapped: MappedSafetensors | None = None   # the file its matrices are mapped from (load(..., mmap=True))

    def check_mapped(self) -> None:
        """Before a use of memory-mapped weights: one CircuitlabError if their file changed since it was mapped."""
        if self._mapped is not None:
            self._mapped.check()

    @classmethod
    def _mapped_from(cls, cfg: Any, mapped: MappedSafetensors, tensors: dict[str, torch.Tensor], what: str) -> Self:
        """A module of cls under cfg whose parameters are `tensors` themselves (the mapped pages: no init, no
        copy), after the same shape check as _load_checked; vectors are then held in the compute dtype."""
        with torch.device("meta"):
            new = cls(cfg)
        expected = {k: tuple(v.shape) for k, v in new.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if expected != got:
            diff = sorted(set(expected.items()) ^ set(got.items()))
            raise CircuitlabError(f"{what}: {diff[:4]}")
        new.load_state_dict(tensors, assign=True)
        new._mapped = mapped
        return new.set_dtypes()

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype encode / decode compute in (inputs are cast to it; half-precision matrices upcast per use)."""
        return compute_of(self.storage_dtype, self._compute_dtype)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype the matrices (W_enc, W_dec, ...) are held in."""
        return max((p for p in self.parameters()), key=lambda p: p.numel()).dtype

    def set_dtypes(self, storage: str | torch.dtype | None = None, compute: str | torch.dtype | None = None) -> Self:
        """Hold the matrices in `storage` (default: as they are) and compute in `compute` (default: float32 on a
        CPU for half-precision storage, the storage dtype on a GPU); vectors (biases, thresholds) are held in the
        compute dtype. In place; an unknown dtype or one the device cannot compute in is one InputError, raised
        before anything changes. Returns self."""
        like = next(self.parameters())
        s, c = resolve_dtypes(storage if storage is not None else self.storage_dtype, compute, like.device)
        cast_parameters(self, s, c)
        self._compute_dtype = None if c == s else c
        return self

    def for_inference(self) -> Self:
        """The form it is saved and used in (Architecture.saved_as): BatchTopK (and Matryoshka BatchTopK) becomes
        the JumpReLU it is at inference (same weights, its running threshold); others unchanged. What it was
        trained as (its k, its Matryoshka widths) is kept in metadata."""
        arch = self.cfg.arch
        if arch.saved_as is None:
            return self
        meta = {**self.cfg.metadata, "trained_as": arch.name, "k": self.cfg.k}
        changes: dict[str, Any] = {"k": self.cfg.k if get_architecture(arch.saved_as).uses_k else None}
        if getattr(self.cfg, "matryoshka_widths", None) is not None:  # a training setting: kept as a record
            meta["matryoshka_widths"], changes["matryoshka_widths"] = self.cfg.matryoshka_widths, None
        return self._copy_with(self.cfg.replace(architecture=arch.saved_as, metadata=meta, **changes))

    def latent_threshold(self, layer: int | None = None) -> torch.Tensor | None:
        """The threshold [d_sae] the architecture activates with (a CLT's: of `layer`), or None when it has none."""
        if not self.cfg.arch.has_threshold:
            return None
        return self.threshold if layer is None else self.threshold[layer]

    def _copy_with(self, cfg: Any) -> Self:
        """A new module of the same class under `cfg`, with this one's weights, device and dtype."""
        new = type(self)(cfg)
        # assign: each tensor keeps its own dtype and device (half-precision matrices beside float32 vectors)
        new.load_state_dict({k: v.clone() for k, v in self.state_dict().items()}, assign=True)
        new._compute_dtype = self._compute_dtype
        return new

    def _load_checked(self, tensors: dict[str, torch.Tensor], what: str) -> Self:
        """Load a state dict after checking every shape against this module's (built from its config); `what`
        names the file and the config in the one-line error. Returns self."""
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if expected != got:
            diff = sorted(set(expected.items()) ^ set(got.items()))
            raise CircuitlabError(f"{what}: {diff[:4]}")
        self.load_state_dict({k: v.to(DTYPES[self.cfg.dtype]) for k, v in tensors.items()})
        return self


def map_weights(file: Path, device: str | torch.device) -> MappedSafetensors:
    """The weights file mapped (MappedSafetensors), or one InputError off the CPU (a GPU reads into its memory)."""
    if torch.device(device).type != "cpu":
        raise InputError(f"memory-mapped dictionaries are for the CPU, not {device}; load without mmap")
    return MappedSafetensors(file)


def write_own_folder(folder: Path, tensors: dict[str, torch.Tensor], cfg_json: str, weights_file: str,
                     config_file: str) -> None:
    """Our layout: the weights (the config and its SHA-256 in the safetensors header, so a config.json from
    another save is caught on load) and config.json, each written atomically."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    header = {"config": cfg_json, "config_sha256": hashlib.sha256(cfg_json.encode()).hexdigest()}
    atomic_write_file(folder / weights_file, lambda tmp: save_file(tensors, tmp, metadata=header))
    atomic_write_text(folder / config_file, cfg_json)


def read_own_folder(folder: Path, what: str, weights_file: str, config_file: str, parse: Callable[[dict], Any],
                    device: str | torch.device = "cpu", mapped: MappedSafetensors | None = None
                    ) -> tuple[Any, dict[str, torch.Tensor]]:
    """(config, tensors) of a folder written by write_own_folder; `what` ("dictionary", "CLT") names it in the
    one-line errors: a missing file, a bad config (parse raises CircuitlabError), a corrupt or truncated file, a
    config.json that is not the one saved with the weights. mapped: the weights file already mapped (the tensors
    are then its pages, not read)."""
    if not (folder / config_file).is_file():
        raise CircuitlabError(f"{what} {folder} is incomplete: {config_file} is missing")
    try:
        cfg_json = read_text(folder / config_file, f"{what} config")  # names the byte if not UTF-8
        if mapped is not None:
            header, tensors = mapped.metadata, mapped.tensors()
        else:
            with safe_open(str(folder / weights_file), framework="pt", device=str(device)) as f:
                header = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        cfg = parse(json.loads(cfg_json))
    except CircuitlabError as e:
        raise CircuitlabError(f"{what} {folder} has a bad config: {e}") from None
    except FileNotFoundError as e:
        raise CircuitlabError(f"{what} {folder} is incomplete: {Path(e.filename).name} is missing") from None
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file is the user's to replace
        raise CircuitlabError(f"{what} {folder} is corrupt or truncated ({type(e).__name__}: {e})") from None
    if header.get("config_sha256") != hashlib.sha256(cfg_json.encode()).hexdigest():
        raise CircuitlabError(f"{what} {folder}: {config_file} does not match {weights_file} "
                              "(an interrupted save?); save it again")
    return cfg, tensors
