"""Edge graph, EAP / EAP-IG / exact edge patching, circuits and faithfulness, checked against definitions
(patching an edge by hand with hooks, float64) and against circuits known by construction (forge).

(Its tests of other modules moved with issue 38: tests/analysis/edges/test_circuit.py,
tests/analysis/edges/test_edge_graph.py, tests/analysis/edges/test_forward.py,
tests/analysis/edges/test_io.py.)"""
import json

import pytest
import torch

import helpers

from circuitlab import CircuitlabError, ModelConfig
from circuitlab.analysis.edges import (EdgeGraph, circuit_metric, edge_auc, edge_scores, faithfulness_curve,
                                       graph_forward, prune, refine_circuit, select_circuit)
from circuitlab.analysis.edges.io import load_circuit, load_mib, load_scores, save_circuit, save_mib, save_scores
from circuitlab.analysis.patching import kl_to_clean, logit_diff, logprob
from circuitlab.forge import Forge, ResidualLayout, build_induction_model
from circuitlab.forge.adder import EOS, build_carry_adder

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(d_vocab=40, n_ctx=16)
CONFIGS = {
    "gpt2": ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64, **SMALL),
    "llama-gqa": ModelConfig.from_preset("llama-tiny", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=64,
                                         **SMALL),
    "attn-only": ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=4, **SMALL),
    "parallel": ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=32, n_heads=4, d_mlp=64,
                                        parallel_attn_mlp=True, **SMALL),
}


def model_of(name, seed=0):
    return helpers.random_model(CONFIGS[name], seed).double()


def prompts(batch=3, pos=7, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 40, (batch, pos), generator=gen), torch.randint(0, 40, (batch, pos), generator=gen)


# ---------------------------------------------------------------------------- the graph


# ---------------------------------------------------------------------------- exact == by hand with hooks


def _normalize(x):
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()


def hand_patched_metric(model, clean, corrupt, metric, source, reader, weight=1.0):
    """The metric of the clean run with edge source -> reader patched to the corrupted run's output of
    `source`, by plain hooks on the model (GPT-2 style: LayerNorm, learned positions, no GQA).

    The reader's input becomes its residual stream + weight * (corrupted output - current output of source),
    recomputed through the reader's own norm and weights."""
    _, corrupt_cache = model.run_with_cache(corrupt)
    cur = {}

    def output(cache, name):
        if name == "input":
            return cache["hook_embed"] + cache["hook_pos_embed"]
        if name.startswith("MLP"):
            return cache[f"blocks.{name[3:]}.hook_mlp_out"]
        l, h = map(int, name[1:].split("H"))
        return cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.W_O[l, h]

    def save(x, hook):
        cur[hook.name] = x

    delta = lambda: weight * (output(corrupt_cache, source) - output(cur, source))  # noqa: E731
    node, _, kind = reader.partition(".")
    hooks = [(lambda n: n.endswith(("hook_embed", "hook_pos_embed", "hook_z", "hook_mlp_out", "hook_resid_pre",
                                    "hook_resid_mid", "hook_resid_post")), save)]
    if node == "logits":
        last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
        hooks.append(("ln_final.hook_normalized", lambda x, hook: _normalize(cur[last] + delta())))
    elif node.startswith("MLP"):
        l = int(node[3:])
        hooks.append((f"blocks.{l}.ln2.hook_normalized",
                      lambda x, hook: _normalize(cur[f"blocks.{l}.hook_resid_mid"] + delta())))
    else:
        l, h = map(int, node[1:].split("H"))
        W, b = {"q": (model.W_Q, model.b_Q), "k": (model.W_K, model.b_K), "v": (model.W_V, model.b_V)}[kind]
        ln = model.blocks[l].ln1

        def replace(x, hook):
            inp = _normalize(cur[f"blocks.{l}.hook_resid_pre"] + delta()) * ln.w + ln.b
            x = x.clone()
            x[:, :, h] = inp @ W[l, h] + b[l, h]
            return x
        hooks.append((f"blocks.{l}.attn.hook_{kind}", replace))
    return metric(model.run_with_hooks(clean, fwd_hooks=hooks))


def test_exact_edge_patching_equals_patching_by_hand():
    model = model_of("gpt2")
    clean, corrupt = prompts()
    metric = logit_diff(3, 5)
    scores = edge_scores(model, clean, corrupt, metric, method="exact", progress=False)
    with torch.no_grad():
        base = float(metric(model(clean)))
        for source, reader in [("input", "L0H1.q"), ("input", "L1H2.k"), ("L0H3", "L1H0.v"), ("L0H1", "MLP0.in"),
                               ("MLP0", "L1H2.q"), ("L1H2", "MLP1.in"), ("MLP1", "logits"), ("L0H0", "logits")]:
            by_hand = float(hand_patched_metric(model, clean, corrupt, metric, source, reader)) - base
            assert abs(scores.score(source, reader) - by_hand) < 1e-8, (source, reader)
        # every edge patched = the corrupted run; nothing patched = the clean run
        assert abs(scores.ablated_value - float(metric(model(corrupt)))) < 1e-8
    assert abs(scores.clean_value - base) < 1e-10


