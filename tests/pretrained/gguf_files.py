"""Tiny GGUF files for the tests, written with the `gguf` package's own writer (no llama.cpp converter).

Every family both transformers' GGUF loader and circuitlab's catalogue read (LLaMA, Mistral, Qwen2, Qwen3,
Gemma-2, Gemma-3, Phi-3, GPT-2 tied and untied), in F32, F16, Q8_0, Q4_0 and Q4_1: 2 layers (6 for
Gemma-3), d_model 64 or 32, GQA where the family has it, random weights drawn directly in GGUF's layout,
and a tiny BPE tokenizer (128 tokens; byte-level "gpt2", or sentencepiece "llama" for Gemma) in the
metadata, so that `AutoTokenizer.from_pretrained(folder, gguf_file=name)` and
`AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)` both load them. Files are 40-400 KB.
For the bad-input tests: tokenizer=False, architecture="..." (another general.architecture), quant="Q8_1"
(a type gguf cannot dequantize, filled with random blocks), and corrupt(path, "magic" | "truncate").

Layout facts, learned from gguf.constants (MODEL_TENSORS / TENSOR_NAMES) and transformers'
modeling_gguf_pytorch_utils (its TensorProcessors undo them on load):
- a 2-D tensor is stored as numpy (rows, cols) = HF's nn.Linear (out, in); quantized blocks of 32 run
  along cols, so every cols is a multiple of 32; 1-D tensors (norms, biases) stay F32, as llama.cpp keeps them;
- "llama" files (LLaMA, and Mistral, which is a llama file) store attn_q / attn_k with each
  head's rows interleaved for llama.cpp's rotary (see `unpermute_rows`);
- Gemma stores RMSNorm weights as the gain 1 + w (HF keeps w);
- GPT-2 stores attn_qkv, attn_output, ffn_up and ffn_down as (out, in) where HF's Conv1D keeps (in, out);
- Phi-3 stores the fused attn_qkv and ffn_up (gate rows, then up rows), as HF's Phi3 does.

    path = write_gguf(tmp_path / "llama-Q4_0.gguf", "llama", "Q4_0")
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

QUANTS = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")


@dataclass(frozen=True)
class Shape:
    """One family's tiny model, and how its GGUF spells it."""

    arch: str                    # general.architecture
    n_heads: int
    kv_heads: int
    head_dim: int
    d_mlp: int
    rope_theta: float | None
    tied: bool
    name: str = "tiny"           # general.name
    d_model: int = 64
    n_layers: int = 2
    n_ctx: int = 64
    eps: float = 1e-5
    sliding_window: int | None = None


FAMILIES: dict[str, Shape] = {
    "llama": Shape("llama", n_heads=4, kv_heads=2, head_dim=16, d_mlp=96, rope_theta=5000.0, tied=False),
    # A Mistral GGUF is a llama file (llama.cpp has no mistral architecture, nor a sliding-window key for it).
    # transformers reads it as Mistral only when general.name is exactly "mistral", and then fails (gguf 0.19
    # names no "mistral" architecture), so a real file's name, as here, gives LlamaForCausalLM.
    "mistral": Shape("llama", n_heads=4, kv_heads=1, head_dim=16, d_mlp=96, rope_theta=20000.0, tied=True,
                     name="Mistral 7B Instruct v0.3 (tiny)"),
    "qwen2": Shape("qwen2", n_heads=4, kv_heads=2, head_dim=16, d_mlp=96, rope_theta=1e6, tied=True),
    # Qwen3's config has head_dim 128 by default and its GGUF mapping reads no key for it
    "qwen3": Shape("qwen3", n_heads=2, kv_heads=1, head_dim=128, d_mlp=64, rope_theta=3000.0, tied=False,
                   d_model=32),
    "gemma2": Shape("gemma2", n_heads=4, kv_heads=2, head_dim=32, d_mlp=96, rope_theta=10000.0, tied=True,
                    sliding_window=4),
    # Gemma-3's layers are 5 sliding (local rope base 10,000, which no GGUF key sets) then 1 full (rope.freq_base)
    "gemma3": Shape("gemma3", n_heads=2, kv_heads=1, head_dim=32, d_mlp=32, rope_theta=1e6, tied=True,
                    sliding_window=4, n_layers=6, d_model=32),
    "phi3": Shape("phi3", n_heads=4, kv_heads=2, head_dim=16, d_mlp=96, rope_theta=10000.0, tied=False),
    # transformers reads gpt2.context_length into n_ctx and feed_forward_length into a key of its own, both of
    # which GPT2Config ignores: n_positions stays 1024 and d_mlp 4 * d_model (d_model 32 keeps the file small)
    "gpt2": Shape("gpt2", n_heads=2, kv_heads=2, head_dim=16, d_mlp=128, rope_theta=None, tied=False, n_ctx=1024,
                  d_model=32),
    "gpt2-tied": Shape("gpt2", n_heads=2, kv_heads=2, head_dim=16, d_mlp=128, rope_theta=None, tied=True,
                       n_ctx=1024, d_model=32),
}

