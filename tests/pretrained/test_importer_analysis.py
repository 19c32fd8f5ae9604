"""The analysis tools run on imported models: head detection, logit lens, LN folding, patching.

Imported tiny GPT-2 and LLaMA (grouped-query) models, weights random: these check that the tools
work on imported architectures and keep their invariants, not which heads are found.
"""
import pytest
import torch

pytest.importorskip("transformers")
from circuitlab.analysis import folding, heads, lens  # noqa: E402

from pretrained.test_importer import VOCAB, hf_logits, make_hf  # noqa: E402

from circuitlab.pretrained import load_pretrained  # noqa: E402


@pytest.fixture(scope="module", params=["gpt2-tied", "llama-gqa3"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_hf(request.param, folder, with_tokenizer=True)
    model, tokenizer = load_pretrained(folder)
    return hf, model, tokenizer


def tokens(batch=2, pos=12, seed=0):
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_head_detection_and_classification(pair):
    _, model, _ = pair
    half = tokens(4, 8)
    ids = torch.cat([half, half], dim=1)  # repeated random tokens
    _, cache = model.run_with_cache(ids)
    scores = heads.detect_heads(cache, ids)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    for name in heads.DETECTORS:
        s = scores[name]
        assert s.shape == shape and bool(((s >= 0) & (s <= 1 + 1e-6)).all()), name
    # The previous-token score is the mean attention from each query to the key just before it.
    patterns = torch.stack([cache["pattern", l] for l in range(model.cfg.n_layers)])  # [layer, batch, head, q, k]
    q = torch.arange(1, ids.shape[1])
    naive = patterns[:, :, :, q, q - 1].mean(dim=(1, 3))
    torch.testing.assert_close(scores["previous_token"], naive, rtol=1e-5, atol=1e-6)
    # Labels agree with their evidence, name heads that exist, and the summary lists each once.
    classes = heads.classify_heads(model, tokens=ids)
    assert all(lab.assigned for lab in classes.labels) and not any(lab.assigned for lab in classes.rejected)
    assert all(0 <= lab.layer < shape[0] and 0 <= lab.head < shape[1] for lab in classes.labels + classes.rejected)
    for l, h in classes.heads_with("previous-token"):
        assert float(scores["previous_token"][l, h]) >= heads.THRESHOLDS["previous_token"]
    assert len(classes.summary()) == len(classes.labels) + len(classes.rejected)


def test_logit_lens_ends_at_the_models_own_prediction(pair):
    _, model, tokenizer = pair
    ids = torch.tensor(tokenizer.encode("the cat sat on the mat and the dog ran"))
    result = lens.logit_lens(model, ids, k=3, tokenizer=tokenizer)
    assert result.labels == ["embed"] + [f"L{i}" for i in range(model.cfg.n_layers)]
    assert torch.equal(result.top_tokens[-1], model(ids[None])[0].topk(3, dim=-1).indices)
    assert len(result.top_strs[-1]) == len(ids)


def test_folded_model_keeps_hf_log_probs(pair):
    hf, model, _ = pair
    folded = folding.fold_layer_norm(model)
    ids = tokens()
    ours = folded(ids).log_softmax(-1)
    theirs = hf_logits(hf, ids).log_softmax(-1)
    assert (ours - theirs).abs().max() <= 1e-4


def test_activation_patching_restores_the_clean_run(pair):
    """Patch the clean residual stream into a corrupted run: at every position the output becomes
    the clean one; at one position only that position and later ones change."""
    _, model, _ = pair
    clean, corrupt = tokens(1, 10, seed=1), tokens(1, 10, seed=2)
    clean_logits, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_resid_pre"))
    corrupt_logits = model(corrupt)
    layer = model.cfg.n_layers - 1
    name = f"blocks.{layer}.hook_resid_pre"

    def patch_all(x, hook):
        return cache[name]

    patched = model.run_with_hooks(corrupt, fwd_hooks=[(name, patch_all)])
    assert (patched - clean_logits).abs().max() <= 1e-5

    def patch_pos(x, hook, pos=6):
        x = x.clone()
        x[:, pos] = cache[name][:, pos]
        return x

    patched = model.run_with_hooks(corrupt, fwd_hooks=[(name, patch_pos)])
    assert (patched[:, :6] - corrupt_logits[:, :6]).abs().max() <= 1e-6
    assert (patched[:, 6] - corrupt_logits[:, 6]).abs().max() > 1e-3