def test_eap_is_the_first_order_term_by_hand():
    model = model_of("gpt2")
    clean, corrupt = prompts()
    metric = logit_diff(3, 5)
    scores = edge_scores(model, clean, corrupt, metric, method="eap", progress=False)
    for source, reader in [("input", "L1H2.k"), ("L0H3", "L1H0.v"), ("MLP0", "logits"), ("L0H2", "MLP0.in")]:
        w = torch.zeros((), dtype=torch.float64, requires_grad=True)
        value = hand_patched_metric(model, clean, corrupt, metric, source, reader, weight=w)
        (taylor,) = torch.autograd.grad(value, w)
        assert abs(scores.score(source, reader) - float(taylor)) < 1e-8, (source, reader)


def test_methods_agree_where_the_model_is_linear_and_node_scores_are_measured():
    # an attention-only model without norms is linear in the edges that feed the logits directly, so
    # EAP, EAP-IG and exact agree there; exact node scores are the writer patched on all its edges at once
    cfg = ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=4, norm="none", **SMALL)
    model = helpers.random_model(cfg).double()
    clean, corrupt = prompts()
    metric = logit_diff(3, 5)
    runs = {m: edge_scores(model, clean, corrupt, metric, method=m, progress=False) for m in ("eap", "eap-ig", "exact")}
    direct = [runs["exact"].graph.edge_index(s, "logits") for s in runs["exact"].graph.sources]
    for m in ("eap", "eap-ig"):
        assert torch.allclose(runs[m].scores[direct], runs["exact"].scores[direct], atol=1e-9)
    g = runs["exact"].graph
    all_out = torch.zeros(g.n_edges, dtype=torch.bool)
    all_out[[g.edge_index("L0H1", r) for r in g.readers if g.allowed[g.sources.index("L0H1"), g.readers.index(r)]]] = True
    kept = circuit_metric(model, clean, corrupt, metric, [~all_out])
    assert abs(float(kept[0]) - runs["exact"].clean_value - float(runs["exact"].node_scores[g.sources.index("L0H1")])) < 1e-9


@pytest.mark.parametrize("intervention", ["zero", "mean", "position-mean"])
def test_other_interventions_patch_the_reference_by_hand(intervention):
    model = model_of("attn-only")
    clean, _ = prompts()
    metric = logprob(4)
    scores = edge_scores(model, clean, None, metric, method="exact", intervention=intervention, progress=False)
    # patching input -> logits replaces the embeddings in the final residual by their reference
    emb = model.embed(clean) + model.pos_embed(torch.arange(clean.shape[1]))
    ref = {"zero": torch.zeros_like(emb), "mean": emb.mean((0, 1), keepdim=True).expand_as(emb),
           "position-mean": emb.mean(0, keepdim=True).expand_as(emb)}[intervention]
    fix = lambda x, hook: x + ref - emb  # noqa: E731
    with torch.no_grad():
        by_hand = float(metric(model.run_with_hooks(clean, fwd_hooks=[("blocks.1.hook_resid_post", fix)])))
    assert abs(scores.score("input", "logits") - (by_hand - scores.clean_value)) < 1e-9


def test_gqa_scored_natively():
    model = model_of("llama-gqa")
    clean, corrupt = prompts()
    metric = logit_diff(3, 5)
    exact = edge_scores(model, clean, corrupt, metric, method="exact", progress=False)
    eap = edge_scores(model, clean, corrupt, metric, method="eap", progress=False)
    assert exact.graph.n_edges == eap.graph.n_edges == len(exact.scores)
    assert exact.score("L0H1", "L1KV0.v") != 0.0
    assert torch.corrcoef(torch.stack([exact.scores, eap.scores]))[0, 1] > 0.5


# ---------------------------------------------------------------------------- truth by construction


def induction_task(d_vocab=20, batch=8, half=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, d_vocab, (batch, half), generator=gen)
    b = torch.randint(0, d_vocab, (batch, half), generator=gen)
    return torch.cat([a, a], 1), torch.cat([b, b], 1), logprob(a[:, 0], pos=-1)


