"""Head loadings and QK attributions against truth: the forge's planted previous-token + induction heads
(exact transcoders: the answer known by construction), and exactness in float64 on every family the graph
supports (terms sum to the model's own score, loadings to the graph's edges)."""
import json
import math

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.errors import InputError
from circuitlab.graphs import Graph, Transcoders, attribute
from circuitlab.graphs.heads import cross_position_edges, head_loadings
from circuitlab.graphs.planted import planted_induction_model
from circuitlab.graphs.qk import qk_attribution, qk_attributions
from graphs.test_attribution import FAMILIES, random_transcoder, real_clt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def induction():
    p = planted_induction_model()
    graph = attribute(p.model, p.transcoders, p.tokens)
    return p, graph


def test_planted_induction_top_qk_term_is_current_token_times_previous_token_head(induction):
    p, _ = induction
    qk = qk_attribution(p.model, p.transcoders, p.tokens, *p.induction, p.query_pos, p.key_pos)
    top = qk.top_pairs(1)[0]
    q_part, k_part = qk.query_parts[top["q"]], qk.key_parts[top["k"]]
    assert (q_part["kind"], q_part["pos"]) == ("token", p.query_pos)
    assert (k_part["kind"], k_part["layer"], k_part["head"], k_part["pos"]) == ("head", *p.previous_token, p.key_pos)
    assert top["term"] == pytest.approx(20.0, abs=1e-6)                  # the forge's sharpness, all of the score
    assert abs(qk.terms_sum - qk.raw_score) < 1e-9 and qk.terms.sum().item() == pytest.approx(qk.raw_score, abs=1e-9)
    soft = qk.key_softmax()
    assert soft["rank"] == 1 and soft["prob"] > 0.99 and soft["margin"] == pytest.approx(20.0, abs=1e-6)
    # a decoy head attends elsewhere (the first-token head: to position 0) and says so
    decoy = qk_attribution(p.model, p.transcoders, p.tokens, 1, 1, p.query_pos, p.key_pos)
    assert decoy.keys[0]["pos"] == 0 and decoy.key_softmax()["rank"] > 1
    json.dumps(qk.to_dict())
    assert "L0H0 output" in qk._repr_html_()


def test_planted_induction_copied_tokens_edge_sits_on_the_induction_head(induction):
    p, graph = induction
    loadings = head_loadings(p.model, p.transcoders, graph, graph.prune(0.8, 0.98))
    copied = int(p.tokens[p.key_pos])
    logit = graph.index("logit", logit=graph.logit_tokens.tolist().index(copied))
    edge = loadings.for_edge(logit, graph.index("token", pos=p.key_pos))
    assert edge["heads"][0]["layer"] == 1 and edge["heads"][0]["head"] == 0
    assert edge["heads"][0]["share"] == pytest.approx(1.0, abs=1e-12) and abs(edge["remainder"]) < 1e-12
    for layer, head in p.decoys:                        # heads that write nothing carry nothing, on every edge
        assert bool((loadings.heads[:, layer, head] == 0).all())
    assert loadings.remainder.abs().max() < 1e-12


def family_setup(family: str, n_pos: int = 7):
    spec = dict(FAMILIES[family]) if family in FAMILIES else {"preset": "gpt2-tiny"}
    hook = spec.pop("hook", "ln2.hook_normalized")
    clt = spec.pop("clt", False)
    cfg = ModelConfig.from_preset(spec.pop("preset"), n_layers=3, d_model=16, n_heads=4, d_vocab=40, n_ctx=12, **spec)
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(3.0) if name.endswith("qkv.weight") else None   # sharper patterns: heads differ
            if name.endswith((".w", ".b", ".bias")):
                p.add_(0.3 * torch.randn_like(p))
    dicts = [random_transcoder(layer, 16, d_sae=24) for layer in range(3)]
    for layer, d in enumerate(dicts):
        d.cfg.hook_name = f"blocks.{layer}.{hook}"
        with torch.no_grad():
            d.b_enc.zero_()
    tc = Transcoders.per_layer(model, dicts)
    tokens = torch.randint(0, 40, (n_pos,), generator=torch.Generator().manual_seed(3))
    return model, tc, tokens


