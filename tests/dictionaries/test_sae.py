"""SparseDictionary: architectures, save/load, folding, bad input, SAELens parity.

(Its tests of other modules moved with issue 38: tests/dictionaries/test_config.py,
tests/dictionaries/test_saelens.py.)"""
import json

import pytest
import torch

from circuitlab.config import ModelConfig
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary, base_model_id, check_base_model
from circuitlab.dictionaries.saelens import load_saelens, save_saelens
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.model import Transformer


def random_dictionary(arch="relu", d_in=8, d_sae=32, k=4, seed=0, **kw) -> SparseDictionary:
    sae = SparseDictionary(DictionaryConfig(arch, d_in=d_in, d_sae=d_sae, k=k if arch in ("topk", "batchtopk") else None,
                                            hook_name="blocks.0.hook_resid_post", **kw), seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(torch.rand(d_sae, generator=g) * 0.3 + 0.05)
    return sae


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_encode_decode_shapes_and_sparsity(arch):
    sae = random_dictionary(arch)
    x = torch.randn(3, 5, 8)
    x_hat, acts = sae(x)
    assert x_hat.shape == (3, 5, 8) and acts.shape == (3, 5, 32)
    assert (acts >= 0).all() and (acts == 0).any()
    if arch == "topk":
        assert ((acts > 0).sum(-1) <= 4).all()
    if arch in ("jumprelu", "batchtopk"):  # no active latent at or below its threshold
        assert ((acts == 0) | (acts > sae.threshold)).all()
    torch.testing.assert_close(x_hat, acts @ sae.W_dec + sae.b_dec)


def test_transcoder_with_skip_reads_and_writes_different_widths():
    sae = random_dictionary("relu", d_in=8, d_sae=16, out_hook_name="blocks.0.hook_mlp_out", d_out=6, skip=True)
    x = torch.randn(4, 8)
    y, acts = sae(x)
    assert y.shape == (4, 6)
    pre = x @ sae.W_enc + sae.b_enc  # a transcoder does not centre its input on b_dec (output space)
    torch.testing.assert_close(y, pre.relu() @ sae.W_dec + sae.b_dec + x @ sae.W_skip)


@pytest.mark.parametrize("arch", ["relu", "topk", "jumprelu"])
def test_save_load_round_trip_is_exact(tmp_path, arch):
    sae = random_dictionary(arch, base_model={"name": "m"})
    sae.save(tmp_path / "d")
    back = SparseDictionary.load(tmp_path / "d")
    assert back.cfg == sae.cfg
    for name, t in sae.state_dict().items():
        assert torch.equal(back.state_dict()[name], t)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["architecture"] == arch


def test_batchtopk_is_saved_as_jumprelu_with_the_same_output_at_any_batch_size(tmp_path):
    sae = random_dictionary("batchtopk")
    sae.save(tmp_path / "d")
    back = SparseDictionary.load(tmp_path / "d")
    assert back.cfg.architecture == "jumprelu" and back.cfg.metadata["trained_as"] == "batchtopk"
    x = torch.randn(37, 8)
    full = back(x)[0]
    torch.testing.assert_close(torch.cat([back(x[i : i + 1])[0] for i in range(37)]), full)
    torch.testing.assert_close(full, sae(x)[0])


@pytest.mark.parametrize("arch", ["relu", "topk", "jumprelu"])
def test_folding_the_input_scale_changes_no_output(arch):
    sae = random_dictionary(arch).double()
    x = torch.randn(20, 8, dtype=torch.float64) * 7
    s = 0.37
    folded = sae.folded(s)
    x_hat_n, acts_n = sae(x * s)
    x_hat, acts = folded(x)
    torch.testing.assert_close(acts, acts_n)
    torch.testing.assert_close(x_hat, x_hat_n / s)
    assert folded.cfg.normalisation["folded"] and folded.cfg.normalisation["in_scale"] == s


def test_folding_a_skip_transcoder_with_two_scales():
    sae = random_dictionary("relu", d_in=8, d_sae=16, out_hook_name="o", d_out=6, skip=True).double()
    x = torch.randn(10, 8, dtype=torch.float64)
    torch.testing.assert_close(sae.folded(0.5, 3.0)(x)[0], sae(x * 0.5)[0] / 3.0)


# ---------------------------------------------------------------------------- bad input


def test_corrupt_truncated_or_mismatched_files_give_one_line(tmp_path):
    sae = random_dictionary()
    folder = sae.save(tmp_path / "d")
    weights = folder / "dictionary.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CircuitlabError, match="corrupt or truncated"):
        SparseDictionary.load(folder)
    weights.write_bytes(data)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "d_sae": 64}))
    with pytest.raises(CircuitlabError, match="does not match"):
        SparseDictionary.load(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CircuitlabError, match="config.json is missing"):
        SparseDictionary.load(folder)
    with pytest.raises(CircuitlabError, match="not found"):
        SparseDictionary.load(tmp_path / "nowhere")


def _spoil(file):
    file.write_bytes(file.read_bytes() + b"\n# caf\xe9\n")   # a Latin-1 byte after the text


def test_configs_that_are_not_utf8_name_the_file_and_byte(tmp_path):
    """Our dictionary's config.json and a SAELens folder's cfg.json are read through circuitlab.textfile."""
    ours = random_dictionary().save(tmp_path / "d")
    _spoil(ours / "config.json")
    with pytest.raises(CircuitlabError, match=r"config.json is not UTF-8 text: byte \d+ \(line \d+\) is 0xe9"):
        SparseDictionary.load(ours)
    save_saelens(random_dictionary(), tmp_path / "s")
    cfg = next((tmp_path / "s").glob("cfg.json"))
    _spoil(cfg)
    with pytest.raises(CircuitlabError, match=r"cfg.json is not UTF-8 text: byte \d+"):
        load_saelens(tmp_path / "s")


def test_a_dictionary_for_another_base_model_is_refused():
    cfg = ModelConfig.from_preset("attn-only-1l", d_model=16, n_heads=2, d_vocab=20, n_ctx=8)
    model, other = Transformer(cfg), Transformer(cfg)
    other.reset_parameters(seed=5)
    sae = random_dictionary(d_in=16, base_model=base_model_id(model, "tiny"))
    check_base_model(sae, model)
    with pytest.raises(CircuitlabError, match="trained on tiny") as e:
        check_base_model(sae, other)
    # same name and shape: the message says what differs (the weights), not only "another model"
    assert "same configuration with other weights" in str(e.value)
    wider = Transformer(ModelConfig.from_preset("attn-only-1l", d_model=16, n_heads=4, d_vocab=20, n_ctx=8))
    with pytest.raises(CircuitlabError, match="configuration differs") as e:
        check_base_model(sae, wider)
    assert "other weights" not in str(e.value)


# ---------------------------------------------------------------------------- SAELens parity