def decoy_model(d_vocab=12, n_ctx=16):
    """L0H0 copies the previous token into "prev"; L1H0 copies its own position's "prev" into "out", read by
    the unembedding. Decoys L0H1 and L1H1 copy tokens into "junk", which nothing reads."""
    layout = ResidualLayout({"tok": d_vocab, "pos": n_ctx, "prev": d_vocab, "out": d_vocab, "junk": d_vocab})
    f = Forge(layout, n_layers=2, n_heads=2, d_head=max(n_ctx, d_vocab), d_vocab=d_vocab, n_ctx=n_ctx,
              positional="learned")
    for t in range(d_vocab):
        f.embed(t, tok=torch.eye(d_vocab)[t])
        f.unembed(t, out=torch.eye(d_vocab)[t] * 5)
    for p in range(n_ctx):
        f.pos(p, pos=torch.eye(n_ctx)[p])
    shift = torch.diag(torch.ones(n_ctx - 1), diagonal=1)
    f.head(0, 0).q("pos", 20.0, into=0).k("pos", shift, into=0).v("tok", 1.0, into=0).o("prev", 1.0, from_=0)
    f.head(0, 1).q("pos", 20.0, into=0).k("pos", 1.0, into=0).v("tok", 1.0, into=0).o("junk", 1.0, from_=0)
    f.head(1, 0).q("pos", 20.0, into=0).k("pos", 1.0, into=0).v("prev", 1.0, into=0).o("out", 1.0, from_=0)
    f.head(1, 1).v("tok", 1.0, into=0).o("junk", 1.0, from_=0)
    return f.model


def test_decoy_heads_that_write_but_are_never_read_score_zero():
    model = decoy_model().double()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 12, (6, 10), generator=gen), torch.randint(0, 12, (6, 10), generator=gen)
    metric = logprob(clean[:, -2], pos=-1)  # the previous token
    truth = [("input", "L0H0.v"), ("L0H0", "L1H0.v"), ("L1H0", "logits")]
    for method in ("eap", "eap-ig", "exact"):
        scores = edge_scores(model, clean, corrupt, metric, method=method, progress=False)
        assert edge_auc(scores, truth) == 1.0, method
        assert edge_auc(scores.scores, truth, scores.graph) == 1.0, method
        with pytest.raises(CircuitlabError, match="need their graph"):  # a bare tensor names no edges
            edge_auc(scores.scores, truth)
        g = scores.graph
        for decoy in ("L0H1", "L1H1"):  # they write (their outputs differ between the runs) but nothing reads
            out = [i for i, (s, _) in enumerate(g.edges) if s == decoy]
            assert scores.scores[out].abs().max() < 1e-12
    with torch.no_grad():
        run = graph_forward(model, EdgeGraph.of(model), clean)
        assert run.outputs[1][1][..., 1, :].abs().max() > 0.5  # L0H1 does write


# ---------------------------------------------------------------------------- circuits and faithfulness


def test_bad_requests_are_one_line_errors():
    model = model_of("attn-only")
    clean, corrupt = prompts()
    metric = logit_diff(3, 5)
    with pytest.raises(CircuitlabError, match="same shape"):
        edge_scores(model, clean, corrupt[:, :-1], metric)
    with pytest.raises(CircuitlabError, match="unknown method"):
        edge_scores(model, clean, corrupt, metric, method="acdc")
    with pytest.raises(CircuitlabError, match="needs corrupted prompts"):
        edge_scores(model, clean, None, metric)
    with pytest.raises(CircuitlabError, match="constant"):
        edge_scores(model, clean, corrupt, lambda logits: torch.tensor(1.0), method="eap")
    scores = edge_scores(model, clean, corrupt, metric, progress=False)
    with pytest.raises(CircuitlabError, match="keeps no edge"):
        select_circuit(scores, threshold=1e9)


def test_per_position_scores_sum_to_the_edge_scores_and_point_at_the_right_positions():
    model = build_induction_model(d_vocab=20, n_ctx=32).model.double()
    clean, corrupt, metric = induction_task()  # [a, a] with 8 tokens per copy; the metric reads position 15
    for method in ("eap", "eap-ig"):
        scores = edge_scores(model, clean, corrupt, metric, method=method, per_position=True, progress=False)
        plain = edge_scores(model, clean, corrupt, metric, method=method, progress=False)
        assert scores.position_scores.shape == (scores.graph.n_edges, 16)
        assert torch.allclose(scores.position_scores.sum(1), plain.scores, atol=1e-10)
        at = lambda s, r: scores.position_scores[scores.graph.edge_index(s, r)].abs().argmax().item()  # noqa: E731
        # the query and the output act where the metric reads; the key found there is the one after the
        # earlier copy of the last token (position 8, whose previous token a[7] is the query's token)
        assert at("input", "L1H0.q") == at("L1H0", "logits") == 15
        assert at("L0H0", "L1H0.k") == 8 and at("input", "L1H0.v") == 8
    with pytest.raises(CircuitlabError, match="per-position"):
        edge_scores(model, clean, corrupt, metric, method="exact", per_position=True)
