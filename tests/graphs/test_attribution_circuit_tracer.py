"""Attribution graphs against circuit-tracer 0.5.0 on the same weights, in circuit-tracer's own virtual
environment (the one benchmarks/bench_graphs.py builds: `python benchmarks/bench_graphs.py --setup`; these
tests skip, saying so, where it is absent).

Each case writes the model as a TransformerLens config + state dict (circuitlab.pretrained.to_transformer_lens),
a transcoder set in circuit-tracer's layout (config.yaml naming feature_input_hook / feature_output_hook +
layer_{i}.safetensors) and a prompt (token 0, the special token, first); circuit-tracer attributes, prunes and
scores them in one process (benchmarks/_graphs_peer.py), and circuitlab does the same on the set read through its
own importer (Transcoders.load, bound to the model). Checked: the same active features in the same node order,
the same logit targets, adjacency within 1e-4 of max |A|, the same replacement and completeness scores, the same
pruned node set.

- a tiny Gemma-2 (random Hugging Face config -> our importer) with a binding final-logit soft-cap: the logit
  before the cap is attributed, the targets picked by the capped probabilities (circuit-tracer's convention);
- a GPT-2-style model (learned positions): with token_nodes="W_E" the whole graph equals circuit-tracer's, with
  the default ("embedding": W_E + W_pos) only the token columns differ;
- every hook circuit-tracer's transcoder configs name (hook_resid_mid, ln2.hook_normalized, mlp.hook_in in;
  hook_mlp_out, mlp.hook_out out) on a pre-norm (GPT-2-style, LayerNorm) and a post-norm (Gemma-2) model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from circuitlab import ModelConfig
from circuitlab.graphs import Transcoders, attribute

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = ROOT / "benchmarks" / "_graphs_peer.py"
PEER_DIR = Path(os.environ.get("CIRCUITLAB_PEERS", Path.home() / ".cache" / "circuitlab-peers")) / "circuit-tracer"
REL_TOL = 1e-4
TL_KEYS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "act_fn", "eps",
           "normalization_type", "use_attn_scale", "attn_scale", "positional_embedding_type", "rotary_dim",
           "rotary_base", "rotary_adjacent_pairs", "default_prepend_bos", "n_key_value_heads", "gated_mlp",
           "use_normalization_before_and_after", "attn_scores_soft_cap", "output_logits_soft_cap", "use_local_attn",
           "window_size", "attn_types", "use_qk_norm", "original_architecture", "parallel_attn_mlp")
IN_HOOKS = ("hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in")
OUT_HOOKS = ("hook_mlp_out", "mlp.hook_out")


@pytest.fixture(scope="module")
def peer_python() -> Path:
    py = PEER_DIR / "bin" / "python"
    if not py.exists():
        pytest.skip(f"circuit-tracer's virtual environment is absent ({PEER_DIR}); build it with "
                    "`python benchmarks/bench_graphs.py --setup`")
    done = subprocess.run([str(py), "-c", "import circuit_tracer, transformer_lens"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"circuit-tracer does not import in {PEER_DIR}: {done.stderr.strip().splitlines()[-1:]}")
    return py


# ---------------------------------------------------------------------------- the models

def gpt2_style():
    """3 layers, LayerNorm with random gains and biases, learned positions, GELU (float32)."""
    from helpers import random_model

    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=48, n_heads=4, d_mlp=96, n_ctx=32, d_vocab=64)
    return random_model(cfg, scale=1.0, noise=0.3).eval()


def gemma2(folder: Path):
    """A tiny random Gemma-2 through our importer: sandwich norms, GeGLU, GQA, attention and final-logit soft-caps
    that bind (the final cap 2.5 on logits of a few units), a sliding window shorter than the prompt."""
    transformers = pytest.importorskip("transformers")
    from circuitlab.pretrained import load_pretrained
    from pretrained.test_importer import randomise

    config = transformers.Gemma2Config(vocab_size=61, bos_token_id=1, eos_token_id=1, num_hidden_layers=2,
                                       hidden_size=36, num_attention_heads=3, num_key_value_heads=1, head_dim=12,
                                       intermediate_size=50, max_position_embeddings=32, query_pre_attn_scalar=20,
                                       attn_logit_softcapping=3.0, final_logit_softcapping=2.5, sliding_window=5)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Gemma2ForCausalLM(config).eval()
    randomise(hf, 0)
    hf.save_pretrained(folder)
    model, _ = load_pretrained(folder, tokenizer=False)
    assert model.cfg.logit_softcap == 2.5
    return model.float().eval()


def prompt(model, n: int = 9, seed: int = 1) -> torch.Tensor:
    rest = torch.randint(2, model.cfg.d_vocab, (n - 1,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.zeros(1, dtype=torch.long), rest])


# ---------------------------------------------------------------------------- writing a case, running both

def write_case(folder: Path, model, tokens: torch.Tensor, hook_in: str, hook_out: str, d_sae: int = 24,
               seed: int = 0) -> None:
    """The peer's inputs: TransformerLens config + state dict, a JumpReLU skip-transcoder set in circuit-tracer's
    layout reading hook_in and writing hook_out (thresholds 0: about half the features fire at any scale)."""
    from circuitlab.pretrained import to_transformer_lens

    folder.mkdir(parents=True)
    tl = to_transformer_lens(model)
    cfg = {k: getattr(tl.cfg, k) for k in TL_KEYS if getattr(tl.cfg, k, None) is not None}
    cfg["dtype"] = "float32"
    save_file({k: v.contiguous() for k, v in tl.state_dict().items()}, str(folder / "tl_model.safetensors"))
    d, n = model.cfg.d_model, model.cfg.n_layers
    g = torch.Generator().manual_seed(seed)
    tc = folder / "transcoders"
    tc.mkdir()
    for layer in range(n):
        save_file({"W_enc": torch.randn(d_sae, d, generator=g) / d**0.5,
                   "W_dec": 0.3 * torch.randn(d_sae, d, generator=g), "b_enc": torch.zeros(d_sae),
                   "b_dec": 0.1 * torch.randn(d, generator=g), "W_skip": 0.1 * torch.randn(d, d, generator=g),
                   "activation_function.threshold": torch.zeros(d_sae)}, str(tc / f"layer_{layer}.safetensors"))
    (tc / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "transcoder_set", "scan": "circuitlab-parity", "feature_input_hook": hook_in,
        "feature_output_hook": hook_out, "transcoders": [f"layer_{i}.safetensors" for i in range(n)]}))
    (folder / "spec.json").write_text(json.dumps({
        "tl_config": cfg, "tokens": tokens.tolist(), "threads": 1, "repeats": 1, "max_n_logits": 10,
        "desired_logit_prob": 0.95, "batch_size": 64, "max_feature_nodes": None, "node_threshold": 0.8,
        "edge_threshold": 0.98}))


def run_peer(py: Path, folders: list[Path]) -> list[dict]:
    """circuit-tracer on every folder, in one process: its adjacency, features, targets, pruned nodes and scores."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(py), str(PEER_SCRIPT), *map(str, folders)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [{**load_file(str(f / "peer.safetensors")), **json.loads((f / "peer.json").read_text())} for f in folders]


