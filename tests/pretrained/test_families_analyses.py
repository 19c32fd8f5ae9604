"""Every analysis on every newer family (Gemma-2, Gemma-3, Qwen3, OLMo-2, Phi-3, GPT-J), in float64 against
the definition: the model's own forward, a by-hand hook run, or the identity an analysis promises. The
configs are the families' switches on tiny odd sizes (windows shorter than the prompt, binding soft-caps);
tests/pretrained/test_families.py checks that imports give exactly these architectures.
The table in docs/pretrained.md ("Analyses on each family") is this file's summary."""
import math

import pytest
import torch

import helpers

from circuitlab import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, T = 40, 10
COMMON = dict(d_vocab=VOCAB, n_ctx=16, norm="rmsnorm", norm_eps=1e-6, positional="rotary", bias=False)
FAMILIES = {
    "gemma2": dict(COMMON, n_layers=3, d_model=36, n_heads=3, n_kv_heads=1, d_head=10, d_mlp=50, mlp="geglu",
                   tied_embeddings=True, block_norms="sandwich", embed_scale=6.0, attn_scale=math.sqrt(20),
                   attn_softcap=1.5, logit_softcap=2.5, sliding_window=4, sliding_layers=[0, 2]),
    "gemma3": dict(COMMON, n_layers=4, d_model=28, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=34, mlp="geglu",
                   tied_embeddings=True, block_norms="sandwich", qk_norm="head", embed_scale=math.sqrt(28),
                   attn_scale=math.sqrt(12), rotary_base=3000.0, rope_scaling={"type": "linear", "factor": 2.0},
                   local_rotary_base=50.0, sliding_window=3, sliding_layers=[0, 2]),
    "qwen3": dict(COMMON, n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, d_head=6, d_mlp=26, mlp="swiglu",
                  qk_norm="head", tied_embeddings=True),
    "olmo2": dict(COMMON, n_layers=2, d_model=36, n_heads=6, n_kv_heads=2, d_mlp=46, mlp="swiglu",
                  block_norms="post", qk_norm="full"),
    "phi3": dict(COMMON, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=38, mlp="swiglu", sliding_window=5),
    "gptj": dict(COMMON, n_layers=2, d_model=48, n_heads=4, d_mlp=50, norm="layernorm", norm_eps=1e-5, bias=True,
                 rotary_dim=6, rotary_interleaved=True, mlp="gelu_new", parallel_attn_mlp=True),
}
NAMES = list(FAMILIES)


@pytest.fixture(scope="module")
def models():
    return {name: helpers.random_model(ModelConfig(**cfg), seed=i, scale=3.0).double().eval()
            for i, (name, cfg) in enumerate(FAMILIES.items())}


