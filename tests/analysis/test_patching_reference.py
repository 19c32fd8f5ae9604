"""Activation patching against TransformerLens 3.9's transformer_lens.patching on the same random weights."""
import pytest
import torch

import helpers

from circuitlab import ModelConfig, Transformer
from circuitlab.pretrained import to_transformer_lens
from circuitlab.analysis.patching import logit_diff, patching_sweep

pytest.importorskip("transformer_lens")
import transformer_lens.patching as tl_patching  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("one_thread")]


CONFIGS = {
    "attn-only": ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=4, d_vocab=40, n_ctx=16),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", d_model=32, n_heads=4, d_mlp=64, d_vocab=40, n_ctx=16),
}
# our target -> TransformerLens function with the same [layer, ...] layout
TL_FUNCTIONS = {
    "head_out_by_pos": tl_patching.get_act_patch_attn_head_out_by_pos,
    "resid_pre": tl_patching.get_act_patch_resid_pre,
    "attn_out": tl_patching.get_act_patch_attn_out,
    "head_out": tl_patching.get_act_patch_attn_head_out_all_pos,
    "pattern_by_pos": tl_patching.get_act_patch_attn_head_pattern_by_pos,
}


def random_model(name: str) -> Transformer:
    return helpers.random_model(CONFIGS[name], scale=12.0)  # patches move the metric well beyond the tolerance



@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    model = random_model(request.param)
    return model, to_transformer_lens(model)


def test_weights_loaded_unchanged(pair):
    model, ref = pair
    tokens = torch.randint(0, 40, (2, 6))
    # No folding or centring happened: the raw weights are ours, and so are the logits.
    torch.testing.assert_close(ref.blocks[0].attn.W_Q.detach(), model.W_Q[0].detach())
    if model.cfg.norm == "layernorm":
        torch.testing.assert_close(ref.blocks[0].ln1.w.detach(), model.blocks[0].ln1.w.detach())
    with torch.no_grad():
        torch.testing.assert_close(ref(tokens), model(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target", list(TL_FUNCTIONS))
def test_same_numbers_as_transformer_lens(pair, target):
    model, ref = pair
    gen = torch.Generator().manual_seed(3)
    clean, corrupt = torch.randint(0, 40, (2, 6), generator=gen), torch.randint(0, 40, (2, 6), generator=gen)
    metric = logit_diff([3, 4], [5, 6])
    ours = patching_sweep(model, clean, corrupt, metric, [target], progress=False)[target].values
    _, clean_cache = ref.run_with_cache(clean)
    theirs = TL_FUNCTIONS[target](ref, corrupt, clean_cache, metric)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.detach().double(), atol=1e-5, rtol=0)
    assert ours.std() > 0.01  # the patches do something, so agreement to 1e-5 is not trivial
