"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI."""
import copy
import math

import pytest
import torch

from circuitlab import CircuitlabError, Transformer
from circuitlab.cli import main
from circuitlab.forge import (EOS, Forge, ResidualLayout, attention_agreement, build_adder, build_carry_adder,
                              build_induction_model, build_post_adder, build_previous_token_model, compare_adders,
                              ov_alignment, principal_angles)
from circuitlab.forge.adder import parse_operand
from circuitlab.forge.compare import ov_subspace, used_heads


def perturbed(model, relative=0.0, additive=0.0, seed=0):
    """A copy with every weight w -> w·(1 + relative·ε) + additive·ε' (ε, ε' standard normal)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.mul_(1 + relative * torch.randn(p.shape, generator=g)).add_(additive * torch.randn(p.shape, generator=g))
    return out


# ---------------------------------------------------------------- builder
def test_layout_names_coordinates_and_errors():
    layout = ResidualLayout({"one": 1, "tok": 3, "out": 2})
    assert layout.d_model == 6 and layout.names == ["one", "tok", "out"]
    assert layout.coords("tok") == [1, 2, 3] and layout["out"] == slice(4, 6)
    v = layout.vector(one=1, out=[2, 3])
    assert v.tolist() == [1, 0, 0, 0, 2, 3]
    assert layout.describe(v) == {"one": 1.0, "tok": [0.0, 0.0, 0.0], "out": [2.0, 3.0]}
    with pytest.raises(CircuitlabError, match="did you mean 'tok'"):
        layout["toks"]
    with pytest.raises(CircuitlabError, match="size 3"):
        layout.vector(tok=1.0)
    with pytest.raises(CircuitlabError, match="positive integer size"):
        ResidualLayout({"x": 0})


def test_forge_writes_each_block_into_the_fused_weights():
    layout = ResidualLayout({"x": 2, "y": 1, "z": 3})
    f = Forge(layout, n_layers=1, n_heads=2, d_head=4, d_vocab=5, n_ctx=4)
    M = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    h = f.head(0, 1)
    h.q("x", M, into=[1, 3]).k("y", [5.0, 6.0], into=0).v("z", 7.0, into=1).o("z", torch.ones(2, 3), from_=[0, 2])
    model = f.model
    W_Q, W_K, W_V, W_O = model.W_Q[0, 1], model.W_K[0, 1], model.W_V[0, 1], model.W_O[0, 1]  # [d_model, d_head]...
    assert torch.equal(W_Q[0:2][:, [1, 3]], M) and W_Q.abs().sum() == M.sum()
    assert W_K[2].tolist() == [5.0, 6.0, 0.0, 0.0] and W_K.abs().sum() == 11
    assert torch.equal(W_V[3:6, 1:4], 7.0 * torch.eye(3)) and W_V.abs().sum() == 21
    assert torch.equal(W_O[[0, 2]][:, 3:6], torch.ones(2, 3)) and W_O.abs().sum() == 6
    # head 0 untouched; embeddings and unembedding set on their subspaces only
    assert model.W_Q[0, 0].abs().sum() == 0 and model.W_O[0, 0].abs().sum() == 0
    f.embed(3, x=[1, -1], y=2)
    f.unembed(4, z=[1, 2, 3])
    assert model.W_E[3].tolist() == [1, -1, 2, 0, 0, 0]
    assert model.W_U[:, 4].tolist() == [0, 0, 0, 1, 2, 3]


def test_forge_v_only_heads_and_mlp_neurons():
    layout = ResidualLayout({"one": 1, "a": 1, "b": 1})
    f = Forge(layout, n_layers=1, n_heads=1, d_head=3, use_attn_out=False, d_mlp=2, d_vocab=4, n_ctx=3)
    f.head(0).v("a", 2.0, into="b")                 # V-only: z = 2·a lands in "b"
    with pytest.raises(CircuitlabError, match="no W_O"):
        f.head(0).o("a", 1.0)
    f.mlp(0).neuron(1, read={"a": 1.0, "one": -1.0}, write={"one": 5.0})
    model = f.model
    assert model.W_OV[0, 0][1, 2] == 2.0 and model.W_OV[0, 0].abs().sum() == 2.0
    x = layout.vector(one=1, a=3)[None, None]
    torch.testing.assert_close(model.blocks[0].mlp(x), layout.vector(one=5 * (3 - 1))[None, None])
    with pytest.raises(CircuitlabError, match="d_head is 3"):
        f.head(0).q("a", [1.0, 1.0], into=2)
    with pytest.raises(CircuitlabError, match="positional='learned'"):
        f.pos(0, a=1)
    with pytest.raises(CircuitlabError, match="head must be"):
        f.head(0, 1)


# ---------------------------------------------------------------- hand-built heads (fixtures)
def test_previous_token_model_attends_one_back_and_predicts_previous_token():
    pt = build_previous_token_model(d_vocab=12, n_ctx=16)
    tokens = torch.randint(0, 12, (4, 16), generator=torch.Generator().manual_seed(0))
    logits, cache = pt.model.run_with_cache(tokens)
    assert torch.equal(logits[:, 1:].argmax(-1), tokens[:, :-1])
    pattern = cache["pattern", 0][:, 0]
    assert pattern.diagonal(offset=-1, dim1=-2, dim2=-1).min() > 0.999
    assert pt.heads_with_role("previous_token") == [(0, 0)]


def test_induction_model_ground_truth():
    ind = build_induction_model(d_vocab=20, n_ctx=32)
    g = torch.Generator().manual_seed(1)
    half = torch.stack([torch.randperm(20, generator=g)[:16] for _ in range(6)])
    tokens = torch.cat([half, half], dim=1)
    logits, cache = ind.model.run_with_cache(tokens)
    assert torch.equal(logits[:, 16:-1].argmax(-1), tokens[:, 17:])   # the second repeat, predicted exactly
    second = torch.arange(16, 32)
    scores = {}
    for (layer, head) in ind.roles:
        p = cache["pattern", layer][:, head]
        scores[(layer, head)] = {
            "previous_token": p.diagonal(offset=-1, dim1=-2, dim2=-1).mean().item(),
            "induction": p[:, second, second - 15].mean().item(),
            "current_token": p.diagonal(dim1=-2, dim2=-1).mean().item(),
            "first_token": p[:, :, 0].mean().item(),
        }
    for head, role in ind.roles.items():
        assert scores[head][role] > 0.999, (head, role)
    # (the induction head spreads evenly over the first repeat, where nothing matches, hence a little weight on p - 1)
    assert scores[(1, 0)]["previous_token"] < 0.2 and scores[(0, 0)]["induction"] < 0.01
    # patching ground truth: heads that write nothing have no effect; ablating the previous-token head breaks induction
    for (layer, head), writes in ind.writes.items():
        def zero_head(z, hook, head=head):
            z = z.clone()
            z[:, :, head] = 0
            return z
        name = f"blocks.{layer}.attn.hook_z"
        clean = ind.model.run_with_hooks(tokens, fwd_hooks=[(name, lambda z, hook: None)])  # same code path
        ablated = ind.model.run_with_hooks(tokens, fwd_hooks=[(name, zero_head)])
        assert ((ablated - clean).abs().max() > 0.5) == writes, (layer, head)
        assert writes or torch.equal(ablated, clean)
    ablated = ind.model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)])
    assert (ablated[:, 16:-1].argmax(-1) == tokens[:, 17:]).float().mean() < 0.5


# ---------------------------------------------------------------- the post's adder
def test_post_adder_is_exact_on_all_inputs_and_matches_the_post():
    adder = build_post_adder()
    result = adder.check(progress=False)
    assert (result.correct, result.total, result.exhaustive) == (10_000, 10_000, True)
    tokens = adder.prompt(17, 25)
    assert tokens.tolist() == [1, 7, 2, 5, EOS]
    _, cache = adder.model.run_with_cache(tokens[None])
    torch.testing.assert_close(cache["resid_post", 1][0, -1], torch.tensor([12.0, 3.0, 1.0]))
    torch.testing.assert_close(cache["pattern", 0][0, 0, -1], torch.tensor([0, 0.5, 0, 0.5, 0]))
    torch.testing.assert_close(cache["pattern", 1][0, 0, -1], torch.tensor([1, 0, 1, 0, 1]) / 3)
    assert adder.add(17, 25) == 42 and adder.add(99, 99) == 198
    text = adder.explain(17, 25)
    assert "EOS residual [12, 3, 1]" in text and "= 42" in text


def test_post_adder_needs_a_hard_softmax():
    # Scores differ by 2·s² between attended and ignored positions; at s = 1.5 (margin 4.5) the ignored
    # positions leak e^-4.5 ≈ 1% of their digits into the sum and the readout goes wrong.
    assert build_post_adder(qk_scale=3.0).check(progress=False).exact
    soft = build_post_adder(qk_scale=1.5).check(progress=False)
    assert not soft.exact and soft.failures


# ---------------------------------------------------------------- the exact adder
@pytest.mark.parametrize("n, m", [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (2, 3), (3, 2)])
def test_carry_adder_exact_on_every_input(n, m):
    result = build_carry_adder(n, m).check(progress=False)
    assert result.exhaustive and result.total == 10 ** (n + m)
    assert result.correct == result.total, result


@pytest.mark.slow
def test_carry_adder_exact_on_every_3_plus_3_digit_input():
    result = build_carry_adder(3, 3).check(progress=False)
    assert result.exhaustive and result.correct == result.total == 10 ** 6


@pytest.mark.parametrize("n, m", [(4, 7), (7, 4), (12, 12)])
def test_carry_adder_exact_on_10000_random_pairs(n, m):
    result = build_carry_adder(n, m).check(samples=10_000, seed=n * 100 + m, progress=False)
    assert not result.exhaustive and result.correct == result.total == 10_000, result


def _digits(x, n):
    return torch.tensor([[int(c) for c in str(v).zfill(n)] for v in x])


def test_carry_adder_long_carry_chains():
    # Uniform random digits rarely make long runs of 9s; these do (carries across every column).
    n = 12
    pairs = [(10 ** n - 1, 1), (10 ** n - 1, 10 ** n - 1), (5 * 10 ** (n - 1), 5 * 10 ** (n - 1)),
             (123456789012, 876543210988), (999999999990, 10), (499999999999, 500000000001), (0, 0)]
    adder = build_carry_adder(n, n)
    a, b = zip(*pairs)
    assert adder.correct_rows(_digits(a, n), _digits(b, n)).all()
    assert adder.add(10 ** n - 1, 1) == 10 ** n                     # and through greedy generation
    uneven = build_carry_adder(30, 2)
    a, b = [10 ** 30 - 1, 10 ** 30 - 1, 10 ** 29], [1, 99, 0]
    assert uneven.correct_rows(_digits(a, 30), _digits(b, 2)).all()
    assert build_carry_adder(2, 30).add(1, 10 ** 30 - 1) == 10 ** 30


def test_carry_adder_carries_live_in_the_model():
    adder = build_carry_adder(2, 2)
    tokens = torch.tensor([[1, 7, 2, 5, EOS, 0, 4]])    # 17 + 25 with the answer 042 fed back
    logits, cache = adder.model.run_with_cache(tokens)
    final = cache["resid_post", 1][0]
    carry = adder.layout.read(final, "carry")[4:, 0]   # answer positions predict hundreds, tens, units
    torch.testing.assert_close(carry, torch.tensor([0.0, 1.0, 0.0]))
    wrap = adder.layout.read(final, "wrap")[4:, 0]
    torch.testing.assert_close(wrap, torch.tensor([0.0, 0.0, 1.0]))
    # the answer is read through the unembedding: logits are a linear map of the final residual
    torch.testing.assert_close(logits[0], final @ adder.model.W_U)
    assert logits[0, 4:].argmax(-1).tolist() == [0, 4, 2]
    # heads a and b fetch the column's digits with (numerically) hard attention
    pattern = cache["pattern", 0][0]
    assert pattern[0, 6, 1] > 0.999 and pattern[1, 6, 3] > 0.999      # units: 7 and 5
    assert pattern[0, 4, 4] > 0.999 and pattern[1, 4, 4] > 0.999      # hundreds: neither number has one (EOS)
    assert "17 + 25 = 42" in adder.explain(17, 25)


def test_adder_token_format_matches_the_addition_task():
    from circuitlab.data.synthetic import AdditionTask

    task = AdditionTask(3, 2)
    adder = build_carry_adder(3, 2)
    assert adder.prompt(507, 98).tolist() == task.encode(507, 98)[: task.prompt_len]
    assert task.seq_len - 1 <= adder.model.cfg.n_ctx and EOS == task.EOS


@pytest.mark.parametrize("value, message", [
    ("1x", "whole number"), ("", "whole number"), (2.5, "whole number"), (True, "whole number"),
    (-3, "not be negative"), ("-3", "not be negative"), (123, "has 3 digits"), ("100", "has 3 digits"),
])
def test_bad_operands_are_clear_errors(value, message):
    with pytest.raises(CircuitlabError, match=message):
        parse_operand(value, "a", 2)
    with pytest.raises(CircuitlabError, match=message):
        build_carry_adder(2).add(value, 1)


def test_bad_adder_shapes_are_clear_errors():
    with pytest.raises(CircuitlabError, match="n_digits_a must be an integer from 1"):
        build_carry_adder(0)
    with pytest.raises(CircuitlabError, match="post's design adds two 2-digit numbers"):
        build_adder("post", 3)
    with pytest.raises(CircuitlabError, match="unknown adder design"):
        build_adder("magic", 2)


# ---------------------------------------------------------------- comparison
def test_principal_angles_known_cases():
    e = torch.eye(4, dtype=torch.float64)
    assert principal_angles(e[:, :2], e[:, :2]).abs().max() < 1e-6
    torch.testing.assert_close(principal_angles(e[:, :1], e[:, 1:2]), torch.tensor([math.pi / 2], dtype=torch.float64))
    diag = (e[:, :1] + e[:, 1:2]) / math.sqrt(2)
    torch.testing.assert_close(principal_angles(diag, e[:, :1]), torch.tensor([math.pi / 4], dtype=torch.float64))
    assert principal_angles(e[:, :2], e[:, :0]).numel() == 0


def test_comparison_of_hand_built_with_itself_and_perturbed_copies():
    hand = build_carry_adder(2, 2)
    assert used_heads(hand.model) == [(0, 0), (0, 1), (1, 0)]          # L1H1 is left all zero
    same = compare_adders(hand, perturbed(hand.model, relative=1e-4), samples=200)
    assert same.accuracy_hand == same.accuracy_other == 1.0
    for match in same.matches:
        assert match["hand_head"] == match["other_head"] and match["agreement"] > 0.99
    ov = {m["hand_head"]: m["ov_input"] for m in same.matches}
    assert ov["L0H0"]["similarity"] > 0.999 and ov["L0H0"]["rank_a"] == 1   # reads the digit value
    assert ov["L1H0"]["similarity"] is None                                    # reads no token feature directly
    broken = compare_adders(hand, perturbed(hand.model, additive=0.05), samples=200)
    assert broken.accuracy_other < 0.5
    assert sum(m["agreement"] for m in broken.matches) / len(broken.matches) < 0.8
    # a random model of the same shape: low attention agreement, OV subspaces not aligned
    torch.manual_seed(0)
    random_model = Transformer(hand.model.cfg)
    tokens = torch.tensor([[1, 7, 2, 5, EOS, 0, 4], [9, 9, 0, 1, EOS, 1, 0]])
    agree = attention_agreement(hand.model, random_model, tokens, query_positions=range(4, 7),
                                heads_a=[(0, 0), (1, 0)])
    assert agree.agreement.max() < 0.5 and agree.agreement.shape == (2, 4)
    assert ov_alignment(hand.model, (0, 0), random_model, (0, 0)).similarity < 0.9
    res = ov_alignment(hand.model, (1, 0), perturbed(hand.model, relative=1e-4), (1, 0), basis="residual")
    assert res.rank_a == res.rank_b == 1 and res.similarity > 0.999
    assert "agreement" in same.to_dict() and same.to_dict()["matches"][0]["ov_input"]["basis"] == "token"


def test_comparison_errors():
    hand = build_carry_adder(2, 2)
    with pytest.raises(CircuitlabError, match="reads its answer off the residual"):
        compare_adders(build_post_adder(), hand.model)
    with pytest.raises(CircuitlabError, match="does not exist"):
        ov_subspace(hand.model, (2, 0))
    with pytest.raises(CircuitlabError, match="same d_model"):
        ov_alignment(hand.model, (0, 0), build_carry_adder(3, 3).model, (0, 0), basis="residual")


# ---------------------------------------------------------------- CLI
def test_cli_check_and_explain(capsys):
    assert main(["forge", "adder", "--digits", "2", "--check"]) == 0
    assert "10000/10000 inputs correct" in capsys.readouterr().out
    assert main(["forge", "adder", "--a", "17", "--b", "25", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "EOS residual [12, 3, 1]" in out and "EOS attends" in out
    assert main(["forge", "adder", "--design", "carry", "--digits", "3", "--digits-b", "1", "--a", "995",
                 "--b", "7"]) == 0
    assert capsys.readouterr().out.strip() == "995 + 7 = 1002"


@pytest.mark.parametrize("argv, message", [
    (["--a", "123", "--b", "4"], "has 3 digits, but this adder was built for 2-digit a (use --digits 3)"),
    (["--a", "seven", "--b", "4"], "a must be a whole number"),
    (["--a", "3"], "give both --a and --b"),
    ([], "give --check, or two numbers"),
])
def test_cli_bad_input_is_one_clear_line(argv, message, capsys):
    assert main(["forge", "adder", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