@pytest.mark.parametrize("family", ["gpt2-learned"] + list(FAMILIES))
def test_terms_sum_to_the_models_score_and_loadings_to_the_edges(family):
    model, tc, tokens = family_setup(family)
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_attn_scores"))
    requests = [(layer, head, q, k) for layer in range(3) for head in (0, 3) for q, k in ((6, 2), (5, 5), (6, 0))
                if model.blocks[layer].attn.window is None or q - k < model.blocks[layer].attn.window]
    for r in qk_attributions(model, tc, tokens, requests):
        s = float(cache[f"blocks.{r.layer}.attn.hook_attn_scores"][0, r.head, r.query_pos, r.key_pos])
        assert r.score == pytest.approx(s, abs=1e-12)
        raw = r.terms.sum().item()
        cap = model.cfg.attn_softcap
        assert (raw if cap is None else cap * math.tanh(raw / cap)) == pytest.approx(s, abs=1e-9), (family, r)
        kinds = {p["kind"] for p in r.query_parts}
        if r.layer == 2:
            assert {"token", "feature", "error", "head"} <= kinds
    graph = attribute(model, tc, tokens, batch_size=8)
    loadings = head_loadings(model, tc, graph)                          # every non-zero cross-position edge
    assert len(loadings) > 50
    scale = loadings.edge.abs().max()
    assert loadings.remainder.abs().max() < 1e-9 * scale, family
    assert (loadings.heads != 0).sum() > len(loadings)                  # more than one head carries edges


def test_a_cross_layer_transcoder_and_a_logit_difference_are_split_exactly():
    from circuitlab.graphs import logit_difference

    model, tc, tokens = family_setup("gpt2-learned")
    clt = Transcoders.cross_layer(model, real_clt([tc.dictionary(layer) for layer in range(3)]))
    target = logit_difference(None, 3, 5, model.cfg.d_vocab)
    graph = attribute(model, clt, tokens, targets=[target])
    with pytest.raises(InputError, match="direction"):
        head_loadings(model, clt, graph)
    loadings = head_loadings(model, clt, graph, logit_directions=[target.direction])
    assert loadings.remainder.abs().max() < 1e-9 * loadings.edge.abs().max()
    qk = qk_attribution(model, clt, tokens, 2, 1, 6, 3)
    assert qk.error < 1e-9


def test_loadings_are_saved_with_the_graph_and_old_files_still_load(induction, tmp_path):
    p, graph = induction
    with pytest.raises(InputError, match="no head loadings"):
        graph.head_loadings()
    graph.save(tmp_path / "old")
    assert Graph.load(tmp_path / "old").loadings is None                 # a file without loadings
    pruned = graph.prune(0.8, 0.98)
    graph.loadings = head_loadings(p.model, p.transcoders, graph, pruned)
    try:
        graph.save(tmp_path / "new")
    finally:
        graph.loadings = None
    back = Graph.load(tmp_path / "new")
    assert torch.equal(back.loadings.heads, head_loadings(p.model, p.transcoders, graph, pruned).heads)
    t, s = back.loadings.edges[0].tolist()
    assert back.head_loadings(t, s)["heads"][0]["layer"] == 1
    assert len(cross_position_edges(graph, pruned)) == len(back.loadings)


