"""Hugging Face import: every family gives HF's own logits and residual streams, offline.

Tiny random HF models are built from configs (odd sizes, several GQA ratios, tied and untied
unembeddings, non-default rope theta), their weights randomised so that every bias and norm
gain matters, saved with save_pretrained, and imported with load_pretrained.


(Its tests of other modules moved with issue 38: tests/pretrained/test_catalog.py.)"""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from circuitlab import CircuitlabError  # noqa: E402
from circuitlab.cli import main  # noqa: E402
from circuitlab.pretrained import load_pretrained, model_config_from_hf  # noqa: E402
from circuitlab.pretrained.assemble import assemble  # noqa: E402,F401 - the placement every family import runs
from circuitlab.training import load_checkpoint  # noqa: E402

VOCAB = 97
TOL = 1e-4

# name -> (HF config class, HF model class, config fields)
CASES = {
    "gpt2-tied": ("GPT2Config", "GPT2LMHeadModel",
                  dict(n_layer=3, n_embd=36, n_head=3, n_inner=50, n_positions=40)),
    "gpt2-untied-gelu": ("GPT2Config", "GPT2LMHeadModel",
                         dict(n_layer=2, n_embd=20, n_head=4, n_positions=24, activation_function="gelu",
                              tie_word_embeddings=False)),
    "neox-parallel": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                      dict(num_hidden_layers=2, hidden_size=36, num_attention_heads=3, intermediate_size=70,
                           max_position_embeddings=40, rotary_pct=0.5, rotary_emb_base=500.0)),
    "neox-sequential-tied": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                             dict(num_hidden_layers=3, hidden_size=32, num_attention_heads=2, intermediate_size=44,
                                  max_position_embeddings=32, rotary_pct=0.25, use_parallel_residual=False,
                                  tie_word_embeddings=True, attention_bias=False)),
    "llama-gqa3": ("LlamaConfig", "LlamaForCausalLM",
                   dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                        intermediate_size=62, max_position_embeddings=40, rope_theta=12345.0)),
    "llama-mqa-tied-bias": ("LlamaConfig", "LlamaForCausalLM",
                            dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=4, num_key_value_heads=1,
                                 head_dim=12, intermediate_size=30, max_position_embeddings=40,
                                 tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "llama-mha": ("LlamaConfig", "LlamaForCausalLM",
                  dict(num_hidden_layers=1, hidden_size=24, num_attention_heads=3, num_key_value_heads=3,
                       intermediate_size=40, max_position_embeddings=40, rms_norm_eps=1e-5)),
    # LLaMA 3 rotary scaling: with head_dim 16 and original context 32 the frequencies fall in all three
    # bands (kept, interpolated, slowed by the factor).
    "llama3-rope-scaling": ("LlamaConfig", "LlamaForCausalLM",
                            dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                 intermediate_size=40, max_position_embeddings=64,
                                 rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 32})),
    "mistral-window": ("MistralConfig", "MistralForCausalLM",
                       dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=44, max_position_embeddings=64, sliding_window=16)),
    "qwen2-gqa4-tied": ("Qwen2Config", "Qwen2ForCausalLM",
                        dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                             intermediate_size=54, max_position_embeddings=40, rope_theta=1e6,
                             tie_word_embeddings=True)),
}


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Make every weight matter: norm gains ~1 ± 0.2, all other tensors N(0, 0.3²) (biases included)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and ("norm" in name or ".ln_" in name):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.3 * noise)


