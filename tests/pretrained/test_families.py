"""The newer families in and out: Gemma-2, Gemma-3 (text), Qwen3, OLMo-2, Phi-3 and GPT-J.

Tiny random HF models built from configs (no hub), on odd sizes: widths not a multiple of anything,
several GQA ratios, sliding windows shorter than the prompt (so the window matters), soft-caps small
enough to bind. Import gives HF's logits (<= 1e-4, fp32); export gives a folder `transformers` loads
with our logits; a saved circuitlab checkpoint reloads the same model.
"""
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from circuitlab import CircuitlabError  # noqa: E402
from circuitlab.pretrained import export_hf, load_pretrained  # noqa: E402
from circuitlab.training import load_checkpoint, save_checkpoint  # noqa: E402
from pretrained.test_importer import randomise  # noqa: E402

VOCAB = 61
TOL = 1e-4
PROMPT = 14  # longer than every window below

# name -> (HF config class, HF model class, config fields)
CASES = {
    # 3 layers (sliding, full, sliding), MQA, head_dim 10 != d_model / heads, binding soft-caps, window 4
    "gemma2-mqa-caps": ("Gemma2Config", "Gemma2ForCausalLM",
                        dict(num_hidden_layers=3, hidden_size=36, num_attention_heads=3, num_key_value_heads=1,
                             head_dim=10, intermediate_size=50, max_position_embeddings=32,
                             query_pre_attn_scalar=20, attn_logit_softcapping=1.5, final_logit_softcapping=2.5,
                             sliding_window=4)),
    "gemma2-gqa-untied": ("Gemma2Config", "Gemma2ForCausalLM",
                          dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=6, intermediate_size=22, max_position_embeddings=32, sliding_window=5,
                               tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                           "rope_theta": 500.0})),
    # local/global pattern with their own rope bases (global scaled linearly), window 3
    "gemma3-pattern": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                       dict(num_hidden_layers=4, hidden_size=28, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, intermediate_size=34, max_position_embeddings=32, sliding_window=3,
                            query_pre_attn_scalar=12,
                            layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                         "full_attention"],
                            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 3000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
    "qwen3-gqa5": ("Qwen3Config", "Qwen3ForCausalLM",
                   dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=5, num_key_value_heads=1,
                        head_dim=6, intermediate_size=26, max_position_embeddings=32, rope_theta=7000.0,
                        tie_word_embeddings=True)),
    "qwen3-window-bias": ("Qwen3Config", "Qwen3ForCausalLM",
                          dict(num_hidden_layers=3, hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, intermediate_size=20, max_position_embeddings=32, use_sliding_window=True,
                               sliding_window=4, max_window_layers=1, attention_bias=True)),
    "olmo2-gqa": ("Olmo2Config", "Olmo2ForCausalLM",
                  dict(num_hidden_layers=2, hidden_size=36, num_attention_heads=6, num_key_value_heads=2,
                       intermediate_size=46, max_position_embeddings=32, rope_theta=900.0)),
    "olmo2-mha": ("Olmo2Config", "Olmo2ForCausalLM",
                  dict(num_hidden_layers=3, hidden_size=20, num_attention_heads=2, num_key_value_heads=2,
                       intermediate_size=18, max_position_embeddings=32)),
    "phi3-gqa-window": ("Phi3Config", "Phi3ForCausalLM",
                        dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=38, max_position_embeddings=32, sliding_window=5,
                             pad_token_id=0)),
    "phi3-partial": ("Phi3Config", "Phi3ForCausalLM",
                     dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=4, num_key_value_heads=4,
                          intermediate_size=30, max_position_embeddings=32, partial_rotary_factor=0.6,
                          pad_token_id=0, tie_word_embeddings=True)),
    "gptj-partial": ("GPTJConfig", "GPTJForCausalLM",
                     dict(n_layer=2, n_embd=48, n_head=4, rotary_dim=6, n_inner=50, n_positions=32)),
    "gptj-full-rotary": ("GPTJConfig", "GPTJForCausalLM",
                         dict(n_layer=3, n_embd=30, n_head=3, rotary_dim=10, n_positions=32,
                              activation_function="gelu")),
}


