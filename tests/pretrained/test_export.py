"""Export to Hugging Face: transformers loads the folder, gives our logits and generates our tokens;
import(export(m)) gives back m's weights exactly."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from circuitlab import CircuitlabError, ModelConfig, Transformer  # noqa: E402
from circuitlab.cli import main  # noqa: E402
from circuitlab.pretrained import export_hf, export_style, load_pretrained  # noqa: E402
from circuitlab.training import save_checkpoint  # noqa: E402

TOL = 1e-4
SMALL = dict(d_vocab=61, n_ctx=24)
CONFIGS = {
    "llama": ModelConfig.from_preset("llama-tiny", **SMALL).replace(d_model=48, n_heads=6, n_kv_heads=3, d_mlp=70,
                                                                    rotary_base=777.0),
    "llama-tied": ModelConfig.from_preset("llama-tiny", tied_embeddings=True, **SMALL),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", **SMALL).replace(d_model=36, n_heads=3, d_mlp=52),
    "gpt2-untied-relu": ModelConfig.from_preset("gpt2-tiny", tied_embeddings=False, mlp="relu", **SMALL),
    "neox": ModelConfig.from_preset("gpt2-tiny", positional="rotary", rotary_dim=16, parallel_attn_mlp=True,
                                    tied_embeddings=False, **SMALL),
    "llama-linear-rope": ModelConfig.from_preset("llama-tiny", rope_scaling={"type": "linear", "factor": 4.0},
                                                 **SMALL),
    "neox-llama3-rope": ModelConfig.from_preset(
        "gpt2-tiny", positional="rotary", rotary_dim=16, tied_embeddings=False, **SMALL,
        rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16}),
}


def architecture(cfg: ModelConfig) -> dict:
    """The fields that decide what the model computes (sizes resolved, init settings left out)."""
    fields = cfg.to_dict()
    for init_only in ("init_std", "scale_out_init", "name"):
        fields.pop(init_only)
    fields.update(d_head=cfg.head_dim, n_kv_heads=cfg.kv_heads, d_mlp=cfg.mlp_dim, rotary_dim=cfg.rot_dim)
    return fields


def random_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Random weights everywhere (biases and norm gains too), except a zero unembedding bias."""
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name != "unembed.bias":
                p.copy_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_loads_in_transformers_with_our_logits_and_imports_back_identically(tmp_path, name):
    model = random_model(CONFIGS[name])
    export_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    expected = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM"}
    assert type(hf).__name__ == expected[export_style(model.cfg)]
    ids = torch.randint(0, 61, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    assert theirs.std() > 0.5
    assert (model(ids) - theirs).abs().max() <= TOL
    back, _ = load_pretrained(tmp_path)
    assert architecture(back.cfg) == architecture(model.cfg)
    ours, again = model.state_dict(), back.state_dict()
    assert ours.keys() == again.keys()
    for key in ours:
        assert torch.equal(ours[key], again[key]), key


def test_transformers_generates_what_we_generate(tmp_path):
    model = random_model(CONFIGS["llama"])
    export_hf(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompt = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(2))
    ours = model.generate(prompt, max_new_tokens=10, temperature=0.0)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                         pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_imported_qwen2_exports_as_llama_with_its_biases(tmp_path):
    """An import keeps working after a round trip through a different HF architecture."""
    config = transformers.Qwen2Config(vocab_size=53, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=40, num_hidden_layers=2, max_position_embeddings=32)
    torch.manual_seed(0)
    qwen = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in qwen.parameters():
            p.add_(0.3 * torch.randn_like(p))
    qwen.save_pretrained(tmp_path / "qwen")
    model, _ = load_pretrained(tmp_path / "qwen")
    export_hf(model, tmp_path / "llama")
    llama = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    ids = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (llama(input_ids=ids).logits - qwen(input_ids=ids).logits).abs().max() <= TOL


def test_unexportable_models_say_why(tmp_path):
    with pytest.raises(CircuitlabError, match="attn_only=True"):
        export_hf(Transformer(ModelConfig.from_preset("attn-only-2l", **SMALL)), tmp_path)
    model = random_model(CONFIGS["gpt2"])
    with torch.no_grad():
        model.unembed.bias.fill_(0.5)
    with pytest.raises(CircuitlabError, match="non-zero bias"):
        export_hf(model, tmp_path)


def test_tokenizer_is_exported(tmp_path):
    from pretrained.test_importer import make_tokenizer

    model = random_model(CONFIGS["gpt2"])
    tokenizer = make_tokenizer()
    export_hf(model, tmp_path, tokenizer)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert back.encode("the cat sat") == tokenizer.encode("the cat sat")
    assert transformers.AutoConfig.from_pretrained(tmp_path).eos_token_id == tokenizer.eos_token_id


def test_cli_export(tmp_path, capsys):
    from pretrained.test_importer import make_tokenizer

    model = random_model(CONFIGS["llama-tied"])
    save_checkpoint(tmp_path / "ours", model, make_tokenizer())
    assert main(["export", "--checkpoint", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").encode("a dog") == [9, 10]
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - model(ids)).abs().max() <= TOL
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "not found" in capsys.readouterr().err


def test_export_of_a_training_checkpoint_with_its_bpe_tokenizer(tmp_path):
    """A checkpoint written by the trainer (circuitlab's own BPE tokenizer) exports with a
    transformers tokenizer that encodes the same ids."""
    from circuitlab.data.tokenizers import BPETokenizer

    texts = ["the cat sat on the mat", "a dog ran to the park when it was sunny"] * 20
    tokenizer = BPETokenizer.train(texts, vocab_size=300)
    model = random_model(ModelConfig.from_preset("llama-tiny", d_vocab=tokenizer.vocab_size, n_ctx=24))
    save_checkpoint(tmp_path / "run" / "checkpoint", model, tokenizer)
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the dog sat on the mat"
    assert hf_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - model(ids)).abs().max() <= TOL


def test_the_export_flags_the_class_and_a_config_agree(capsys):
    """Every flag of `circuitlab export` is a field of HfExportOptions; the flags read back into the class (and a
    config with the required fields); the required ones are required by the command line and by check() alike."""
    import argparse
    from dataclasses import fields

    from circuitlab.commands import export as export_command
    from circuitlab.errors import InputError
    from circuitlab.pretrained.export import HfExportOptions

    p = argparse.ArgumentParser(exit_on_error=False)
    export_command.add_arguments(p)
    assert [a.dest for a in p._actions if a.dest != "help"] == [f.name for f in fields(HfExportOptions)]
    required = {"checkpoint": "models/gpt2", "out": "exports/gpt2-hf"}
    defaults = HfExportOptions(**required).check()
    assert HfExportOptions.from_args(p.parse_args(["--model", "models/gpt2", "--out", "exports/gpt2-hf"])) == \
        defaults == HfExportOptions.from_dict(required)
    assert defaults.style is None
    got = HfExportOptions.from_args(p.parse_args(["--checkpoint", "m", "--out", "o", "--style", "phi3"]))
    assert got == HfExportOptions(checkpoint="m", out="o", style="phi3")
    assert HfExportOptions.from_dict(got.to_dict()) == got
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", "m"])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    with pytest.raises(InputError, match="^out is required$"):
        HfExportOptions(checkpoint="m").check()
