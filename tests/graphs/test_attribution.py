"""Attribution graphs against truth: a forged model whose MLPs are planted sparse dictionaries (exact
transcoders: zero errors, scores 1.0, the planted path strongest, decoys pruned), and every edge of a
random model's graph checked as an effect in the frozen replacement model (float64, 1e-8).

(Its tests of other modules moved with issue 38: tests/commands/test_graph.py,
tests/graphs/test_attribution_graph.py, tests/graphs/test_replacement.py, tests/graphs/test_transcoders.py,
tests/methods/test_graph.py.)"""
import json

import pytest
import torch

from circuitlab import ModelConfig
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
from circuitlab.errors import CircuitlabError
from circuitlab.graphs import Graph, Intervention, ReplacementModel, Transcoders, attribute, logit_difference
from circuitlab.graphs.export import neuronpedia_json
from circuitlab.graphs.attribution_graph import edge_influence, threshold_for
from circuitlab.graphs.planted import VOCAB, planted_path_model
from helpers import random_model

pytestmark = pytest.mark.usefixtures("one_thread")


def random_transcoder(layer: int, d_model: int, d_sae: int = 40, seed: int = 0, skip: bool = True) -> SparseDictionary:
    cfg = DictionaryConfig("relu", d_in=d_model, d_sae=d_sae, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                           out_hook_name=f"blocks.{layer}.hook_mlp_out", skip=skip, dtype="float64")
    d = SparseDictionary(cfg, seed=seed + layer)
    g = torch.Generator().manual_seed(100 + seed + layer)
    with torch.no_grad():
        d.W_enc.copy_(torch.randn(d.W_enc.shape, generator=g, dtype=torch.float64) / d_model**0.5)
        d.b_enc.copy_(-0.8 + 0.1 * torch.randn(d_sae, generator=g, dtype=torch.float64))  # sparse: a few fire
        d.b_dec.copy_(0.1 * torch.randn(d_model, generator=g, dtype=torch.float64))
        if skip:
            d.W_skip.copy_(0.1 * torch.randn(d.W_skip.shape, generator=g, dtype=torch.float64))
    return d


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=3, d_model=32, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=50)
    model = random_model(cfg, scale=1.0).double().eval()
    tc = Transcoders.per_layer(model, [random_transcoder(layer, 32) for layer in range(3)])
    tokens = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(3))
    graph = attribute(model, tc, tokens, batch_size=16)
    return model, tc, tokens, graph


# ---------------------------------------------------------------------------- planted truth

def test_exact_transcoders_give_zero_errors_scores_one_and_the_models_logits():
    p = planted_path_model()
    rm = ReplacementModel(p.model, p.transcoders, p.tokens)
    assert all(float(e.abs().max()) < 1e-12 for e in rm.errors.values())
    real = p.model(p.tokens[None])
    for features in ("live", "frozen"):
        torch.testing.assert_close(rm.run(features=features).logits, real, atol=1e-12, rtol=0)
    graph = attribute(p.model, p.transcoders, p.tokens)
    assert float(graph.adjacency[:, graph.error_start:graph.token_start].abs().max()) < 1e-12
    s = graph.scores()
    assert s["replacement"] == pytest.approx(1.0, abs=1e-12) and s["completeness"] == pytest.approx(1.0, abs=1e-12)


def auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Probability that a random positive outranks a random negative (ties count half)."""
    pos, neg = scores[positive], scores[~positive]
    greater = (pos[:, None] > neg[None, :]).double().mean()
    ties = (pos[:, None] == neg[None, :]).double().mean()
    return float(greater + 0.5 * ties)


def test_the_planted_path_is_the_strongest_and_the_decoys_are_pruned():
    p = planted_path_model()
    graph = attribute(p.model, p.transcoders, p.tokens)
    path = [graph.index("token", pos=spec[1]) if spec[0] == "token" else
            graph.index("feature", *spec[1:]) if spec[0] == "feature" else graph.logit_start for spec in p.path]
    pruned = graph.prune()
    best = graph.top_paths(1, pruned)[0]
    assert best["nodes"] == path, best["words"]
    kept = pruned.node_mask.nonzero().flatten().tolist()
    kept_features = [tuple(graph.features[i].tolist()) for i in kept if i < graph.n_features]
    assert sorted(kept_features) == [(0, 1, 0), (1, len(p.tokens) - 1, 0)]
    decoys = [i for i in range(graph.n_features) if tuple(graph.features[i, [0, 2]].tolist()) in p.decoys]
    assert decoys and not pruned.node_mask[decoys].any()
    # Edge weights rank the planted edges first: AUC over every (target, source) pair.
    planted = torch.zeros_like(graph.adjacency, dtype=torch.bool)
    for s, t in zip(path[:-1], path[1:]):
        planted[t, s] = True
    area = auc(graph.adjacency.abs().flatten(), planted.flatten())
    print(f"planted-path edge AUC {area:.4f}")
    assert area > 0.99


# ---------------------------------------------------------------------------- every edge is an effect

def measured_effect(rm: ReplacementModel, graph: Graph, target: int, source: int) -> float:
    """How much the target (feature pre-activation or demeaned logit) drops when the source's contribution
    is removed from the frozen replacement model (features held at their reference values)."""
    s = graph.node(source)
    interventions, hooks = [], []
    if s["kind"] == "feature":
        interventions.append(Intervention(s["layer"], s["feature"], value=0.0, pos=s["pos"]))
    elif s["kind"] == "error":
        def drop_error(y, hook, layer=s["layer"], pos=s["pos"]):
            y = y.clone()
            y[:, pos] -= rm.errors[layer][pos]
            return y
        hooks.append((rm.tc.output_hook(s["layer"]), drop_error))
    else:
        def drop_token(x, hook, pos=s["pos"]):
            x = x.clone()
            x[:, pos] -= rm.token_vectors(graph.token_nodes)[pos]
            return x
        hooks.append(("blocks.0.hook_resid_pre", drop_token))

    def value(out):
        t = graph.node(target)
        if t["kind"] == "feature":
            return float(out.pre_acts[t["layer"]][0, t["pos"], t["feature"]])
        last = out.logits[0, -1]
        cap = rm.model.cfg.logit_softcap
        if cap is not None:  # a soft-capped model's graph explains the logit before the cap: undo it
            last = cap * torch.atanh(last / cap)
        return float(last[t["token"]] - last.mean())

    base = value(rm.run(features="frozen"))
    return base - value(rm.run(interventions, features="frozen", fwd_hooks=hooks))


def test_every_kept_edge_and_sampled_dropped_pair_is_an_exact_effect(setup):
    model, tc, tokens, graph = setup
    rm = ReplacementModel(model, tc, tokens)
    pruned = graph.prune()
    gen = torch.Generator().manual_seed(0)
    kept = pruned.edge_mask.nonzero()
    kept = kept[torch.randperm(len(kept), generator=gen)[:12]]
    targets = torch.cat([torch.arange(graph.n_features), torch.arange(graph.logit_start, graph.n_nodes)])
    sources = torch.arange(graph.logit_start)
    pairs = torch.stack([targets[torch.randint(len(targets), (40,), generator=gen)],
                         sources[torch.randint(len(sources), (40,), generator=gen)]], 1)
    dropped = pairs[~pruned.edge_mask[pairs[:, 0], pairs[:, 1]]][:12]
    assert len(kept) >= 5 and len(dropped) >= 5
    for t, s in kept.tolist() + dropped.tolist():
        assert measured_effect(rm, graph, t, s) == pytest.approx(float(graph.adjacency[t, s]), abs=1e-8), \
            (graph.label(t), graph.label(s))
    # Dropped edges carry less edge influence than the least kept one.
    w = graph.weights()
    A = graph.adjacency.clone()
    A[~pruned.node_mask] = 0
    A[:, ~pruned.node_mask] = 0
    scores = edge_influence(A, w)
    cut = threshold_for(scores, pruned.edge_threshold)
    assert bool((scores[dropped[:, 0], dropped[:, 1]] < cut).all())


FAMILIES = {  # what frozen mode handles per family: RMSNorm + GQA, post-norms + full q/k norms, sandwich norms +
    # per-head q/k norms + attention soft-cap + sliding window + GeGLU, parallel attention and MLP
    "llama-gqa": dict(preset="llama-tiny"),
    "olmo2-like": dict(preset="llama-tiny", block_norms="post", qk_norm="full", hook="hook_resid_mid"),  # no ln2
    "gemma2-like": dict(preset="llama-tiny", block_norms="sandwich", qk_norm="head", embed_scale=4.0, attn_softcap=1.5,
                        mlp="geglu", sliding_window=3, sliding_layers=[0], logit_softcap=2.0),
    "neox": dict(preset="gpt2-tiny", positional="rotary", rotary_dim=4, parallel_attn_mlp=True),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_edges_are_effects_on_every_family(family):
    """The frozen linear system (V alone, frozen norms' centring and factor) on each family's switches: sampled
    non-zero edges equal the measured change in float64. Transcoders read ln2's output (the MLP's input)."""
    from circuitlab import Transformer

    spec = dict(FAMILIES[family])
    hook = spec.pop("hook", "ln2.hook_normalized")
    cfg = ModelConfig.from_preset(spec.pop("preset"), n_layers=2, d_model=16, n_heads=4, d_vocab=40, n_ctx=12, **spec)
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", ".bias")):
                p.add_(0.3 * torch.randn_like(p))
    dicts = [random_transcoder(layer, 16, d_sae=24) for layer in range(2)]
    for layer, d in enumerate(dicts):
        d.cfg.hook_name = f"blocks.{layer}.{hook}"
        with torch.no_grad():
            d.b_enc.zero_()  # about half fire, whatever the scale of the hook's activations
    tc = Transcoders.per_layer(model, dicts)
    tokens = torch.randint(0, 40, (7,), generator=torch.Generator().manual_seed(3))
    graph = attribute(model, tc, tokens, batch_size=8)
    rm = ReplacementModel(model, tc, tokens)
    torch.testing.assert_close(rm.run().logits, model(tokens[None]), atol=1e-10, rtol=0)
    nonzero = (graph.adjacency != 0).nonzero()
    assert graph.n_features > 0 and len(nonzero) > 20
    for t, s in nonzero[torch.randperm(len(nonzero), generator=torch.Generator().manual_seed(0))[:10]].tolist():
        assert measured_effect(rm, graph, t, s) == pytest.approx(float(graph.adjacency[t, s]), abs=1e-8), \
            (graph.label(t), graph.label(s))


def test_a_soft_capped_graph_attributes_the_logit_before_the_cap_and_weighs_targets_by_the_real_probabilities():
    """Gemma-2's final-logit soft-cap (circuit-tracer's convention): logit rows are the demeaned logit before the
    cap (the same rows as the uncapped model's), targets and weights the capped model's own probabilities."""
    from circuitlab import Transformer

    cfg = ModelConfig.from_preset("llama-tiny", n_layers=2, d_model=16, n_heads=4, d_vocab=40, n_ctx=12,
                                  block_norms="sandwich", logit_softcap=0.5)
    torch.manual_seed(1)
    capped = Transformer(cfg).double().eval()
    with torch.no_grad():
        capped.unembed.weight.mul_(30)   # logits well past the cap, so it changes the ranking's probabilities
    uncapped = Transformer(cfg.replace(logit_softcap=None)).double().eval()
    uncapped.load_state_dict(capped.state_dict())
    dicts = [random_transcoder(layer, 16, d_sae=24) for layer in range(2)]
    tokens = torch.randint(0, 40, (6,), generator=torch.Generator().manual_seed(2))
    targets = [3, 5, 9]
    a = attribute(capped, Transcoders.per_layer(capped, dicts), tokens, targets=targets)
    b = attribute(uncapped, Transcoders.per_layer(uncapped, dicts), tokens, targets=targets)
    torch.testing.assert_close(a.adjacency, b.adjacency, atol=1e-12, rtol=0)
    probs = capped(tokens[None])[0, -1].softmax(-1)
    assert a.logit_weights.tolist() == pytest.approx(probs[targets].tolist(), abs=1e-12)
    assert not torch.allclose(a.logit_weights, b.logit_weights, atol=1e-3)   # the cap binds
    top = attribute(capped, Transcoders.per_layer(capped, dicts), tokens, max_n_logits=3, desired_logit_prob=0.99)
    assert top.logit_tokens.tolist() == probs.topk(3).indices.tolist()


def test_token_nodes_w_e_are_the_tokens_rows_alone(setup, tmp_path):
    """token_nodes="W_E" (circuit-tracer's): on a learned-position model only the token columns change, to the
    effect of W_E[token] alone (measured); the field is saved, and a file written before it reads as "embedding"."""
    model, tc, tokens, graph = setup
    w_e = attribute(model, tc, tokens, batch_size=16, token_nodes="W_E")
    t0, t1 = graph.token_start, graph.logit_start
    keep = torch.ones(graph.n_nodes, dtype=torch.bool)
    keep[t0:t1] = False
    torch.testing.assert_close(w_e.adjacency[:, keep], graph.adjacency[:, keep], atol=1e-12, rtol=0)
    assert float((w_e.adjacency[:, t0:t1] - graph.adjacency[:, t0:t1]).abs().max()) > 1e-3   # W_pos matters
    rm = ReplacementModel(model, tc, tokens)
    torch.testing.assert_close(rm.token_vectors("W_E"), model.token_embeddings(tokens), atol=0, rtol=0)
    rows = torch.cat([torch.arange(w_e.n_features), torch.arange(w_e.logit_start, w_e.n_nodes)])
    nonzero = [(t, s) for t in rows.tolist() for s in range(t0, t1) if w_e.adjacency[t, s] != 0]
    for t, s in nonzero[::max(1, len(nonzero) // 8)]:
        assert measured_effect(rm, w_e, t, s) == pytest.approx(float(w_e.adjacency[t, s]), abs=1e-8)
    w_e.save(tmp_path / "g")
    assert Graph.load(tmp_path / "g").token_nodes == "W_E"
    meta = json.loads((tmp_path / "g" / "graph.json").read_text())
    del meta["token_nodes"]
    (tmp_path / "g" / "graph.json").write_text(json.dumps(meta))
    assert Graph.load(tmp_path / "g").token_nodes == "embedding"
    meta["token_nodes"] = "W_pos"
    (tmp_path / "g" / "graph.json").write_text(json.dumps(meta))
    with pytest.raises(CircuitlabError, match="token_nodes must be one of embedding, W_E"):
        Graph.load(tmp_path / "g")
    with pytest.raises(CircuitlabError, match="token_nodes must be one of"):
        attribute(model, tc, tokens, token_nodes="tokens")


def test_batching_and_the_feature_cap_do_not_change_rows(setup):
    model, tc, tokens, graph = setup
    one = attribute(model, tc, tokens, batch_size=1)
    torch.testing.assert_close(one.adjacency, graph.adjacency, atol=1e-10, rtol=0)
    n = graph.n_features
    capped = attribute(model, tc, tokens, batch_size=4, max_feature_nodes=n // 2)
    assert capped.n_features == n // 2
    keep = torch.cat([capped.selected, torch.arange(n, graph.n_nodes)])
    rows = torch.cat([capped.selected, torch.arange(n, graph.n_nodes)])
    torch.testing.assert_close(capped.adjacency, graph.adjacency[rows][:, keep], atol=1e-10, rtol=0)
    # The cap keeps the most influential features first.
    infl = graph.node_influence()[:n]
    assert float(infl[capped.selected].sum()) >= float(infl.sort(descending=True).values[:n // 2].sum()) * 0.8


def test_graph_memory_is_the_computations_own_peak(setup):
    """graph.info["peak_mb"] is the resident memory the attribution itself held at most, not the process's
    lifetime peak: memory held before (or freed after) does not count, a transient allocation inside does."""
    import sys
    import time

    from circuitlab.graphs.attribution import _PeakMemory

    if not sys.platform.startswith("linux"):
        pytest.skip("resident memory is read from /proc")
    before = torch.ones(40 * 2**20)                     # 160 MB held before: not the block's
    with _PeakMemory() as outside:
        pass
    with _PeakMemory() as inside:
        transient = torch.ones(40 * 2**20)              # 160 MB allocated (and touched) inside, then freed
        time.sleep(0.05)                                # (sampled every 5 ms)
        del transient
    del before
    assert outside.growth_mb < 50 and inside.growth_mb > 120, (outside.growth_mb, inside.growth_mb)
    model, tc, tokens, graph = setup
    assert graph.info["peak_mb"] is not None and graph.info["peak_mb"] >= 0


def test_spans_of_positions_do_not_change_rows(setup, monkeypatch):
    import circuitlab.graphs.attribution as attribution

    model, tc, _, _ = setup
    tokens = torch.randint(0, 50, (16,), generator=torch.Generator().manual_seed(5))
    spans = attribute(model, tc, tokens, batch_size=8)
    monkeypatch.setattr(attribution, "N_SPANS", 1)
    whole = attribute(model, tc, tokens, batch_size=8)
    assert spans.info["backward_passes"] > whole.info["backward_passes"]
    torch.testing.assert_close(spans.adjacency, whole.adjacency, atol=1e-10, rtol=0)


def test_named_targets_and_a_logit_difference(setup):
    model, tc, tokens, graph = setup
    diff = logit_difference(None, 3, 7, 50)
    g = attribute(model, tc, tokens, targets=[3, 7, diff])
    assert g.n_logits == 3 and g.logit_labels[2] == "tok3 - tok7"
    torch.testing.assert_close(g.adjacency[g.logit_start + 2], g.adjacency[g.logit_start] - g.adjacency[g.logit_start + 1],
                               atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------- files


# ---------------------------------------------------------------------------- bad input

def test_bad_input_is_one_line(setup):
    model, tc, tokens, graph = setup
    dicts = [random_transcoder(layer, 32) for layer in (0, 2)]
    with pytest.raises(CircuitlabError, match=r"not \[1\]"):
        Transcoders.per_layer(model, dicts)
    assert Transcoders.per_layer(model, dicts, allow_partial=True).layers == [0, 2]
    wide = random_transcoder(1, 32)
    wide_cfg = wide.cfg.replace(d_out=48)
    with pytest.raises(CircuitlabError, match="d_model"):
        Transcoders.per_layer(model, dicts + [SparseDictionary(wide_cfg)])
    with pytest.raises(CircuitlabError, match="context"):
        attribute(model, tc, torch.zeros(17, dtype=torch.long))
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(CircuitlabError, match="threshold"):
            graph.prune(node_threshold=bad)
        with pytest.raises(CircuitlabError, match="threshold"):
            graph.prune(edge_threshold=bad)


def test_a_node_index_without_its_coordinates_is_one_line(setup):
    """Graph.index names what a node kind needs (it was a TypeError on None arithmetic)."""
    graph = setup[3]
    assert graph.index("error", layer=1, pos=2) == graph.error_start + graph.n_pos + 2
    for kind, given, needs in (("error", {"layer": 1}, "pos="), ("token", {}, "pos="), ("logit", {}, "logit=")):
        with pytest.raises(CircuitlabError, match=needs):
            graph.index(kind, **given)


# ---------------------------------------------------------------------------- the command


# ---------------------------------------------------------------------------- a trained model

@pytest.mark.slow
def test_trained_model_graph_shows_the_earlier_name_reaching_its_logit_through_attention():
    """A 2-layer MLP model trained on repeated random sequences (it learns induction) and TopK transcoders
    trained on its MLPs: for "... name ... name" the graph's strongest token node for the predicted next
    token is that token's earlier occurrence (its effect can only travel through attention), the scores are
    reported, and an intervention on the top feature moves the logit the way the graph says."""
    from tiny_trained import HALF, VOCAB, repeated_batch

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cfg = ModelConfig.from_preset("gpt2-tiny", n_layers=2, d_model=48, n_heads=2, d_mlp=96, d_vocab=VOCAB,
                                  n_ctx=2 * HALF, positional="learned")
    from circuitlab import Transformer

    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    for _ in range(400):
        tokens = repeated_batch(32, gen)
        mask = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, dtype=torch.bool)
        mask[:, HALF - 1:] = True
        loss = model.loss(tokens, loss_mask=mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert float(loss.detach()) < 0.5, float(loss.detach())
    # Transcoders: TopK, MLP input (ln2, before its gain) -> MLP output, trained on the same task's activations.
    names = [n for layer in range(2) for n in (f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")]
    data = repeated_batch(256, gen)
    _, cache = model.run_with_cache(data, names_filter=names)
    dicts = []
    for layer in range(2):
        c = DictionaryConfig("topk", d_in=48, d_sae=192, k=8, hook_name=f"blocks.{layer}.ln2.hook_normalized",
                             out_hook_name=f"blocks.{layer}.hook_mlp_out")
        d = SparseDictionary(c, seed=layer)
        x = cache[c.hook_name].flatten(0, 1)
        y = cache[c.out_hook_name].flatten(0, 1)
        o = torch.optim.Adam(d.parameters(), lr=3e-3)
        for step in range(600):
            idx = torch.randint(0, len(x), (512,), generator=gen)
            err = (d(x[idx])[0] - y[idx]).pow(2).sum(-1).mean()
            o.zero_grad()
            err.backward()
            o.step()
        fvu = float((d(x)[0] - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum())
        print(f"layer {layer} transcoder FVU {fvu:.3f}")
        dicts.append(d.eval())
    tc = Transcoders.per_layer(model, dicts)
    prompt = repeated_batch(1, torch.Generator().manual_seed(7))[0][:HALF + 3]   # a b c ... h a b c -> d
    name = int(prompt[3])
    graph = attribute(model, tc, prompt, targets=[name])
    s = graph.scores()
    print(f"replacement score {s['replacement']:.3f}, completeness {s['completeness']:.3f}")
    infl = graph.node_influence()
    tokens_infl = infl[graph.token_start:graph.logit_start]
    assert int(tokens_infl.argmax()) == 3, tokens_infl   # the earlier occurrence of the name
    # The top feature by direct effect on the logit: scaling it to 0 moves the logit the graph's way.
    row = graph.adjacency[graph.logit_start, :graph.n_features]
    top = int(row.abs().argmax())
    n = graph.node(top)
    rm = ReplacementModel(model, tc, prompt)
    with torch.no_grad():
        base = rm.run().logits[0, -1]
        cut = rm.run([Intervention(n["layer"], n["feature"], scale=0.0, pos=n["pos"])], features="frozen").logits[0, -1]
        live = rm.run([Intervention(n["layer"], n["feature"], scale=0.0, pos=n["pos"])]).logits[0, -1]
    moved = float((base[name] - base.mean()) - (cut[name] - cut.mean()))
    moved_live = float((base[name] - base.mean()) - (live[name] - live.mean()))
    print(f"top feature {graph.label(top)}: edge {float(row[top]):+.3f}, measured {moved:+.3f} (features held), "
          f"{moved_live:+.3f} (features live)")
    assert moved == pytest.approx(float(row[top]), rel=1e-4, abs=1e-5)
    assert moved_live * float(row[top]) > 0


# ---------------------------------------------------------------------------- cross-layer transcoders

def real_clt(dicts, cross: float = 0.3, seed: int = 0, architecture: str = "relu", k: int | None = None):
    """A circuitlab.dictionaries.clt.CrossLayerTranscoder (float64) built from per-layer transcoders: layer l's
    encoder, own-layer decoder, decoder bias and skip (when they have one) are transcoder l's; its decoders into later layers
    are random (cross=0: exactly the per-layer set)."""
    from circuitlab.dictionaries import CLTConfig, CrossLayerTranscoder

    L, c = len(dicts), dicts[0].cfg
    cfg = CLTConfig(architecture, n_layers=L, d_model=c.d_out, d_sae=c.d_sae, k=k, skip=c.skip, dtype="float64",
                    input_hook=c.hook_name.replace(".0.", ".{layer}."))
    clt = CrossLayerTranscoder(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer, d in enumerate(dicts):
            clt.W_enc[layer].copy_(d.W_enc)
            clt.b_enc[layer].copy_(d.b_enc)
            clt.b_dec[layer].copy_(d.b_dec)
            if c.skip:
                clt.W_skip[layer].copy_(d.W_skip)
            clt.W_dec[layer].copy_(cross * torch.randn(clt.W_dec[layer].shape, generator=g, dtype=torch.float64))
            clt.W_dec[layer][:, 0] = d.W_dec
    return clt


def test_a_cross_layer_transcoder_is_exact_and_its_edges_are_effects(setup):
    model, tc, tokens, graph = setup
    dicts = [tc.dictionary(layer) for layer in range(3)]
    same = attribute(model, Transcoders.cross_layer(model, real_clt(dicts, cross=0.0)), tokens, batch_size=16)
    torch.testing.assert_close(same.adjacency, graph.adjacency, atol=1e-10, rtol=0)
    clt = Transcoders.cross_layer(model, real_clt(dicts, cross=0.3))
    g = attribute(model, clt, tokens, batch_size=16)
    rm = ReplacementModel(model, clt, tokens)
    torch.testing.assert_close(rm.run().logits, model(tokens[None]), atol=1e-10, rtol=0)
    # A layer-0 feature writes layers 0, 1, 2: its edge to a layer-2 feature sums both decoders' paths.
    gen = torch.Generator().manual_seed(1)
    first = [i for i in range(g.n_features) if g.node(i)["layer"] == 0]
    last = [i for i in range(g.n_features) if g.node(i)["layer"] == 2] + [g.logit_start]
    for _ in range(8):
        s = first[int(torch.randint(len(first), (1,), generator=gen))]
        t = last[int(torch.randint(len(last), (1,), generator=gen))]
        assert measured_effect(rm, g, t, s) == pytest.approx(float(g.adjacency[t, s]), abs=1e-8)
    # Kept edges and errors too (every kind of source), against the frozen replacement model.
    pruned = g.prune()
    for t, s in pruned.edge_mask.nonzero()[torch.randperm(int(pruned.edge_mask.sum()), generator=gen)[:8]].tolist():
        assert measured_effect(rm, g, t, s) == pytest.approx(float(g.adjacency[t, s]), abs=1e-8), (g.label(t), g.label(s))
    # Real-model interventions write every layer the feature writes.
    n = g.node(first[0])
    iv = [Intervention(0, n["feature"], value=0.0, pos=n["pos"])]
    assert not torch.allclose(rm.run(iv, mode="model").logits, rm.run(mode="model").logits)


def test_an_exact_cross_layer_transcoder_gives_zero_errors_and_scores_one():
    """The planted model's MLPs ARE sparse dictionaries: a CLT made of them (no cross-layer writes) is exact."""
    p = planted_path_model()
    dicts = [p.transcoders.dictionary(layer).to(torch.float64) for layer in p.transcoders.layers]
    clt = Transcoders.cross_layer(p.model, real_clt(dicts, cross=0.0))
    rm = ReplacementModel(p.model, clt, p.tokens)
    assert all(float(e.abs().max()) < 1e-12 for e in rm.errors.values())
    torch.testing.assert_close(rm.run().logits, p.model(p.tokens[None]), atol=1e-12, rtol=0)
    graph = attribute(p.model, clt, p.tokens)
    s = graph.scores()
    assert s["replacement"] == pytest.approx(1.0, abs=1e-12) and s["completeness"] == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(graph.adjacency, attribute(p.model, p.transcoders, p.tokens).adjacency, atol=1e-12, rtol=0)