def make_hf(case: str, folder, seed: int = 0):
    config_cls, model_cls, fields = CASES[case]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, bos_token_id=1, eos_token_id=1, **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    randomise(model, seed)
    model.save_pretrained(folder)
    return model


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(input_ids=ids).logits


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = {}
    for case in CASES:
        folder = tmp_path_factory.mktemp(case)
        hf = make_hf(case, folder)
        model, _ = load_pretrained(folder, tokenizer=False)
        out[case] = (hf, model, folder)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_import_gives_hf_logits(imported, case):
    hf, model, _ = imported[case]
    ids = prompt()
    ours = model(ids)
    theirs = hf_logits(hf, ids)
    assert (ours - theirs).abs().max().item() <= TOL
    # the hooked (eager) path computes the same function as the fast one
    with model.hooks([(lambda n: n.endswith("hook_pattern"), lambda t, hook: None)]):
        assert (model(ids) - ours).abs().max().item() <= TOL


@pytest.mark.parametrize("case", list(CASES))
def test_export_loads_in_transformers_with_our_logits(imported, case, tmp_path):
    hf, model, _ = imported[case]
    style = {"phi3": "phi3"}.get(CASES[case][0].removesuffix("Config").lower())
    out = export_hf(model, tmp_path / "hf", style=style)
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(back).__name__ == CASES[case][1]
    ids = prompt(2)
    assert (hf_logits(back, ids) - model(ids)).abs().max().item() <= TOL
    again, _ = load_pretrained(out, tokenizer=False)
    assert again.cfg == dataclasses.replace(model.cfg, name=again.cfg.name)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("case", ["gemma2-mqa-caps", "gemma3-pattern", "olmo2-gqa", "gptj-partial"])
def test_saved_checkpoint_reloads_exactly(imported, case, tmp_path):
    _, model, _ = imported[case]
    save_checkpoint(tmp_path / "m", model)
    back = load_checkpoint(tmp_path / "m")[0]
    assert back.cfg == model.cfg
    ids = prompt(3)
    assert torch.equal(back(ids), model(ids))


def test_the_switches_matter_on_these_configs(imported):
    """Turning a switch off changes the logits: the tests above exercise each one (the window is shorter
    than the prompt, the soft-caps bind, the local rope base differs)."""
    def changed(case, **off):
        _, model, _ = imported[case]
        other = type(model)(model.cfg.replace(**off)).eval()
        other.load_state_dict(model.state_dict())
        ids = prompt()
        return (other(ids) - model(ids)).abs().max().item()

    assert changed("gemma2-mqa-caps", attn_softcap=None) > 1e-2
    assert changed("gemma2-mqa-caps", logit_softcap=None) > 1e-1
    assert changed("gemma2-mqa-caps", sliding_window=None, sliding_layers=None) > 1e-2
    assert changed("gemma3-pattern", local_rotary_base=None) > 1e-2
    assert changed("qwen3-window-bias", sliding_window=None, sliding_layers=None) > 1e-2
    assert changed("phi3-gqa-window", sliding_window=None) > 1e-2
    assert changed("gptj-partial", rotary_interleaved=False) > 1e-2


def test_generation_with_the_kv_cache_respects_windows(imported):
    for case in ("gemma2-mqa-caps", "gemma3-pattern", "phi3-gqa-window"):
        _, model, _ = imported[case]
        ids = prompt()[:, :3]
        cached = model.generate(ids, 12, temperature=0, use_cache=True)
        assert torch.equal(cached, model.generate(ids, 12, temperature=0, use_cache=False))