# ---------------------------------------------------------------- tokenizer
# Two tiny BPE vocabularies of VOCAB tokens, spelled as llama.cpp's two BPE kinds spell them:
# - "gpt2" (byte-level, as SmolLM2, Qwen and GPT-2 files): printable ASCII as itself, the space as "Ġ",
#   the newline as "Ċ"; one special, <|endoftext|>, is BOS and EOS;
# - "llama" (sentencepiece, as Gemma files): the space as "▁", Gemma's five specials first (transformers
#   builds Gemma's tokenizer class for these files, which adds any of the five the vocabulary lacks).
VOCAB = 128
WORDS = "the cat sat on mat and a dog ran to park when it was sunny".split()


@dataclass(frozen=True)
class Vocab:
    model: str                           # tokenizer.ggml.model
    specials: tuple[str, ...]
    space: str
    bos: int
    eos: int
    pad: int
    unk: int | None = None

    def chars(self) -> list[str]:
        return ([] if self.model == "llama" else ["Ċ"]) + [self.space] + [chr(b) for b in range(33, 127)]

    def merges(self) -> list[str]:
        """Left-to-right merges that spell " word" for the first words of WORDS, up to VOCAB tokens."""
        merges: list[str] = []
        room = VOCAB - len(self.specials) - len(self.chars())
        for word in WORDS:
            piece = self.space
            for ch in word:
                merge = f"{piece} {ch}"
                if merge not in merges and len(merges) < room:
                    merges.append(merge)
                piece += ch
        return merges

    def tokens(self) -> list[str]:
        """The vocabulary: the specials, the single characters, then one token per merge."""
        return list(self.specials) + self.chars() + [m.replace(" ", "") for m in self.merges()]

    def token_types(self) -> list[int]:
        """gguf.TokenType: 1 NORMAL, 2 UNKNOWN, 3 CONTROL."""
        return [2 if i == self.unk else 3 if i < len(self.specials) else 1 for i in range(VOCAB)]


