"""The family registry: a family registered from this test file alone is found by the Hugging Face importer, by
export and by the catalogue's messages; nothing else is edited. Families are found, not listed."""
import json
import pkgutil

import pytest
import torch

from circuitlab import CircuitlabError
from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.pretrained import export_hf, load_pretrained, model_config_from_hf
from circuitlab.pretrained import families
from circuitlab.pretrained.catalog import _all_families, export_families, family_for, supported_names
from circuitlab.pretrained.families.base import Family, Piece, register_family, registered, unregister_family
from pretrained.families.roundtrip import assert_same_weights


class Toy(Family):
    """A made-up architecture: our own layout under "toy." names, its embedding called "tok" and stored
    transposed ([d_model, vocab])."""

    name = "ToyLM"
    model_types = ("toy_lm",)
    architectures = ("ToyLMForCausalLM",)

    def config(self, hf: dict, n_ctx: int | None = None) -> ModelConfig:
        return ModelConfig(n_layers=hf["layers"], d_model=hf["width"], n_heads=hf["heads"], d_vocab=hf["vocab_size"],
                           n_ctx=hf["context"], norm="layernorm", positional="learned", mlp="gelu", bias=False)

    def pieces(self, key: str, cfg: ModelConfig) -> list[Piece] | None:
        if key == "toy.tok":
            return [Piece("embed.weight", None, lambda t: t.t())]
        return [Piece(key.removeprefix("toy."))] if key.startswith("toy.") else None

    def export_tensors(self, model) -> dict[str, torch.Tensor]:
        state = {k: v.detach() for k, v in model.state_dict().items()}
        return {("toy.tok" if k == "embed.weight" else f"toy.{k}"): (v.t() if k == "embed.weight" else v)
                for k, v in state.items()}

    def export_problems(self, cfg: ModelConfig) -> list[str]:
        return [] if (cfg.norm, cfg.positional, cfg.mlp, cfg.bias) == ("layernorm", "learned", "gelu", False) \
            else ["not a ToyLM"]

    def hf_config(self, cfg: ModelConfig, common: dict) -> dict:
        return {**common, "model_type": "toy_lm", "layers": cfg.n_layers, "width": cfg.d_model, "heads": cfg.n_heads,
                "context": cfg.n_ctx}


HF = {"model_type": "toy_lm", "layers": 2, "width": 16, "heads": 2, "vocab_size": 23, "context": 8}


@pytest.fixture
def toy():
    family = register_family(Toy(), order=1000, export_order=1000)
    yield family
    unregister_family(Toy.name)


def write_checkpoint(folder, hf: dict, tensors: dict[str, torch.Tensor]):
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_family_registered_from_a_test_is_read_by_the_importer(toy, tmp_path):
    gen = torch.Generator().manual_seed(0)
    cfg = toy.config(HF)
    shapes = {k: v.shape for k, v in Transformer(cfg).state_dict().items()}
    ours = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    theirs = {("toy.tok" if k == "embed.weight" else f"toy.{k}"): (v.t().contiguous() if k == "embed.weight" else v)
              for k, v in ours.items()}
    model, _ = load_pretrained(write_checkpoint(tmp_path / "toy", HF, theirs), tokenizer=False)
    assert model.cfg.replace(name="") == cfg
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in ours.items())      # "tok" transposed into embed.weight
    # config.json without model_type: its architectures name the family
    arch_only = {**{k: v for k, v in HF.items() if k != "model_type"}, "architectures": ["ToyLMForCausalLM"]}
    assert family_for(arch_only) is toy and model_config_from_hf(arch_only) == cfg
    assert "ToyLM" in supported_names()


def test_a_registered_family_exports_and_reads_its_export_back(toy, tmp_path):
    model, _ = load_pretrained(write_checkpoint(tmp_path / "toy", HF, {
        ("toy.tok" if k == "embed.weight" else f"toy.{k}"): (v.t().contiguous() if k == "embed.weight" else v)
        for k, v in Transformer(toy.config(HF)).state_dict().items()}), tokenizer=False)
    out = export_hf(model, tmp_path / "out", style="toy_lm")   # GPT-2 holds it too, and comes first
    assert json.loads((out / "config.json").read_text())["model_type"] == "toy_lm"
    back, _ = load_pretrained(out, tokenizer=False)
    assert_same_weights(back, model)


def test_unregistered_the_toy_is_unknown_again(tmp_path):
    assert "ToyLM" not in supported_names()
    with pytest.raises(CircuitlabError, match="model_type 'toy_lm'.*not supported"):
        model_config_from_hf(HF)


def test_a_model_type_is_read_by_one_family_only():
    class Clash(Toy):
        name = "Clash"
        model_types = ("llama",)

    _all_families()
    with pytest.raises(CircuitlabError, match="'llama' of Clash is already read by LLaMA"):
        register_family(Clash(), order=1)
    assert "Clash" not in [r.family.name for r in registered()]


def test_every_module_of_the_package_is_found_and_the_orders_are_the_documented_ones():
    modules = {m.name for m in pkgutil.iter_modules(families.__path__)} - {"base", "decoder"}
    found = _all_families()
    assert len(found) == len(modules) == 11
    assert [f.model_types[0] for f in found] == ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma2",
                                                 "gemma3_text", "olmo2", "phi3", "gptj"]
    assert [f.model_types[0] for f in export_families()] == ["llama", "gpt2", "gpt_neox", "qwen3", "gemma2",
                                                             "gemma3_text", "olmo2", "gptj", "phi3"]