def ours(model, folder: Path, tokens: torch.Tensor, token_nodes: str = "W_E"):
    """Our graph of the same case: the set read by our importer (bound to the model), position 0 a sink."""
    tc = Transcoders.load(model, folder / "transcoders")
    graph = attribute(model, tc, tokens, bos=True, batch_size=64, token_nodes=token_nodes)
    return graph, graph.prune(0.8, 0.98), graph.scores()


def compare(graph, pruned, scores, peer: dict) -> dict:
    """The parity figures; asserts same features, targets and node count."""
    assert torch.equal(graph.active_features, peer["active_features"]), "active features differ"
    assert graph.logit_tokens.tolist() == peer["logit_tokens"].tolist(), "logit targets differ"
    a, b = graph.adjacency.double(), peer["adjacency"].double()
    assert a.shape == b.shape
    return {"rel": float((a - b).abs().max() / b.abs().max()),
            "replacement": (scores["replacement"], peer["replacement"]),
            "completeness": (scores["completeness"], peer["completeness"]),
            "same_pruned": torch.equal(pruned.node_mask, peer["node_mask"]),
            "nodes": graph.n_nodes, "features": graph.n_features, "pruned": int(pruned.node_mask.sum()),
            "peer_pruned": int(peer["node_mask"].sum())}


def assert_equal_graphs(fig: dict, what: str) -> None:
    print(f"{what}: {fig['nodes']} nodes ({fig['features']} features), max |ours - circuit-tracer| / max |A| = "
          f"{fig['rel']:.1e}; replacement {fig['replacement'][0]:.6f} vs {fig['replacement'][1]:.6f}, completeness "
          f"{fig['completeness'][0]:.6f} vs {fig['completeness'][1]:.6f}; pruned {fig['pruned']} vs "
          f"{fig['peer_pruned']} nodes, same set {fig['same_pruned']}")
    assert fig["rel"] <= REL_TOL, what
    for key in ("replacement", "completeness"):
        assert fig[key][0] == pytest.approx(fig[key][1], abs=1e-5), (what, key)
    assert fig["same_pruned"], what