def make_tokenizer():
    """A word-level tokenizer (18 tokens) that AutoTokenizer can load from a folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", "<eos>", "<pad>"] + "the cat sat on mat and a dog ran to park when it was sunny".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>",
                                                pad_token="<pad>")


def make_hf(case: str, folder, with_tokenizer: bool = False, seed: int = 0):
    """Build, randomise and save the HF model of CASES[case]; returns it (eval mode)."""
    config_cls, model_cls, fields = CASES[case]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, bos_token_id=1, eos_token_id=1, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    randomise(model, seed)
    model.save_pretrained(folder)
    if with_tokenizer:
        make_tokenizer().save_pretrained(folder)
    return model


def hf_logits(hf, ids, mask=None):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).logits


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """case -> (hf model, our model, folder); built once per module."""
    out = {}
    for case in CASES:
        folder = tmp_path_factory.mktemp(case)
        hf = make_hf(case, folder, with_tokenizer=case in ("gpt2-tied", "llama-gqa3"))
        model, tokenizer = load_pretrained(folder)
        out[case] = (hf, model, tokenizer, folder)
    return out


# ---------------------------------------------------------------- exactness
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_on_several_prompts(imported, case):
    hf, model, _, _ = imported[case]
    gen = torch.Generator().manual_seed(1)
    n = min(model.cfg.n_ctx, 16)
    for length in (1, 5, n):
        ids = torch.randint(0, VOCAB, (3, length), generator=gen)
        ours, theirs = model(ids), hf_logits(hf, ids)
        assert theirs.std() > 0.5, "test weights too small to catch a wrong mapping"
        assert (ours - theirs).abs().max() <= TOL, f"length {length}"


@pytest.mark.parametrize("case", list(CASES))
def test_padded_batch_matches_hf_on_real_positions(imported, case):
    """Right padding: HF masks the padding; our causal model never looks ahead, so real positions agree."""
    hf, model, _, _ = imported[case]
    lengths = [min(model.cfg.n_ctx, 16), 3, 9]
    T = max(lengths)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (len(lengths), T), generator=gen)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, n:] = 0
        mask[row, :n] = 1
    ours, theirs = model(ids), hf_logits(hf, ids, mask)
    for row, n in enumerate(lengths):
        assert (ours[row, :n] - theirs[row, :n]).abs().max() <= TOL, f"row {row}"
        alone = model(ids[row:row + 1, :n])[0]
        assert (alone - ours[row, :n]).abs().max() <= TOL


def assert_residual_streams_match(hf, model, ids, tol: float = TOL) -> None:
    """HF's hidden_states[i] is block i's input (our blocks.{i}.hook_resid_pre); the last one is after the
    final norm (our ln_final of the last block's hook_resid_post)."""
    with torch.no_grad():
        states = hf(input_ids=ids, output_hidden_states=True).hidden_states
    _, cache = model.run_with_cache(ids, names_filter=lambda name: "resid" in name)
    n = model.cfg.n_layers
    assert len(states) == n + 1
    for layer in range(n):
        assert (cache[f"blocks.{layer}.hook_resid_pre"] - states[layer]).abs().max() <= tol, f"layer {layer}"
    final = model.ln_final(cache[f"blocks.{n - 1}.hook_resid_post"])
    assert (final - states[n]).abs().max() <= tol


@pytest.mark.parametrize("case", list(CASES))
def test_every_residual_stream_matches_hf(imported, case):
    hf, model, _, _ = imported[case]
    ids = torch.randint(0, VOCAB, (2, min(model.cfg.n_ctx, 12)), generator=torch.Generator().manual_seed(3))
    assert_residual_streams_match(hf, model, ids)


def test_configs_map_to_the_right_architecture(imported):
    gpt2 = imported["gpt2-tied"][1].cfg
    assert (gpt2.positional, gpt2.mlp, gpt2.tied_embeddings, gpt2.d_mlp) == ("learned", "gelu_new", True, 50)
    neox = imported["neox-parallel"][1].cfg
    assert neox.parallel_attn_mlp and neox.rot_dim == 6 and neox.rotary_base == 500.0
    assert not imported["neox-sequential-tied"][1].cfg.parallel_attn_mlp
    llama = imported["llama-gqa3"][1].cfg
    assert (llama.n_heads, llama.kv_heads, llama.rotary_base, llama.tied_embeddings) == (6, 2, 12345.0, False)
    mqa = imported["llama-mqa-tied-bias"][1]
    assert mqa.cfg.kv_heads == 1 and mqa.cfg.head_dim == 12 and mqa.unembed.weight is mqa.embed.weight
    assert imported["mistral-window"][1].cfg.n_ctx == 16  # the sliding window bounds the exact context
    qwen = imported["qwen2-gqa4-tied"][1]
    assert qwen.cfg.bias and bool(qwen.blocks[0].attn.qkv.bias.abs().sum() > 0)
    assert not bool(qwen.blocks[0].attn.out.bias.any()) and not bool(qwen.unembed.bias.any())


def test_tied_model_has_one_parameter_for_embed_and_unembed(imported):
    model = imported["gpt2-tied"][1]
    names = [name for name, _ in model.named_parameters()]
    assert "embed.weight" in names and "unembed.weight" not in names
    assert all(not p.is_meta for p in model.parameters()) and all(not b.is_meta for b in model.buffers())


def test_tokenizer_comes_along(imported):
    for case in ("gpt2-tied", "llama-gqa3"):
        tokenizer = imported[case][2]
        assert tokenizer is not None and tokenizer.encode("the cat sat") == [3, 4, 5]
    assert imported["neox-parallel"][2] is None  # no tokenizer files: None, not an error


def test_attention_patterns_of_imported_models_sum_to_one(imported):
    for case in ("gpt2-tied", "neox-parallel", "llama-gqa3"):
        _, model, _, _ = imported[case]
        ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
        logits, cache = model.run_with_cache(ids)
        assert (logits - model(ids)).abs().max() <= 1e-5  # the eager (hooked) path agrees with SDPA
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
            assert pattern.shape == (2, model.cfg.n_heads, 10, 10)
            assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)
            assert not bool(pattern.triu(1).any())  # causal