def toks(seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


def close(a, b, tol=1e-9):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def raw_logits(model, resid):
    """The unembedding's output before any final soft-cap (what direct logit attribution explains)."""
    return model.unembed(model.ln_final(resid))


# ---------------------------------------------------------------- cache, patching, steering, nnsight
@pytest.mark.parametrize("name", NAMES)
def test_cache_holds_every_hook_and_the_same_logits(models, name):
    model = models[name]
    tokens = toks()
    logits, cache = model.run_with_cache(tokens)
    close(logits, model(tokens))
    assert set(cache.acts) == set(model.hook_names())
    L = model.cfg.n_layers - 1
    close(model.soft_cap_logits(raw_logits(model, cache[f"blocks.{L}.hook_resid_post"])), logits)


@pytest.mark.parametrize("name", NAMES)
def test_activation_patching_equals_a_hook_run(models, name):
    from circuitlab.analysis.patching import activation_patching, logit_diff

    model = models[name]
    clean, corrupt = toks(1, 1), toks(2, 1)
    metric = logit_diff(3, 5)
    result = activation_patching(model, clean, corrupt, metric, "resid_pre", progress=False)
    _, clean_cache = model.run_with_cache(clean)
    for layer, pos in ((0, T - 1), (model.cfg.n_layers - 1, T - 3)):
        def patch(x, hook):
            x = x.clone()
            x[:, pos] = clean_cache[hook.name][:, pos]
            return x

        by_hand = metric(model.run_with_hooks(corrupt, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)]))
        close(result.values[layer, pos], by_hand.to(result.values.dtype), 1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_steering_adds_its_vector_and_decodes_with_the_cache(models, name):
    from circuitlab.analysis.steering import steered_generate, steering, vector_direction

    model = models[name]
    vec = vector_direction(model, torch.linspace(-1, 1, model.cfg.d_model), layer=1)
    tokens = toks(3)
    with steering(model, vec, 2.0):
        steered = model(tokens)
    add = lambda x, hook: x + 2.0 * vec.direction.to(x.dtype)  # noqa: E731
    close(steered, model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", add)]))
    prompt = tokens[:1, :3]
    cached = steered_generate(model, prompt, vec, 2.0, 9, temperature=0)
    with steering(model, vec, 2.0):
        uncached = model.generate(prompt, 9, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", ["gemma2", "olmo2"])
def test_nnsight_reads_the_post_norms(models, name):
    pytest.importorskip("nnsight")
    from circuitlab.pretrained import every_hook_point, to_nnsight

    model = models[name]
    tokens = toks(4)
    _, cache = model.run_with_cache(tokens)
    nn_model = to_nnsight(model)
    with every_hook_point(model), nn_model.trace(tokens):
        scale = nn_model.blocks[0].ln1_post.hook_scale.output.save()
        resid = nn_model.blocks[1].hook_resid_post.output.save()
    close(scale, cache["blocks.0.ln1_post.hook_scale"])
    close(resid, cache["blocks.1.hook_resid_post"])


# ---------------------------------------------------------------- decomposition, DLA, folding, lenses
@pytest.mark.parametrize("name", NAMES)
def test_residual_decomposition_sums_to_the_stream_and_heads_mean_their_share(models, name):
    from circuitlab.analysis.logit_attribution import residual_decomposition

    model = models[name]
    _, cache = model.run_with_cache(toks(5))
    parts = residual_decomposition(model, cache)
    L = model.cfg.n_layers
    close(parts.total(), cache[f"blocks.{L - 1}.hook_resid_post"])
    # A head's part: its result z_h W_O, through the attention post-norm (if any) as the linear map it is
    # with this run's scale: gain * result / scale. Summed over heads, plus the biases' share, that is
    # hook_attn_out exactly.
    layer = L - 1
    result = torch.einsum("bphd,hdm->bphm", cache["z", layer], model.W_O[layer])
    if model.cfg.block_norms != "pre":
        post = model.blocks[layer].ln1_post
        result = result * post.w / cache[f"blocks.{layer}.ln1_post.hook_scale"][:, :, None]
    for h in range(model.cfg.n_heads):
        close(parts.components[parts.labels.index(f"L{layer}H{h}")], result[:, :, h])


@pytest.mark.parametrize("name", NAMES)
def test_direct_logit_attribution_adds_up_to_the_logit_before_the_cap(models, name):
    from circuitlab.analysis.logit_attribution import direct_logit_attribution

    model = models[name]
    tokens = toks(6)
    _, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(model, cache, answer=3, wrong=7)
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, -1]
    raw = raw_logits(model, final)
    close(dla.logit, raw[:, 3] - raw[:, 7])
    close(dla.attributions.sum(0) + dla.constant, dla.logit)


@pytest.mark.parametrize("name", NAMES)
def test_folding_keeps_the_distribution(models, name):
    from circuitlab.analysis.folding import fold_layer_norm

    model = models[name]
    folded = fold_layer_norm(model)
    tokens = toks(7)
    close(folded(tokens).log_softmax(-1), model(tokens).log_softmax(-1))
    assert folded.cfg.embed_scale == 1.0
    if model.cfg.block_norms != "post":
        assert bool((folded.blocks[0].ln1.w == 1).all())


def test_folding_refuses_what_does_not_hold_on_these_families(models):
    from circuitlab import ConfigError
    from circuitlab.analysis.folding import fold_layer_norm

    with pytest.raises(ConfigError, match="^center_unembed assumes logits that are the final norm"):
        fold_layer_norm(models["gemma2"], center_unembed=True)
    sandwich_ln = models["gptj"].cfg.replace(parallel_attn_mlp=False, block_norms="sandwich")
    with pytest.raises(ConfigError, match="^center_writing assumes pre-norm blocks"):
        fold_layer_norm(type(models["gptj"])(sandwich_ln), center_writing=True)


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_ends_at_the_model_output(models, name):
    from circuitlab.analysis.lens import logit_lens

    model = models[name]
    tokens = toks(8, 1)[0]
    lens = logit_lens(model, tokens)
    probs = model(tokens[None])[0].softmax(-1)
    top = probs.argmax(-1)
    assert lens.top_tokens[-1, :, 0].tolist() == top.tolist()


# ---------------------------------------------------------------- input attribution, dictionaries, edges
@pytest.mark.parametrize("name", NAMES)
def test_integrated_gradients_are_complete(models, name):
    from circuitlab.analysis.input_attribution import integrated_gradients

    model = models[name]
    # a token baseline: from zeros the path starts where RMSNorm (eps 1e-6) is too sharp to integrate
    tokens = toks(9, 1)[0]
    result = integrated_gradients(model, tokens, target=3, steps=64, baseline=0)
    assert result.completeness_error < 1e-3
    close(torch.tensor(result.metric_value, dtype=torch.float64), model(tokens[None])[0, -1, 3])  # it explains the model's own logit


@pytest.mark.parametrize("name", NAMES)
def test_spliced_dictionaries_keep_the_logits_exact(models, name):
    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab.dictionaries.splice import splice

    model = models[name]
    d = model.cfg.d_model
    dicts = [SparseDictionary(DictionaryConfig("relu", d_in=d, d_sae=64, hook_name=hook, dtype="float64"), seed=i)
             for i, hook in enumerate(["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"])]
    tokens = toks(10)
    plain = model(tokens)
    with splice(model, dicts):
        close(model(tokens), plain)
        _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.hook_resid_post.hook_sae_acts_post"].shape == (2, T, 64)


@pytest.mark.parametrize("name", NAMES)
def test_edge_graph_forward_equals_the_model(models, name):
    from circuitlab.analysis.edges import EdgeGraph, graph_forward

    model = models[name]
    tokens = toks(11)
    graph = EdgeGraph.of(model)
    run = graph_forward(model, graph, tokens)
    close(run.logits[0], model(tokens))


@pytest.mark.parametrize("name", NAMES)
def test_patching_every_edge_gives_the_reference_run(models, name):
    """Every edge patched to the corrupted run's writer outputs: the corrupted run's logits (these families'
    attention has no bias inside a post-norm, so nothing but the writers differs between the runs)."""
    from circuitlab.analysis.edges import EdgeGraph, graph_forward

    model = models[name]
    graph = EdgeGraph.of(model)
    clean, corrupt = toks(12), toks(13)
    ref = graph_forward(model, graph, corrupt).source_outputs()[0]
    mask = torch.ones(1, len(graph.sources), len(graph.readers), dtype=torch.float64)
    run = graph_forward(model, graph, clean, ref=ref, mask=mask)
    close(run.logits[0], model(corrupt), 1e-8)
