"""Open a GGUF file (llama.cpp's, Ollama's and LM Studio's format) as circuitlab's Transformer.

    model, tokenizer, info = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    info.quantization        # {"Q4_1": 210, "F32": 61, "Q8_0": 1}: tensors per storage type

The file is read by the well-kept libraries, not by a parser of ours: `transformers`' GGUF loader reads the
metadata into a Hugging Face config.json (a dict) and each tensor, dequantized by the `gguf` package, under its
Hugging Face name and layout (e.g. LLaMA's q/k rows un-permuted). From there it is the same family mapping as a
Hugging Face checkpoint (assemble.py). The analysed model is the dequantized one: the function llama.cpp
computes, up to its kernels' rounding.

Memory: one tensor is dequantized (to float32) at a time and dropped once it is in our model, so the peak is the
model in its storage dtype, the file's memory map and one float32 tensor (docs/pretrained.md gives SmolLM2's).
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from circuitlab.errors import CircuitlabError
from circuitlab.pretrained.catalog import family_for, model_config_from_hf, supported
from circuitlab.pretrained.assemble import assemble
from circuitlab.pretrained.options import ImportOptions
from circuitlab.pretrained.source import LoadedTensor
from circuitlab.model.loading import TensorReader

MAGIC = b"GGUF"  # every GGUF file's first four bytes
_PLAIN_TYPES = ("F32", "F16", "BF16", "F64")  # stored as numbers: nothing to dequantize


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says of itself, recorded in the imported checkpoint (config.json's source.gguf)."""

    file: str                     # the file's resolved path
    architecture: str             # general.architecture (llama.cpp's name: "llama", "qwen2", "gemma2", ...)
    name: str | None              # general.name, when the file has one
    quantization: dict[str, int]  # storage type -> number of tensors stored in it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_gguf_path(name_or_path: str | os.PathLike) -> bool:
    """True for a path ending in .gguf (existing or not: a missing one is then refused by name)."""
    return str(name_or_path).lower().endswith(".gguf")


def load_gguf(path: str | os.PathLike, dtype: str | torch.dtype = ImportOptions.dtype, *,
              compute_dtype: str | torch.dtype | None = None, n_ctx: int | None = None,
              tokenizer: bool = ImportOptions.tokenizer, device: str | torch.device = "cpu",
              name: str | None = None):
    """A GGUF file as (Transformer in eval mode, transformers tokenizer or None, GgufInfo).

    dtype: storage dtype of the weight matrices (the dequantized float32 values converted while copying);
    compute_dtype, n_ctx, device: as load_pretrained. tokenizer: build the tokenizer from the file's metadata
    (transformers reads tokenizer.ggml.*); a file without it is refused unless tokenizer=False.
    name: the model's display name (default: the file's name).
    Every check (the magic, a truncated file, the architecture, each storage type, the tokenizer metadata)
    runs before a weight is dequantized.
    """
    path = _existing(path)
    reader = _reader(path)
    info = inspect_gguf(path, reader, need_tokenizer=tokenizer)
    hf = _hf_config(path, info)
    family = family_for(hf)
    cfg = model_config_from_hf(hf, n_ctx).replace(name=name or path.name)
    tensors = _dequantized(reader, hf, info)
    model = assemble(cfg, family, hf, tensors, dtype=dtype, device=device, compute_dtype=compute_dtype)
    return model, (load_gguf_tokenizer(path) if tokenizer else None), info


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CircuitlabError(f"GGUF file not found: {path}" if not path.exists()
                              else f"{path} is not a file; give the .gguf file itself")
    with path.open("rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC:
        raise CircuitlabError(f"{path} is not a GGUF file: it starts with {head!r}, a GGUF file with {MAGIC!r}")
    return path.resolve()


def inspect_gguf(path: Path, reader=None, need_tokenizer: bool = False) -> GgufInfo:
    """Read the header and tensor table (memory-mapped, nothing dequantized) and refuse, in one line, a file
    the import could not finish: truncated, an architecture outside the catalogue, a storage type the `gguf`
    package cannot dequantize, no tokenizer metadata when a tokenizer is wanted."""
    reader = reader if reader is not None else _reader(path)
    architecture = _field(reader, "general.architecture") or "?"
    counts = Counter(t.tensor_type.name for t in reader.tensors)
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise CircuitlabError(f"{path} is truncated: its tensors end at byte {end:,}, the file at "
                              f"{path.stat().st_size:,}; download it again")
    checked = set(_PLAIN_TYPES)
    for tensor in reader.tensors:  # one block of each storage type, through the library that dequantizes
        if tensor.tensor_type.name not in checked:
            _check_dequantizable(path, tensor)
            checked.add(tensor.tensor_type.name)
    if need_tokenizer and "tokenizer.ggml.tokens" not in reader.fields:
        raise CircuitlabError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens in its metadata); import the "
                              "weights alone with --no-tokenizer (tokenizer=False in Python)")
    return GgufInfo(file=str(path), architecture=architecture, name=_field(reader, "general.name"),
                    quantization=dict(counts.most_common()))


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CircuitlabError("reading a GGUF file needs the gguf package (pip install gguf, or make setup)") from None
    try:
        return GGUFReader(str(path))
    except (ValueError, IndexError, OSError) as e:  # a short read shows up as a reshape or an index error
        raise CircuitlabError(f"{path} cannot be read as GGUF ({type(e).__name__}: {str(e)[:120]}); the file is "
                              "probably truncated or damaged: download it again") from None


