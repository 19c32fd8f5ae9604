"""GGUF import: each tiny GGUF file of tests/pretrained/gguf_files.py (every family x F32, F16, Q8_0, Q4_0,
Q4_1) imported into circuitlab's Transformer gives transformers' own GGUF-loaded model's logits and every
layer's residual stream (<= 1e-4, float32); its weights are gguf's dequantization of the file's tensors
(the model a Hugging Face checkpoint holding those dequantized weights imports to, tensor for tensor); and
an export of it loads in transformers with the same logits.

Every family is imported in F32 and in one quantized type (test_gguf_files.FAST_QUANT); the rest of the
matrix is marked slow.

"""
import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

import gguf  # noqa: F401 - a dev dependency: a missing one fails, never skips
import transformers  # noqa: F401

from circuitlab.pretrained import export_hf, load_pretrained  # noqa: E402
from circuitlab.pretrained.gguf import load_gguf  # noqa: E402
from pretrained.gguf_files import FAMILIES, VOCAB, hf_name, hf_weight, vocab  # noqa: E402
from pretrained.test_gguf_files import FAST_QUANT, MATRIX, load_hf  # noqa: E402
from pretrained.test_importer import assert_residual_streams_match  # noqa: E402

TOL = 1e-4
PROMPT = 14  # longer than the Gemma files' sliding window (4), so the window matters

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-import")


def imported(folder, family: str, quant: str, cache: dict = {}):  # noqa: B006 (one import per file per session)
    """(transformers' model, ours, our GgufInfo, the file) for FAMILIES[family] in quant, memoised."""
    key = (str(folder), family, quant)
    if key not in cache:
        hf, path = load_hf(folder, family, quant)
        model, _, info = load_gguf(path, tokenizer=False)
        cache[key] = (hf, model, info, path)
    return cache[key]


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(seed))


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(input_ids=ids).logits


@pytest.mark.parametrize("family, quant", MATRIX)
def test_logits_and_every_residual_stream_match_transformers(folder, family, quant):
    hf, model, _, _ = imported(folder, family, quant)
    ids = prompt()
    theirs = hf_logits(hf, ids)
    assert theirs.std() > 0.5, "test weights too small to catch a wrong mapping"
    assert (model(ids) - theirs).abs().max() <= TOL
    assert_residual_streams_match(hf, model, ids, TOL)


def reference_import(hf, family: str, path, out) -> "torch.nn.Module":
    """circuitlab's import of a Hugging Face checkpoint whose weights are gguf.quants.dequantize of the
    file's tensors, put in HF's layout by gguf_files.hf_weight (not by transformers' GGUF loader)."""
    state = {}
    for tensor in gguf.GGUFReader(path).tensors:
        raw = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        state[hf_name(family, tensor.name)] = torch.from_numpy(np.array(hf_weight(family, tensor.name, raw)))
    plain = type(hf)(hf.config)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == ({"lm_head.weight"} if FAMILIES[family].tied else set())
    plain.save_pretrained(out)
    return load_pretrained(out, tokenizer=False)[0]


@pytest.mark.parametrize("family, quant", MATRIX)
def test_weights_are_ggufs_dequantization(folder, family, quant, tmp_path):
    hf, model, info, path = imported(folder, family, quant)
    reference = reference_import(hf, family, path, tmp_path / "hf")
    assert dataclasses.replace(model.cfg, name=reference.cfg.name) == reference.cfg
    ours = model.state_dict()
    assert list(ours) == list(reference.state_dict())
    for name, p in reference.state_dict().items():
        assert torch.equal(ours[name], p), name
    embedding = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    assert torch.equal(model.embed.weight, torch.from_numpy(np.array(gguf.quants.dequantize(embedding.data,
                                                                                      embedding.tensor_type))))
    written = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    assert info.quantization == dict(written) and info.architecture == FAMILIES[family].arch
    assert info.name == FAMILIES[family].name


def test_load_pretrained_opens_a_gguf_with_its_tokenizer(folder):
    hf, reference, _, path = imported(folder, "llama", "Q4_1")
    model, tokenizer = load_pretrained(path)
    ids = prompt(3)
    assert torch.equal(model(ids), reference(ids))
    names = vocab("llama").tokens()
    assert [names[i] for i in tokenizer.encode(" the cat", add_special_tokens=False)] == ["Ġthe", "Ġcat"]
    assert tokenizer.eos_token_id == vocab("llama").eos


def test_storage_dtype_is_the_dequantized_float32_rounded(folder):
    _, reference, _, path = imported(folder, "qwen2", FAST_QUANT["qwen2"])
    half, _, _ = load_gguf(path, dtype="bfloat16", tokenizer=False)
    assert {p.dtype for p in half.parameters() if p.dim() >= 2} == {torch.bfloat16}
    for name, p in half.state_dict().items():
        assert torch.equal(p, reference.state_dict()[name].to(p.dtype)), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_of_an_imported_gguf_loads_in_transformers_with_its_logits(folder, family, tmp_path):
    hf, model, _, _ = imported(folder, family, FAST_QUANT[family])
    style = "phi3" if FAMILIES[family].arch == "phi3" else None
    out = export_hf(model, tmp_path / "hf", style=style)
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = prompt(2)
    assert (hf_logits(back, ids) - model(ids)).abs().max() <= TOL
    assert (hf_logits(back, ids) - hf_logits(hf, ids)).abs().max() <= TOL