def test_unsupported_switches_are_refused_in_one_line(tmp_path):
    from circuitlab.pretrained import model_config_from_hf

    base = dict(model_type="phi3", hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=50,
                intermediate_size=20, max_position_embeddings=64)
    with pytest.raises(CircuitlabError, match="'dynamic' rotary scaling") as e:
        model_config_from_hf({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert "\n" not in str(e.value)
    with pytest.raises(CircuitlabError, match="activation 'relu'"):
        model_config_from_hf({**base, "model_type": "gemma2", "hidden_activation": "relu"})
    with pytest.raises(CircuitlabError, match="chunked_attention"):
        model_config_from_hf({**base, "model_type": "gemma3_text",
                              "layer_types": ["chunked_attention", "full_attention"]})


def test_unhooked_attention_takes_sdpa_except_under_a_soft_cap(imported, monkeypatch):
    import torch.nn.functional as F

    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, gemma3, _ = imported["gemma3-pattern"]  # sliding windows, no soft-cap: SDPA with a mask
    gemma3(prompt())
    assert len(calls) == gemma3.cfg.n_layers
    calls.clear()
    _, gemma2, _ = imported["gemma2-mqa-caps"]  # soft-capped: the eager path (SDPA has no soft-cap)
    gemma2(prompt())
    assert calls == []


# ---------------------------------------------------------------- TransformerLens 3.x parity
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_transformer_lens_gives_the_same_logits_and_hook_values(imported, case):
    from circuitlab.pretrained import to_transformer_lens

    pytest.importorskip("transformer_lens")
    _, model, _ = imported[case]
    ref = to_transformer_lens(model)
    ids = prompt(4)
    logits, cache = model.run_with_cache(ids)
    ref_logits, ref_cache = ref.run_with_cache(ids)
    torch.testing.assert_close(ref_logits, logits, atol=TOL, rtol=1e-5)
    rename = {}
    if model.cfg.block_norms == "post":  # TransformerLens's OLMo-2 calls our ln1_post / ln2_post ln1 / ln2
        rename = {f"blocks.{l}.{ours}.{h}": f"blocks.{l}.{theirs}.{h}" for l in range(model.cfg.n_layers)
                  for ours, theirs in (("ln1_post", "ln1"), ("ln2_post", "ln2"))
                  for h in ("hook_scale", "hook_normalized")}
    names = [n for n in model.hook_names() if rename.get(n, n) in ref_cache.cache_dict]
    assert len(names) >= 10 * model.cfg.n_layers  # resid, q/k/v, z, pattern, scores, norms, mlp...
    for name in names:
        theirs = ref_cache[rename.get(name, name)]
        if ".attn.q_norm." in name or ".attn.k_norm." in name:  # TransformerLens flattens (batch, pos, head)
            theirs = theirs.reshape(cache[name].shape)
        torch.testing.assert_close(theirs, cache[name], atol=TOL, rtol=1e-4, msg=name)


# ---------------------------------------------------------------- hub names, shards, bf16
HUB_NAMES = {"google/gemma-2-2b": "gemma2-mqa-caps", "google/gemma-3-1b-pt": "gemma3-pattern",
             "Qwen/Qwen3-0.6B": "qwen3-gqa5", "allenai/OLMo-2-0425-1B": "olmo2-gqa",
             "microsoft/Phi-3-mini-4k-instruct": "phi3-gqa-window", "EleutherAI/gpt-j-6b": "gptj-partial"}


def test_hub_names_resolve_to_their_family_from_the_local_cache(imported, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    from circuitlab.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "cache"
    for hub_name, case in HUB_NAMES.items():
        repo = cache / ("models--" + hub_name.replace("/", "--"))
        snapshot = repo / "snapshots" / ("b" * 40)
        snapshot.mkdir(parents=True)
        for file in imported[case][2].iterdir():
            (snapshot / file.name).write_bytes(file.read_bytes())
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("b" * 40)
        out = tmp_path / hub_name.replace("/", "_")
        assert main(["import", hub_name, "--out", str(out), "--cache-dir", str(cache), "--no-tokenizer"]) == 0
        model = load_checkpoint(out)[0]
        reference = imported[case][1]
        assert model.cfg == dataclasses.replace(reference.cfg, name=hub_name)
        assert torch.equal(model(prompt(5)), reference(prompt(5)))
    capsys.readouterr()
    assert main(["import", "google/gemma-2-9b", "--out", str(tmp_path / "x"), "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert "could not be fetched" in err and "\n" not in err and not (tmp_path / "x").exists()


def test_sharded_bf16_checkpoints_load_in_bf16(imported, tmp_path):
    hf = imported["gemma3-pattern"][0]
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size="20KB")
    hf.float()
    assert len(list((tmp_path / "bf16").glob("model-*.safetensors"))) > 2
    model, _ = load_pretrained(tmp_path / "bf16", dtype=torch.bfloat16, compute_dtype=torch.bfloat16, tokenizer=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.embed.weight, hf.model.embed_tokens.weight.to(torch.bfloat16))
    as_fp32, _ = load_pretrained(tmp_path / "bf16", tokenizer=False)
    hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16,
                                                                attn_implementation="eager").eval()
    ids = prompt(6)
    exact = as_fp32(ids)  # the bf16 weights in fp32 arithmetic
    held, _ = load_pretrained(tmp_path / "bf16", dtype=torch.bfloat16, tokenizer=False)  # default: fp32 compute
    assert held.storage_dtype == torch.bfloat16 and held.compute_dtype == torch.float32
    torch.testing.assert_close(held(ids), exact, atol=1e-5, rtol=1e-5)  # the same arithmetic
    ours = (model(ids).float() - exact).abs().mean().item()
    theirs = (hf_logits(hf_bf16, ids).float() - exact).abs().mean().item()
    assert ours < 2 * theirs  # bf16 arithmetic about as close to fp32 as transformers' own bf16 run


# ---------------------------------------------------------------- TransformerLens's TransformerBridge (TL 4)
def assert_bridge_matches(model, bridge, ids) -> int:
    """Same logits and the same values under every shared hook name (masked scores: finfo.min there, -inf
    here; q/k norm scales laid out [batch, head, pos, 1] there); returns how many hooks were compared.
    TransformerLens's GPT-J adapter fires hook_attn_scores with the pattern (a TransformerLens quirk,
    checked: it equals our hook_pattern), so GPT-J's scores are compared with our pattern."""
    logits, cache = model.run_with_cache(ids)
    ref_logits, ref_cache = bridge.run_with_cache(ids)
    torch.testing.assert_close(ref_logits, logits, atol=TOL, rtol=1e-5)
    names = [n for n in cache.acts if n in ref_cache.cache_dict]
    for name in names:
        ours, theirs = cache[name], ref_cache[name]
        if theirs.shape != ours.shape and theirs.dim() == 4 and theirs.transpose(1, 2).shape == ours.shape:
            theirs = theirs.transpose(1, 2)
        if name.endswith("hook_attn_scores") and model.cfg.rotary_interleaved:
            ours = cache[name.replace("hook_attn_scores", "hook_pattern")]
        elif name.endswith("hook_attn_scores"):
            keep = torch.isfinite(ours)
            ours, theirs = ours[keep], theirs[keep]
        torch.testing.assert_close(theirs, ours, atol=TOL, rtol=1e-4, msg=name)
    return len(names)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", ["gemma2-mqa-caps", "gemma3-pattern", "qwen3-gqa5", "olmo2-gqa", "phi3-partial",
                                  "gptj-partial"])
def test_transformer_bridge_gives_the_same_logits_and_hook_values(imported, case):
    pytest.importorskip("transformer_lens.model_bridge")
    from circuitlab.pretrained import to_transformer_bridge

    _, model, _ = imported[case]
    assert assert_bridge_matches(model, to_transformer_bridge(model), prompt(7)) >= 8 * model.cfg.n_layers


def test_cli_exports_phi3_when_asked_and_refuses_a_style_that_does_not_fit(imported, tmp_path, capsys):
    from circuitlab.cli import main

    _, model, _ = imported["phi3-partial"]
    save_checkpoint(tmp_path / "phi", model)
    assert main(["export", "--checkpoint", str(tmp_path / "phi"), "--out", str(tmp_path / "hf"), "--style", "phi3"]) == 0
    assert "Phi3ForCausalLM" in capsys.readouterr().out
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert (hf_logits(back, prompt(8)) - model(prompt(8))).abs().max().item() <= TOL
    assert main(["export", "--checkpoint", str(tmp_path / "phi"), "--out", str(tmp_path / "g"), "--style", "gemma2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after transformers' loading bar above)
    assert err.startswith("error:") or "cannot be exported as gemma2" in err
    assert "cannot be exported as gemma2" in err and "mlp='swiglu'" in err
    assert not (tmp_path / "g").exists()


def test_phi3_longrope_switches_to_its_long_factors_past_the_original_context(tmp_path):
    """Phi-3's LongRoPE (128k-context Phi-3, Phi-3.5): short factors up to the original context, long ones for
    longer sequences, cos/sin times the attention factor; both sides of the switch equal transformers."""
    half = 5  # head_dim 10
    CASES["phi3-longrope"] = ("Phi3Config", "Phi3ForCausalLM",
                              dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=30, max_position_embeddings=32, original_max_position_embeddings=8,
                                   pad_token_id=0, rope_parameters={
                                       "rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0 + 0.3 * i for i in range(half)],
                                       "long_factor": [2.0 + 1.5 * i for i in range(half)]}))
    try:
        hf = make_hf("phi3-longrope", tmp_path / "hf")
    finally:
        del CASES["phi3-longrope"]
    model, _ = load_pretrained(tmp_path / "hf", tokenizer=False)
    assert model.cfg.rope_scaling["type"] == "longrope"
    for length in (6, 8, 9, 20):  # short, at the switch, long
        ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
        assert (model(ids) - hf_logits(hf, ids)).abs().max().item() <= TOL, length
    out = export_hf(model, tmp_path / "out", style="phi3")
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    assert (hf_logits(back, ids) - model(ids)).abs().max().item() <= TOL
    again, _ = load_pretrained(out, tokenizer=False)
    assert again.cfg.rope_scaling == model.cfg.rope_scaling
