"""The tiny GGUF files of tests/pretrained/gguf_files.py, read by transformers' own GGUF loader.

Every family loads with the config it was written with and runs; the weights transformers loads are
`gguf.quants.dequantize` of each tensor put in HF's layout (llama's Q/K row order, Gemma's 1 + w norm
gains, GPT-2's Conv1D transposes). That is what circuitlab's GGUF importer must reproduce
(tests/pretrained/test_gguf_import.py). Every family is read in F32 and in one quantized type here;
the rest of the family x type matrix is marked slow.
"""
import numpy as np
import pytest
import torch

import gguf  # a dev dependency: a missing one fails, never skips
import transformers

from pretrained.gguf_files import (FAMILIES, QUANTS, VOCAB, corrupt, hf_name, hf_weight, random_weights,  # noqa: E402
                                   vocab, write_gguf)

# each family in one quantized type, so that every type is read by more than one family in the fast tests
FAST_QUANT = {"llama": "Q4_0", "mistral": "Q4_1", "qwen2": "Q8_0", "qwen3": "Q4_1", "gemma2": "Q4_0",
              "gemma3": "Q8_0", "phi3": "Q4_1", "gpt2": "F16", "gpt2-tied": "Q4_0"}
FAST = [(f, "F32") for f in FAMILIES] + list(FAST_QUANT.items())
SLOW = [(f, q) for f in FAMILIES for q in QUANTS if (f, q) not in FAST]
MATRIX = [pytest.param(f, q, id=f"{f}-{q}") for f, q in FAST] + \
         [pytest.param(f, q, id=f"{f}-{q}", marks=pytest.mark.slow) for f, q in SLOW]
CLASSES = {"llama": "LlamaForCausalLM", "mistral": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
           "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt2-tied": "GPT2LMHeadModel"}
# relative error ||dequantize(quantize(w)) - w|| / ||w|| each type stays under (and above 0: it is quantized)
PRECISION = {"F32": 0.0, "F16": 1e-3, "Q8_0": 1e-2, "Q4_0": 0.2, "Q4_1": 0.2}


def load_hf(folder, family: str, quant: str, cache: dict = {}):  # noqa: B006 (one load per file per session)
    """Write FAMILIES[family] in quant under folder and load it with transformers; (model, path), memoised."""
    key = (str(folder), family, quant)
    if key not in cache:
        transformers.logging.set_verbosity_error()
        path = write_gguf(folder / f"{family}-{quant}.gguf", family, quant)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
        cache[key] = (model, path)
    return cache[key]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


def rope_theta(config) -> float | None:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("full_attention", params).get("rope_theta")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_transformers_reads_the_config_written(folder, family):
    model, _ = load_hf(folder, family, "F32")
    s, c = FAMILIES[family], model.config
    assert type(model).__name__ == CLASSES[family]
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.vocab_size) == \
        (s.n_layers, s.d_model, s.n_heads, VOCAB)
    assert getattr(c, "num_key_value_heads", s.n_heads) == s.kv_heads
    assert getattr(c, "head_dim", s.d_model // s.n_heads) == s.head_dim
    assert rope_theta(c) == s.rope_theta
    assert getattr(c, "sliding_window", None) == s.sliding_window
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied == s.tied == c.tie_word_embeddings
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 9, VOCAB) and bool(logits.isfinite().all()) and logits.std() > 0.5


