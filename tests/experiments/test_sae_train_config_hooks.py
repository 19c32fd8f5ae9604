"""Every hook a bundled config names, or leaves to its default (a CLT's or per-layer transcoders' MLP input and
output), exists on every family it can run on: each `sae train` config in src/circuitlab/configs/, pointed at a
tiny model of each family (`--set model=...`), expands to hooks that model has. OLMo-2 has no norm before its
MLP (no blocks.L.ln2), GPT-NeoX and GPT-J run attention and MLP in parallel (no hook_resid_mid): the default
MLP input is the model's own (ModelConfig.mlp_input_hook)."""
from pathlib import Path

import pytest
import yaml

from circuitlab import ModelConfig, Transformer
from experiments.test_interpret_families import FAMILIES

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "src" / "circuitlab" / "configs").glob("*.yaml")
                 if "dictionaries" in (yaml.safe_load(p.read_text()) or {}))


def test_the_bundled_dictionary_configs_are_found():
    assert {p.stem for p in CONFIGS} >= {"sae-demo", "transcoder-demo", "clt-demo"}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_hook_a_config_names_exists_on_every_family(config, family):
    from circuitlab.dictionaries.clt import CLTConfig
    from circuitlab.experiments.sae_train import _expand_layers, load_sae_config

    data = load_sae_config(str(config), [])
    model = Transformer(ModelConfig(d_vocab=48, **FAMILIES[family]))
    entries, _ = _expand_layers([(dict(d), {}) for d in data["dictionaries"]], model)
    hooks = set(model.hook_names())
    for d, _ in entries:
        named = CLTConfig.from_dict(d).hooks() if d.get("kind") == "clt" else [d.get("hook_name"), d.get("out_hook_name")]
        missing = [h for h in named if h and h not in hooks]
        assert not missing, f"{config.stem} on {family}: {missing} are not hooks of the model"


def test_the_mlp_input_hook_is_what_the_mlp_reads():
    """mlp_input_hook's value is the MLP's input on each family: the MLP run on it gives hook_mlp_out (through
    ln2_post where there is one). At the init's unit gains and zero biases: ln2.hook_normalized is the norm's
    output before its gain, the reading point of transcoders here (docs/dictionaries.md)."""
    import torch

    for family, fields in FAMILIES.items():
        model = Transformer(ModelConfig(d_vocab=48, **fields)).eval()
        tokens = torch.randint(0, 48, (1, 6), generator=torch.Generator().manual_seed(0))
        _, cache = model.run_with_cache(tokens)
        block = model.blocks[0]
        x = cache[model.cfg.mlp_input_hook(0)]
        torch.testing.assert_close(block.ln2_post(block.mlp(x)), cache["blocks.0.hook_mlp_out"], msg=family)
