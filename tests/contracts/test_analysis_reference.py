"""Our analyses against TransformerLens 3.9 (the dev-only reference) on the same random weights."""
import pytest
import torch

import helpers

from circuitlab import ModelConfig, Transformer
from circuitlab.pretrained import to_transformer_lens as _to_tl
from circuitlab.analysis.logit_attribution import direct_logit_attribution
from circuitlab.analysis.qk_ov import composition_scores, copying_scores
from circuitlab.analysis.folding import fold_layer_norm
from circuitlab.analysis.heads import detect_heads, induction_test_tokens
from circuitlab.analysis.lens import logit_lens

pytest.importorskip("transformer_lens")
from transformer_lens import HookedTransformer  # noqa: E402
from transformer_lens.head_detector import (  # noqa: E402
    compute_head_attention_similarity_score,
    get_duplicate_token_head_detection_pattern,
    get_induction_head_detection_pattern,
    get_previous_token_head_detection_pattern,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TOL = dict(atol=1e-4, rtol=1e-4)
SMALL = dict(d_vocab=40, n_ctx=24)
CONFIGS = {
    "attn-only": ModelConfig.from_preset("attn-only-3l", d_model=32, n_heads=4, **SMALL),
    "gpt2": ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=32, n_heads=4, d_mlp=64, **SMALL),
}


def random_model(name: str, seed: int = 0) -> Transformer:
    return helpers.random_model(CONFIGS[name], seed)


def to_transformer_lens(model: Transformer) -> HookedTransformer:
    return _to_tl(model, use_attn_result=True)


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    model = random_model(request.param)
    return model, to_transformer_lens(model)


def test_same_weights_same_logits(pair):
    model, ref = pair
    tokens = torch.randint(0, 40, (2, 16))
    torch.testing.assert_close(model(tokens), ref(tokens), **TOL)


def test_copying_scores_match(pair):
    model, ref = pair
    eig = (ref.W_E @ ref.OV @ ref.W_U).eigenvalues  # TL's FactoredMatrix
    expected = eig.sum(-1).real / eig.abs().sum(-1)
    torch.testing.assert_close(copying_scores(model).scores, expected.float(), **TOL)


def test_composition_scores_match(pair):
    model, ref = pair
    ours = composition_scores(model, n_baseline=16)
    L = model.cfg.n_layers
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]  # writer layer < reader
    later = later.expand_as(ours.k)
    for mode in ("q", "k", "v"):
        theirs = ref.all_composition_scores(mode.upper())
        torch.testing.assert_close(ours.scores(mode)[later], theirs[later].float(), **TOL)
        assert torch.isnan(ours.scores(mode)[~later]).all()


def test_detector_scores_match_where_definitions_coincide(pair):
    """TL divides the masked attention by all rows; we average over rows with a target (module docstring)."""
    model, ref = pair
    gen = torch.Generator().manual_seed(0)
    tokens = torch.cat([induction_test_tokens(2, 20, 40, gen), torch.randint(0, 6, (1, 20), generator=gen)])
    _, tl_cache = ref.run_with_cache(tokens)
    T = tokens.shape[1]
    detectors = {"previous_token": get_previous_token_head_detection_pattern,
                 "duplicate_token": get_duplicate_token_head_detection_pattern,
                 "induction": get_induction_head_detection_pattern}
    for b in range(tokens.shape[0]):
        _, cache = model.run_with_cache(tokens[b:b + 1])
        ours = detect_heads(cache, tokens[b:b + 1])
        for name, pattern_fn in detectors.items():
            detection = pattern_fn(tokens[b:b + 1])
            theirs = torch.tensor([[compute_head_attention_similarity_score(
                tl_cache["pattern", l][b, h], detection, exclude_bos=False, exclude_current_token=False,
                error_measure="mul") for h in range(model.cfg.n_heads)] for l in range(model.cfg.n_layers)])
            torch.testing.assert_close(ours[name] * ours.n_rows[name] / T, theirs, **TOL)


def test_logit_lens_matches(pair):
    model, ref = pair
    tokens = torch.randint(0, 40, (1, 18))
    _, tl_cache = ref.run_with_cache(tokens)
    stack = tl_cache.accumulated_resid(apply_ln=False)  # [layer + 1, batch, pos, d_model]
    if hasattr(ref, "ln_final"):
        stack = ref.ln_final(stack)
    probs = ref.unembed(stack)[:, 0].softmax(-1)  # TL's documented "with bias" logit lens
    lens = logit_lens(model, tokens, k=3)
    top = probs.topk(3, dim=-1)
    torch.testing.assert_close(lens.top_probs, top.values, **TOL)
    assert torch.equal(lens.top_tokens, top.indices)
    torch.testing.assert_close(lens.entropy, -(probs * probs.log()).sum(-1), **TOL)


def test_direct_logit_attribution_matches(pair):
    """On the folded model (TL's logit_attrs assumes the final norm's gain is folded into W_U)."""
    model, _ = pair
    folded = fold_layer_norm(model)
    ref = to_transformer_lens(folded)
    tokens = torch.randint(0, 40, (3, 14))
    answer, wrong = torch.tensor([3, 7, 11]), torch.tensor([5, 5, 30])
    _, tl_cache = ref.run_with_cache(tokens)
    heads = tl_cache.stack_head_results(layer=-1, pos_slice=-1)  # [layer*head, batch, d_model]
    theirs = tl_cache.logit_attrs(heads, tokens=answer, incorrect_tokens=wrong, pos_slice=-1)  # applies ln_final
    _, cache = folded.run_with_cache(tokens)
    dla = direct_logit_attribution(folded, cache, answer, wrong, pos=-1)
    is_head = [lab[0] == "L" and "H" in lab for lab in dla.labels]
    torch.testing.assert_close(dla.attributions[is_head], theirs, **TOL)


def test_folding_matches_transformer_lens_processing(pair):
    model, _ = pair
    folded = fold_layer_norm(model)
    ref = to_transformer_lens(model)
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    processed = HookedTransformer(ref.cfg)
    processed.load_and_process_state_dict(state, fold_ln=True, center_writing_weights=True, center_unembed=True,
                                          fold_value_biases=True)
    names = ["W_E", "W_pos", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"]
    if model.cfg.has_mlp:
        names += ["W_in", "b_in", "W_out", "b_out"]
    for name in names:
        torch.testing.assert_close(getattr(folded, name), getattr(processed, name), **TOL, msg=name)