# ---------------------------------------------------------------- storage variants
def test_sharded_safetensors_and_pytorch_bin(tmp_path, imported):
    hf, reference, _, _ = imported["llama-gqa3"]
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    model, _ = load_pretrained(sharded)
    for name, p in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((sharded / "config.json").read_text())
    torch.save(hf.state_dict(), binary / "pytorch_model.bin")
    model, _ = load_pretrained(binary)
    for name, p in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name


def test_bf16_checkpoint_is_read_in_chunks_and_upcast(tmp_path, monkeypatch):
    import circuitlab.model.loading as source

    make_hf("neox-parallel", tmp_path / "fp32").to(torch.bfloat16).save_pretrained(tmp_path)
    monkeypatch.setattr(source, "_CHUNK_BYTES", 256)  # many chunks per tensor
    model, _ = load_pretrained(tmp_path)
    stored = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert model.embed.weight.dtype == torch.float32
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(8))
    assert (model(ids) - hf_logits(stored, ids)).abs().max() <= TOL


@pytest.mark.parametrize("case", ["gpt2-tied", "neox-parallel"])
def test_legacy_key_layouts_with_buffers(tmp_path, imported, case):
    """The hub's gpt2 checkpoint has no "transformer." prefix and stores causal-mask buffers
    (h.{i}.attn.bias); older Pythia checkpoints store attention.bias/masked_bias and inv_freq."""
    from safetensors.torch import save_file

    hf, reference, _, folder = imported[case]
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if reference.cfg.tied_embeddings:
        del state["lm_head.weight"]  # stored once, as the embedding
    n_ctx = reference.cfg.n_ctx
    mask = torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool))[None, None]
    for i in range(reference.cfg.n_layers):
        if case.startswith("gpt2"):
            state[f"transformer.h.{i}.attn.bias"] = mask.clone()
            state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        else:
            state[f"gpt_neox.layers.{i}.attention.bias"] = mask.clone()
            state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
            state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(3)
    if case.startswith("gpt2"):
        state = {k.removeprefix("transformer."): v for k, v in state.items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    model, _ = load_pretrained(tmp_path)
    for name, p in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name


def test_dtype_and_shorter_context(imported):
    hf, _, _, folder = imported["gpt2-tied"]
    half, _ = load_pretrained(folder, dtype=torch.bfloat16, tokenizer=False)  # held in bf16, float32 arithmetic
    assert {p.dtype for p in half.parameters() if p.dim() >= 2} == {torch.bfloat16}
    assert {p.dtype for p in half.parameters() if p.dim() < 2} == {torch.float32} == {half.compute_dtype}
    short, _ = load_pretrained(folder, n_ctx=8, tokenizer=False)
    assert short.cfg.n_ctx == 8 and short.pos_embed.weight.shape[0] == 8
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(5))
    assert (short(ids) - hf_logits(hf, ids)).abs().max() <= TOL
    with pytest.raises(CircuitlabError, match="learned positions for 40"):
        load_pretrained(folder, n_ctx=41, tokenizer=False)