def _field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) else str(value)


def _check_dequantizable(path: Path, tensor) -> None:
    from gguf import dequantize

    try:
        dequantize(tensor.data[:1], tensor.tensor_type)
    except (NotImplementedError, ValueError, KeyError) as e:
        raise CircuitlabError(f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the "
                              f"gguf package cannot dequantize ({type(e).__name__}); re-quantize the model to a "
                              "supported type (e.g. Q8_0, Q4_K) or upgrade gguf") from None


def _hf_config(path: Path, info: GgufInfo) -> dict[str, Any]:
    """The file's metadata as a Hugging Face config.json dict (transformers' GGUF mapping), in the catalogue."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        hf = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    except ValueError as e:  # "GGUF model with architecture X is not supported yet."
        raise CircuitlabError(f"{path}: architecture {info.architecture!r} is not one transformers' GGUF loader "
                              f"reads ({e}); circuitlab imports GGUF files of {supported()}") from None
    try:
        family_for(hf)
    except CircuitlabError:
        raise CircuitlabError(f"{path}: architecture {info.architecture!r} (read as model_type "
                              f"{hf.get('model_type')!r}) is outside circuitlab's catalogue, which reads "
                              f"{supported()}") from None
    hf.pop("_model_name_or_path", None)
    # The config class fills in what no GGUF key sets (Gemma's soft-cap and query scale, GPT-2's activation, ...)
    # exactly as transformers' own GGUF-loaded model gets it; our family mapping then reads the whole config.
    from transformers import AutoConfig

    fields = {k: v for k, v in hf.items() if k != "model_type"}
    return {**AutoConfig.for_model(hf["model_type"], **fields).to_dict(), "model_type": hf["model_type"]}


def _dequantized(reader, hf: dict[str, Any], info: GgufInfo) -> Iterator[tuple[str, TensorReader]]:
    """(Hugging Face name, reader) for every tensor, dequantized one at a time and dropped once placed.

    The steps are transformers' own (load_gguf_checkpoint's): its name map, read off a model built on the meta
    device (no memory, no init), its per-architecture tensor processor (e.g. LLaMA's q/k rows un-permuted), and
    the gguf package's dequantize; only the loop is ours, so that one float32 tensor is held at a time.
    """
    from gguf import dequantize
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                         get_gguf_hf_weights_map)

    fields = {k: v for k, v in hf.items() if k not in ("model_type", "transformers_version")}
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf["model_type"], **fields))
    processor = TENSOR_PROCESSORS.get(info.architecture, TensorProcessor)(config=hf)
    names = get_gguf_hf_weights_map(skeleton, processor, model_type=info.architecture)  # llama.cpp's name, not a
    # model_type transformers re-derived from general.name (a llama file named "mistral" has no "mistral" table)
    parsed: dict[str, Any] = {"config": hf, "tensors": {}}  # where a processor puts tensors it builds itself
    for tensor in tqdm(reader.tensors, desc="dequantizing", unit="tensor", leave=False):
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name in names:
            yield names[result.name], LoadedTensor(torch.from_numpy(np.array(result.weights, dtype=np.float32)))
        for key in list(parsed["tensors"]):
            yield key, LoadedTensor(parsed["tensors"].pop(key).float())


def load_gguf_tokenizer(path: str | os.PathLike):
    """The transformers tokenizer a GGUF file's metadata describes (tokenizer.ggml.*)."""
    from transformers import AutoTokenizer

    path = Path(path)
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 - any failure is the file's metadata: say so in one line
        raise CircuitlabError(f"the tokenizer in {path} could not be built ({type(e).__name__}: {str(e)[:120]}); "
                              "import the weights alone with --no-tokenizer") from None