# ---------------------------------------------------------------------------- the checks

def test_soft_capped_gemma2_graph_equals_circuit_tracers(peer_python, tmp_path):
    model = gemma2(tmp_path / "hf")
    tokens = prompt(model)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        capped, cache = model.run_with_cache(tokens[None], names_filter=[last])
        capped, raw = capped[0, -1], model.readout(cache[last], soft_cap=False)[0, -1]
    assert float((capped - raw).abs().max()) > 0.5   # the cap binds on this prompt
    write_case(tmp_path / "case", model, tokens, "mlp.hook_in", "hook_mlp_out")   # circuit-tracer's Gemma setup
    peer, = run_peer(peer_python, [tmp_path / "case"])
    graph, pruned, scores = ours(model, tmp_path / "case", tokens)
    assert graph.logit_weights.tolist() == pytest.approx(peer["logit_probs"].tolist(), abs=1e-5)   # capped probs
    probs = capped.double().softmax(-1)[graph.logit_tokens]
    assert graph.logit_weights.tolist() == pytest.approx(probs.tolist(), abs=1e-6)
    assert_equal_graphs(compare(graph, pruned, scores, peer), "gemma-2 soft-capped")
    # Rotary positions: the default token nodes are the same graph.
    default, _, _ = ours(model, tmp_path / "case", tokens, token_nodes="embedding")
    assert torch.equal(default.adjacency, graph.adjacency)


def test_learned_positions_graph_equals_circuit_tracers_with_w_e_token_nodes(peer_python, tmp_path):
    model = gpt2_style()
    tokens = prompt(model, n=12)
    write_case(tmp_path / "case", model, tokens, "hook_resid_mid", "hook_mlp_out")
    peer, = run_peer(peer_python, [tmp_path / "case"])
    graph, pruned, scores = ours(model, tmp_path / "case", tokens, token_nodes="W_E")
    assert_equal_graphs(compare(graph, pruned, scores, peer), "gpt-2-style, token_nodes=W_E")
    # The default (W_E + W_pos): every column but the tokens' is the same, the token columns differ.
    full, full_pruned, full_scores = ours(model, tmp_path / "case", tokens, token_nodes="embedding")
    fig = compare(full, full_pruned, full_scores, peer)
    t0, t1 = full.token_start, full.logit_start
    rest = torch.cat([torch.arange(t0), torch.arange(t1, full.n_nodes)])
    a, b = full.adjacency.double(), peer["adjacency"].double()
    assert float((a[:, rest] - b[:, rest]).abs().max() / b.abs().max()) <= REL_TOL
    token_rel = float((a[:, t0:t1] - b[:, t0:t1]).abs().max() / b.abs().max())
    print(f"gpt-2-style, token_nodes=embedding: token columns differ by {token_rel:.3f} of max |A|; replacement "
          f"{fig['replacement'][0]:.4f} vs {fig['replacement'][1]:.4f}; pruned {fig['pruned']} vs {fig['peer_pruned']}")
    assert token_rel > 1e-2


@pytest.mark.parametrize("family", ["pre-norm (GPT-2-style, LayerNorm)", "post-norm (Gemma-2)"])
def test_every_circuit_tracer_hook_reads_what_circuit_tracer_reads(peer_python, tmp_path, family):
    """Each feature_input_hook x feature_output_hook pair of circuit-tracer's transcoder configs: the same graph."""
    model = gpt2_style() if family.startswith("pre") else gemma2(tmp_path / "hf")
    tokens = prompt(model, n=8, seed=2)
    pairs = [(i, o) for i in IN_HOOKS for o in OUT_HOOKS]
    folders = [tmp_path / f"{i}--{o}" for i, o in pairs]
    for (i, o), folder in zip(pairs, folders):
        write_case(folder, model, tokens, i, o, seed=7)
    peers = run_peer(peer_python, folders)
    failed = []
    for (i, o), folder, peer in zip(pairs, folders, peers):
        graph, pruned, scores = ours(model, folder, tokens)
        try:
            assert_equal_graphs(compare(graph, pruned, scores, peer), f"{family}: {i} -> {o}")
        except AssertionError as e:
            failed.append(f"{i} -> {o}: {e}")
    assert not failed, failed