def test_hub_name_is_read_from_the_local_cache(tmp_path, imported, monkeypatch):
    """A hub name resolves through the HF cache layout without touching the network."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _, reference, _, folder = imported["llama-gqa3"]
    repo = tmp_path / "cache" / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    model, tokenizer = load_pretrained("someone/tiny-llama", cache_dir=tmp_path / "cache")
    assert tokenizer is not None
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    assert torch.equal(model(ids), reference(ids))
    assert model.cfg.name == "someone/tiny-llama"


# ---------------------------------------------------------------- clear errors
def test_offline_hub_name_says_to_use_a_local_copy(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CircuitlabError, match="not a local folder.*--local-dir DIR"):
        load_pretrained("someone/not-cached", cache_dir=tmp_path)


def test_missing_folder_and_missing_files(tmp_path, imported):
    with pytest.raises(CircuitlabError, match="not found"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(CircuitlabError, match="no config.json"):
        load_pretrained(tmp_path)
    folder = imported["llama-gqa3"][3]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(CircuitlabError, match="holds no weights"):
        load_pretrained(tmp_path)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CircuitlabError, match="lacks the shard"):
        load_pretrained(tmp_path)


def test_checkpoint_that_disagrees_with_its_config(tmp_path, imported):
    _, _, _, folder = imported["gpt2-untied-gelu"]
    for name in ("model.safetensors", "generation_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    with pytest.raises(CircuitlabError, match="lacks weights for blocks.2"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    with pytest.raises(CircuitlabError, match="no place"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_inner": 12}))
    with pytest.raises(CircuitlabError, match="shape"):
        load_pretrained(tmp_path)


# ---------------------------------------------------------------- circuitlab import
def test_cli_import_writes_our_model_folder(tmp_path, imported, capsys):
    hf, reference, _, folder = imported["gpt2-tied"]
    out = tmp_path / "models" / "tiny"
    assert main(["import", str(folder), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "tokenizer"}
    meta = json.loads((out / "config.json").read_text())
    assert meta["model"] == reference.cfg.to_dict() and meta["source"]["name_or_path"] == str(folder)
    tok_meta = json.loads((out / "tokenizer" / "tokenizer_meta.json").read_text())
    assert tok_meta["kind"] == "hf" and os.path.isabs(tok_meta["path"])
    model, tokenizer, _ = load_checkpoint(out)
    ids = torch.tensor([tokenizer.encode("the dog ran to the park")])
    assert torch.equal(model(ids), reference(ids))
    assert (model(ids) - hf_logits(hf, ids)).abs().max() <= TOL
    # importing again over our own folder keeps the previous one renamed; someone else's folder is refused
    assert main(["import", str(folder), "--out", str(out), "--no-tokenizer"]) == 0
    kept = [p for p in out.parent.iterdir() if p.name.startswith("tiny.")]
    assert len(kept) == 1 and (kept[0] / "tokenizer").is_dir() and not (out / "tokenizer").exists()
    assert "kept the previous model as" in capsys.readouterr().out
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["import", str(folder), "--out", str(tmp_path / "other")]) == 2
    assert "already holds other files (notes.txt)" in capsys.readouterr().err


def test_cli_import_bad_source_is_one_clear_line(tmp_path, capsys):
    assert main(["import", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_imported_folder_loads_as_a_training_checkpoint(tmp_path, imported):
    """`generate --model` and `interpret --model` read folders with circuitlab.training.load_checkpoint."""
    from circuitlab.training import load_checkpoint

    _, reference, tokenizer, folder = imported["gpt2-tied"]
    out = tmp_path / "m"
    assert main(["import", str(folder), "--out", str(out)]) == 0
    model, tok, _ = load_checkpoint(out)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(7))
    assert torch.equal(model(ids), reference(ids))
    assert tok.encode("the cat sat") == tokenizer.encode("the cat sat")


def test_import_refuses_a_tokenizer_without_eos_before_moving_the_earlier_import(tmp_path, imported, capsys):
    """Issue 40: a tokenizer with no end-of-text token set the earlier import aside silently, then failed."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    _, _, _, folder = imported["gpt2-tied"]
    source = tmp_path / "no-eos"
    shutil.copytree(folder, source)
    for f in source.glob("*token*"):
        f.unlink()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "the", "cat"])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(source)
    out = tmp_path / "models" / "tiny"
    assert main(["import", str(folder), "--out", str(out), "--no-tokenizer"]) == 0
    before = sorted(p.name for p in out.parent.iterdir())
    capsys.readouterr()
    assert main(["import", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no end-of-text (EOS) token" in err and "--no-tokenizer" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in out.parent.iterdir()) == before      # nothing set aside, nothing written
    assert main(["import", str(source), "--out", str(out), "--no-tokenizer"]) == 0   # the way it points to


def test_the_import_flags_the_class_and_a_config_agree(capsys):
    """Every flag of `circuitlab import` is a field of ImportOptions; the flags not given are the class's defaults
    (and a config's with the required fields); load_pretrained's keyword defaults are the class's; a bad --n-ctx
    and a missing --out are refused by the command line and by check() alike."""
    import argparse
    import inspect
    from dataclasses import fields

    from circuitlab.commands import import_model as import_command
    from circuitlab.errors import ConfigError, InputError
    from circuitlab.pretrained.importer import ImportOptions

    p = argparse.ArgumentParser(exit_on_error=False)
    import_command.add_arguments(p)
    assert [a.dest for a in p._actions if a.dest != "help"] == [f.name for f in fields(ImportOptions)]
    required = {"source": "gpt2", "out": "models/gpt2"}
    defaults = ImportOptions(**required).check()
    assert ImportOptions.from_args(p.parse_args(["gpt2", "--out", "models/gpt2"])) == defaults == \
        ImportOptions.from_dict(required)
    assert (defaults.dtype, defaults.n_ctx, defaults.tokenizer) == ("float32", None, True)
    keywords = inspect.signature(load_pretrained).parameters
    assert (keywords["dtype"].default, keywords["tokenizer"].default) == (ImportOptions.dtype, ImportOptions.tokenizer)
    got = ImportOptions.from_args(p.parse_args(["m", "--out", "o", "--dtype", "bfloat16", "--n-ctx", "8",
                                                "--no-tokenizer", "--revision", "main", "--cache-dir", "c"]))
    assert got == ImportOptions(source="m", out="o", dtype="bfloat16", n_ctx=8, tokenizer=False, revision="main",
                                cache_dir="c")
    assert ImportOptions.from_dict(got.to_dict()) == got
    with pytest.raises(SystemExit):
        main(["import", "m", "--out", "o", "--n-ctx", "0"])
    assert "argument --n-ctx: must be a whole number >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(InputError, match="^n_ctx must be a whole number >= 1, got 0$"):
        ImportOptions(**required, n_ctx=0).check()
    with pytest.raises(ConfigError, match="^dtype must be one of float32, bfloat16, float16, got 'int8'$"):
        ImportOptions.from_dict({**required, "dtype": "int8"})
    with pytest.raises(SystemExit):
        main(["import", "m"])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(InputError, match="^out is required$"):
        ImportOptions(source="m").check()