def test_bad_requests_are_one_line(induction):
    p, _ = induction
    m, tc, toks = p.model, p.transcoders, p.tokens
    for args, match in [((2, 0, 5, 1), "layer 2 does not exist"), ((1, 2, 5, 1), "head 2 does not exist"),
                        ((1, 0, 9, 1), "query position 9 does not exist"), ((1, 0, 3, 5), "after query position"),
                        ((1, 0, 3, -1), "key position -1 does not exist")]:
        with pytest.raises(InputError, match=match):
            qk_attribution(m, tc, toks, *args)
    no_attention = Transformer(ModelConfig.from_preset("attn-only-0l", d_vocab=20, n_ctx=8))
    with pytest.raises(InputError, match="no attention layers"):
        qk_attribution(no_attention, None, torch.tensor([1, 2, 3]), 0, 0, 2, 1)
    model, tc2, tokens = family_setup("gemma2-like")         # layer 0 slides with a window of 3
    with pytest.raises(InputError, match="sliding window"):
        qk_attribution(model, tc2, tokens, 0, 0, 6, 1)


def test_an_attention_only_model_needs_no_transcoders():
    from circuitlab.forge.examples import build_induction_model

    model = build_induction_model(d_vocab=12, n_ctx=16).model.double()
    tokens = torch.tensor([3, 5, 7, 9, 3])
    qk = qk_attribution(model, None, tokens, 1, 0, 4, 1)
    assert qk.error < 1e-9 and qk.query_parts[qk.top_pairs(1)[0]["q"]]["kind"] == "token"
    kinds = [p["kind"] for p in qk.key_parts]
    assert "position" in kinds and "feature" not in kinds            # learned positions apart from the token


def test_graph_command_with_qk_writes_heads_and_qk_everywhere(tmp_path, monkeypatch, capsys):
    from circuitlab.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "g", "--qk", "--dashboard-tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert "QK attributions: 1 heads" in out and "L1H0 carries L0 F0 @1 'A' -> L1 F0 @6 'x'" in out
    results = json.loads((tmp_path / "g" / "results.json").read_text())
    strongest = results["head_loadings"]["strongest"][0]
    assert (strongest["layer"], strongest["head"], strongest["query_pos"], strongest["key_pos"]) == (1, 0, 6, 1)
    assert strongest["loading"] == pytest.approx(strongest["edge"], abs=1e-9)   # the planted head carries it all
    qk = results["qk"][0]
    # the planted head's scores are all zero: uniform attention, 1/7 on each key, no term
    assert qk["score"] == 0 and qk["key"]["prob"] == pytest.approx(1 / 7) and qk["top_pairs"] == []
    viewer = json.loads((tmp_path / "g" / "graph.json").read_text())
    carried = [x for x in viewer["links"] if "heads" in x]
    assert len(carried) == 1 and carried[0]["heads"][0][:2] == [1, 0] and viewer["qk"][0]["layer"] == 1
    assert "## Heads" in (tmp_path / "g" / "report.md").read_text()
    assert "QK attributions" in (tmp_path / "g" / "report.html").read_text()
    graph = Graph.load(tmp_path / "g" / "graph")
    assert graph.head_loadings().edges.tolist() == [[graph.index("feature", 1, 6, 0), graph.index("feature", 0, 1, 0)]]
    try:
        code = main(["graph", "--planted", "--prompt", "xAxBxyx", "--out", "bad", "--qk-heads", "0"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "qk-heads" in err and len(err.strip().splitlines()) == 1


def test_qk_terms_on_a_model_stored_in_bfloat16_sum_to_its_own_score():
    """Half-precision storage (model/storage.py): the query/key parts are computed in the compute dtype like every
    other product with a stored weight, and still sum to the score the model computed."""
    model, tc, tokens = family_setup("gpt2-learned")
    model = model.float().set_dtypes("bfloat16", "float32")
    tc = tc.to(torch.float32)
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_attn_scores"))
    r = qk_attribution(model, tc, tokens, 2, 1, 6, 2)
    assert r.score == pytest.approx(float(cache["blocks.2.attn.hook_attn_scores"][0, 1, 6, 2]), abs=1e-5)
    assert r.terms.sum().item() == pytest.approx(r.score, abs=1e-4)
    loadings = head_loadings(model, tc, attribute(model, tc, tokens, batch_size=8))   # in the compute dtype too
    assert loadings.remainder.abs().max() < 1e-4 * loadings.edge.abs().max()