BYTE_LEVEL = Vocab("gpt2", ("<|endoftext|>", "<|pad|>"), "Ġ", bos=0, eos=0, pad=1)
SENTENCEPIECE = Vocab("llama", ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"), "▁", bos=2, eos=1, pad=0, unk=3)


def vocab(family: str) -> Vocab:
    return SENTENCEPIECE if FAMILIES[family].arch.startswith("gemma") else BYTE_LEVEL


def tokens(family: str = "llama") -> list[str]:
    return vocab(family).tokens()


def _add_tokenizer(writer, v: Vocab) -> None:
    toks = v.tokens()
    assert len(toks) == VOCAB, len(toks)
    writer.add_tokenizer_model(v.model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(toks)
    writer.add_token_types(v.token_types())
    if v.model == "llama":
        writer.add_token_scores([-float(i) for i in range(VOCAB)])
    writer.add_token_merges(v.merges())
    writer.add_bos_token_id(v.bos)
    writer.add_eos_token_id(v.eos)
    writer.add_pad_token_id(v.pad)
    if v.unk is not None:
        writer.add_unk_token_id(v.unk)


# ---------------------------------------------------------------- tensors
def tensor_shapes(family: str) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy shape for FAMILIES[family] (2-D shapes are (out, in))."""
    s = FAMILIES[family]
    arch = s.arch
    d, f, q, kv = s.d_model, s.d_mlp, s.n_heads * s.head_dim, s.kv_heads * s.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (VOCAB, d), "output_norm.weight": (d,)}
    if arch == "gpt2":
        shapes |= {"position_embd.weight": (s.n_ctx, d), "output_norm.bias": (d,)}
    if not s.tied:
        shapes["output.weight"] = (VOCAB, d)
    for i in range(s.n_layers):
        b = f"blk.{i}."
        layer: dict[str, tuple[int, ...]] = {"attn_norm.weight": (d,), "ffn_norm.weight": (d,),
                                             "attn_output.weight": (d, q), "ffn_down.weight": (d, f)}
        if arch in ("phi3", "gpt2"):
            layer |= {"attn_qkv.weight": (q + 2 * kv, d), "ffn_up.weight": ((2 if arch == "phi3" else 1) * f, d)}
        else:
            layer |= {"attn_q.weight": (q, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d),
                      "ffn_gate.weight": (f, d), "ffn_up.weight": (f, d)}
        if arch == "qwen2":
            layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
        if arch in ("qwen3", "gemma3"):
            layer |= {"attn_q_norm.weight": (s.head_dim,), "attn_k_norm.weight": (s.head_dim,)}
        if arch in ("gemma2", "gemma3"):
            layer |= {"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)}
        if arch == "gpt2":
            layer |= {"attn_norm.bias": (d,), "ffn_norm.bias": (d,), "attn_qkv.bias": (q + 2 * kv,),
                      "attn_output.bias": (d,), "ffn_up.bias": (f,), "ffn_down.bias": (d,)}
        shapes |= {b + k: v for k, v in layer.items()}
    return shapes


def random_weights(family: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 weights in GGUF's layout: norm gains 1 ± 0.2, everything else N(0, 0.3²) (biases too)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(family).items():
        noise = rng.standard_normal(shape).astype(np.float32)
        out[name] = 1 + 0.2 * noise if "norm.weight" in name else 0.3 * noise
    return out


def _encode(writer, name: str, weight: np.ndarray, quant: str) -> None:
    import gguf

    if weight.ndim == 1 or quant == "F32":
        writer.add_tensor(name, weight.astype(np.float32))
    elif quant == "F16":
        writer.add_tensor(name, weight.astype(np.float16))
    elif quant in QUANTS:
        qtype = gguf.GGMLQuantizationType[quant]
        writer.add_tensor(name, gguf.quants.quantize(weight, qtype), raw_dtype=qtype)
    else:   # a type gguf can neither quantize nor dequantize (Q8_1): random blocks of the right size
        qtype = gguf.GGMLQuantizationType[quant]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = np.random.default_rng(0).integers(0, 256, (*weight.shape[:-1], weight.shape[-1] // block * size))
        writer.add_tensor(name, blocks.astype(np.uint8), raw_dtype=qtype)


def _add_hparams(writer, s: Shape) -> None:
    writer.add_name(s.name)
    writer.add_block_count(s.n_layers)
    writer.add_context_length(s.n_ctx)
    writer.add_embedding_length(s.d_model)
    writer.add_feed_forward_length(s.d_mlp)
    writer.add_head_count(s.n_heads)
    writer.add_vocab_size(VOCAB)
    if s.arch == "gpt2":
        writer.add_layer_norm_eps(s.eps)
        return
    writer.add_head_count_kv(s.kv_heads)
    writer.add_layer_norm_rms_eps(s.eps)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_dimension_count(s.head_dim)
    if s.rope_theta is not None:
        writer.add_rope_freq_base(s.rope_theta)
    if s.sliding_window is not None:
        writer.add_sliding_window(s.sliding_window)


def write_gguf(path, family: str, quant: str = "F32", *, tokenizer: bool = True, seed: int = 0,
               architecture: str | None = None) -> Path:
    """Write FAMILIES[family] as a GGUF file at path, its 2-D tensors in quant (a GGMLQuantizationType
    name); returns the path. Weights are random_weights(family, seed).

    For the bad-input tests: tokenizer=False leaves out every tokenizer.* key; architecture names another
    general.architecture (the {arch}.* keys follow it)."""
    import gguf

    s = FAMILIES[family]
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), architecture or s.arch)
    _add_hparams(writer, s)
    if tokenizer:
        _add_tokenizer(writer, vocab(family))
    file_type = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}.get(quant)   # gguf.LlamaFileType
    if file_type is not None:
        writer.add_file_type(file_type)
    for name, weight in random_weights(family, seed).items():
        _encode(writer, name, weight, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def corrupt(path, how: str) -> Path:
    """Break a written file in place: "magic" overwrites the GGUF magic, "truncate" cuts it in half."""
    path = Path(path)
    data = path.read_bytes()
    if how == "magic":
        path.write_bytes(b"GGUX" + data[4:])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        raise ValueError(how)
    return path


# ---------------------------------------------------------------- what the loader must undo
def unpermute_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """A llama file's attn_q / attn_k rows -> HF's: within each head, GGUF row 2i + j is HF row j·(hd/2) + i.

    (llama.cpp's rotary pairs adjacent dimensions, HF's pairs dimension i with i + hd/2.)"""
    head_dim = weight.shape[0] // n_heads
    half = head_dim // 2
    out = np.empty_like(weight)
    for h in range(n_heads):
        for i in range(half):
            for j in range(2):
                out[h * head_dim + j * half + i] = weight[h * head_dim + 2 * i + j]
    return out


_LAYER_NAMES = {   # GGUF blk.{i}.X -> HF model.layers.{i}.Y, for the LLaMA-like families
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_GPT2_NAMES = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
               "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
_GPT2_TOP = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe", "output_norm": "transformer.ln_f",
             "output": "lm_head"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(family: str, name: str) -> str:
    """The HF parameter a GGUF tensor becomes, e.g. blk.1.attn_q.weight -> model.layers.1.self_attn.q_proj.weight."""
    arch = FAMILIES[family].arch
    stem, suffix = name.rsplit(".", 1)
    parts = stem.split(".")
    if parts[0] != "blk":
        return f"{(_GPT2_TOP if arch == 'gpt2' else _TOP)[stem]}.{suffix}"
    layer, what = parts[1], parts[2]
    if arch == "gpt2":
        return f"transformer.h.{layer}.{_GPT2_NAMES[what]}.{suffix}"
    if arch == "phi3" and what == "ffn_up":
        return f"model.layers.{layer}.mlp.gate_up_proj.{suffix}"
    names = {**_LAYER_NAMES, **_GEMMA_NAMES} if arch.startswith("gemma") else _LAYER_NAMES
    return f"model.layers.{layer}.{names[what]}.{suffix}"


def hf_weight(family: str, name: str, weight: np.ndarray) -> np.ndarray:
    """A GGUF tensor (dequantized, float32) in HF's layout: what a loader must make of it."""
    s = FAMILIES[family]
    if s.arch == "llama" and ".attn_q." in name:
        return unpermute_rows(weight, s.n_heads)
    if s.arch == "llama" and ".attn_k." in name:
        return unpermute_rows(weight, s.kv_heads)
    if s.arch.startswith("gemma") and name.endswith("norm.weight"):
        return weight - np.float32(1)
    if s.arch == "gpt2" and weight.ndim == 2 and name.startswith("blk."):
        return weight.T
    return weight