@pytest.mark.parametrize("family, quant", MATRIX)
def test_loaded_weights_are_ggufs_dequantization(folder, family, quant):
    """transformers' weight for each tensor == gguf.quants.dequantize of it, in HF's layout; and every
    parameter of the model comes from the file (none is left at its random initialisation)."""
    model, path = load_hf(folder, family, quant)
    state = model.state_dict()
    source = random_weights(family)
    written = set()
    for tensor in gguf.GGUFReader(path).tensors:
        raw = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert tensor.tensor_type.name == (quant if raw.ndim == 2 else "F32"), tensor.name
        name = hf_name(family, tensor.name)
        expected = torch.from_numpy(np.array(hf_weight(family, tensor.name, raw)))  # a copy: the reader maps the file
        assert torch.equal(state[name], expected), tensor.name
        error = np.linalg.norm(raw - source[tensor.name]) / np.linalg.norm(source[tensor.name])
        assert error <= PRECISION[quant if raw.ndim == 2 else "F32"], tensor.name
        assert raw.ndim == 1 or quant == "F32" or error > 0, tensor.name
        written.add(name)
    assert {name for name, _ in model.named_parameters()} <= written
    assert ("lm_head.weight" in written) == (not FAMILIES[family].tied)


def test_the_layout_changes_are_real(folder):
    """The permutation, the Gemma offset and the GPT-2 transpose each change the tensor (hf_weight is needed)."""
    for family, name, hf in (("llama", "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                             ("llama", "blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
                             ("gemma2", "blk.0.post_ffw_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"),
                             ("gpt2", "blk.0.ffn_up.weight", "transformer.h.0.mlp.c_fc.weight")):
        model, _ = load_hf(folder, family, "F32")
        raw = torch.from_numpy(random_weights(family)[name])
        loaded = model.state_dict()[hf]
        assert loaded.shape != raw.shape or not torch.equal(loaded, raw), (family, name)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_the_tokenizer_comes_from_the_metadata(folder, family):
    v = vocab(family)
    _, path = load_hf(folder, family, "F32")
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=path.name)
    assert len(tok) == VOCAB
    names = v.tokens()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (v.bos, v.eos, v.pad)
    ids = tok.encode(" the cat sat on the mat!", add_special_tokens=False)
    assert [names[i] for i in ids] == [v.space + w for w in "the cat sat on the mat".split()] + ["!"]
    assert tok.decode(ids) == " the cat sat on the mat!"
    assert tok.encode(names[v.eos], add_special_tokens=False) == [v.eos]


def test_files_are_small_and_smaller_when_quantized(tmp_path):
    size = {q: write_gguf(tmp_path / f"{q}.gguf", "llama", q).stat().st_size for q in QUANTS}
    assert size["F32"] < 400_000 and size["F16"] < size["F32"] / 1.8
    assert size["F16"] > size["Q8_0"] > size["Q4_1"] > size["Q4_0"]   # 34, 20 and 18 bytes per 32 weights
    assert all(write_gguf(tmp_path / f"{f}.gguf", f, "F32").stat().st_size < 500_000 for f in FAMILIES)


def test_bad_files_for_the_bad_input_tests(tmp_path):
    bare = write_gguf(tmp_path / "bare.gguf", "llama", "Q8_0", tokenizer=False)
    assert not [k for k in gguf.GGUFReader(bare).fields if k.startswith("tokenizer.")]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=bare.name)
    assert model.config.vocab_size == VOCAB   # the weights still load: {arch}.vocab_size is written
    with pytest.raises(Exception):
        transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=bare.name)
    magic = corrupt(write_gguf(tmp_path / "magic.gguf", "qwen2", "F16"), "magic")
    with pytest.raises(ValueError, match="magic"):
        gguf.GGUFReader(magic)
    cut = corrupt(write_gguf(tmp_path / "cut.gguf", "qwen2", "Q4_0"), "truncate")
    with pytest.raises(Exception):
        gguf.GGUFReader(cut)
    odd = gguf.GGUFReader(write_gguf(tmp_path / "odd.gguf", "llama", "Q8_1"))
    weight = next(t for t in odd.tensors if t.name == "blk.0.attn_q.weight")
    assert weight.tensor_type.name == "Q8_1" and tuple(weight.shape) == (64, 64)
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(weight.data, weight.tensor_type)
    other = gguf.GGUFReader(write_gguf(tmp_path / "other.gguf", "llama", "Q4_0", architecture="mamba"))
    assert bytes(other.fields["general.architecture"].parts[-1]) == b"mamba"
    assert "mamba.block_count" in other.fields
