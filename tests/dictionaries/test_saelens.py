"""SparseDictionary: architectures, save/load, folding, bad input, SAELens parity.

(Split out of the flat test_dictionaries module, issue 38.)"""
import pytest
import torch

from circuitlab.dictionaries import SparseDictionary
from circuitlab.dictionaries.saelens import load_saelens, save_saelens

from dictionaries.test_sae import random_dictionary  # noqa: F401 (shared with it)


def _saelens_pairs():
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
    from sae_lens.saes.transcoder import SkipTranscoder, SkipTranscoderConfig

    return {
        "standard": lambda: StandardSAE(StandardSAEConfig(d_in=8, d_sae=32)),
        "topk": lambda: TopKSAE(TopKSAEConfig(d_in=8, d_sae=32, k=5, rescale_acts_by_decoder_norm=True)),
        "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=8, d_sae=32)),
        "skip_transcoder": lambda: SkipTranscoder(SkipTranscoderConfig(d_in=8, d_sae=32, d_out=6, apply_b_dec_to_input=False)),
    }


@pytest.mark.parametrize("arch", ["standard", "topk", "jumprelu", "skip_transcoder"])
def test_a_saelens_dictionary_loads_here_with_the_same_outputs(tmp_path, arch):
    theirs = _saelens_pairs()[arch]()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g) * 0.2 if name == "threshold" else torch.randn(p.shape, generator=g) * 0.3)
    theirs.cfg.metadata.hook_name = "blocks.0.hook_resid_post"
    theirs.save_model(tmp_path / "s")
    ours = SparseDictionary.load(tmp_path / "s")  # found as a SAELens folder
    x = torch.randn(50, 8)
    torch.testing.assert_close(ours.encode(x), theirs.encode(x), atol=1e-5, rtol=1e-5)
    acts = theirs.encode(x)
    if arch == "skip_transcoder":
        torch.testing.assert_close(ours(x)[0], theirs(x), atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(ours.decode(acts), theirs.decode(acts), atol=1e-5, rtol=1e-5)
    assert ours.cfg.hook_name == "blocks.0.hook_resid_post"


@pytest.mark.parametrize("arch", ["relu", "topk", "batchtopk", "jumprelu"])
def test_a_dictionary_saved_here_loads_in_saelens_with_the_same_outputs(tmp_path, arch):
    from sae_lens import SAE

    ours = random_dictionary(arch, base_model={"name": "tiny"})
    save_saelens(ours, tmp_path / "s")
    theirs = SAE.load_from_disk(tmp_path / "s")
    x = torch.randn(50, 8)
    torch.testing.assert_close(theirs.encode(x), ours.encode(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs(x), ours(x)[0], atol=1e-5, rtol=1e-5)
    assert theirs.cfg.metadata.hook_name == "blocks.0.hook_resid_post"
    back = load_saelens(tmp_path / "s")
    torch.testing.assert_close(back(x)[0], ours(x)[0])
