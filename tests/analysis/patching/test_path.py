"""Path patching on a hand-built induction circuit, and the causal experiments of `circuitlab interpret`."""
import json

import pytest
import torch

from circuitlab import CircuitlabError, ModelConfig, Transformer
from circuitlab.experiments.interpret import available_experiments
from circuitlab.methods.pairs import induction_pair

# interpret's causal experiments, each called on a clean and corrupted pair: fn(model, tokenizer, out_dir, clean, corrupt)
EXPERIMENTS = {name: (lambda model, tok, out, clean, corrupt, fn=fn: fn(model, tok, out, {"clean": clean,
                                                                                         "corrupt": corrupt}))
               for name, fn in available_experiments().items() if name in ("patching", "ablation", "probing")}
from circuitlab.analysis.patching import activation_patching, next_token_loss
from circuitlab.analysis.patching.path import path_patching


pytestmark = pytest.mark.usefixtures("one_thread")


V, N = 10, 16  # vocabulary, context


def induction_model(sharpness: float = 20.0, logit_scale: float = 5.0) -> Transformer:
    """Two attention-only layers of two heads, weights set by hand on one-hot subspaces.

    Residual stream: [tok (V) | pos (N) | prev (V) | out (V)]; d_head = N.
    L0H0, previous-token head: query p reads pos, key j reads pos shifted by one, so the score is
         `sharpness` exactly when j = p - 1; it copies the key's token into "prev".
    L1H0, induction head: query reads tok, key reads prev, so the score is `sharpness` where the
         previous token of the key equals the current token (K-composition with L0H0); it copies
         the key's token into "out", which the unembedding reads. Position 0 has no previous token
         (L0H0 attends to itself there), so its key gets -sharpness on head dim V: the query's
         dim V reads the tok subspace's sum, which is 1 for every token.
    L0H1, L1H1: all weights zero (they attend uniformly and write nothing).
    """
    tok, pos, prev, out = 0, V, V + N, 2 * V + N
    cfg = ModelConfig(n_layers=2, d_model=3 * V + N, n_heads=2, d_head=N, d_vocab=V, n_ctx=N, attn_only=True,
                      norm="none", bias=False, scale_scores=False, positional="learned")
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, tok:tok + V] = torch.eye(V)
        model.pos_embed.weight[:, pos:pos + N] = torch.eye(N)
        model.unembed.weight[:, out:out + V] = logit_scale * torch.eye(V)

        def head(layer):  # head 0's q, k, v rows of the fused qkv weight, and its columns of W_O
            w, D, H = model.blocks[layer].attn.qkv.weight, N, cfg.n_heads
            return w[0:D], w[H * D:H * D + D], w[2 * H * D:2 * H * D + D], model.blocks[layer].attn.out.weight[:, :D]

        q, k, v, o = head(0)
        q[:, pos:pos + N] = sharpness * torch.eye(N)   # q(p) = sharpness * e_p
        k[1:, pos:pos + N - 1] = torch.eye(N - 1)       # k(j) = e_(j + 1)
        v[:V, tok:tok + V] = torch.eye(V)
        o[prev:prev + V, :V] = torch.eye(V)
        q, k, v, o = head(1)
        q[:V, tok:tok + V] = sharpness * torch.eye(V)
        k[:V, prev:prev + V] = torch.eye(V)
        q[V, tok:tok + V] = sharpness
        k[V, pos] = -1.0
        v[:V, tok:tok + V] = torch.eye(V)
        o[out:out + V, :V] = torch.eye(V)
    return model


def repeated(batch: int = 4, n: int = 6, seed: int = 0) -> torch.Tensor:
    """[batch, 2n]: n distinct random tokens, twice."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.stack([torch.randperm(V, generator=gen)[:n] for _ in range(batch)])
    return torch.cat([r, r], dim=1)


def test_hand_built_model_does_induction():
    model = induction_model()
    tokens = repeated()
    with torch.no_grad():
        pred = model(tokens).argmax(-1)
    assert torch.equal(pred[:, 6:-1], tokens[:, 7:])  # the second repeat is predicted exactly


def test_path_patching_finds_the_k_composition():
    model = induction_model()
    clean = repeated(seed=0)
    corrupt = torch.cat([repeated(seed=1)[:, :6], clean[:, 6:]], dim=1)  # other tokens in the first half
    mask = torch.zeros_like(clean, dtype=torch.bool)
    mask[:, 6:] = True
    metric = next_token_loss(clean, mask)  # loss on the second repeat, against the clean tokens
    paths = {inp: path_patching(model, clean, corrupt, metric, (1, 0), inp, progress=False) for inp in "qkv"}
    gap = paths["k"].corrupt_value - paths["k"].clean_value
    assert gap > 1.0
    # The previous-token head reaches the induction head through its keys, and only there.
    assert paths["k"].effect()[0, 0] > 0.5 * gap
    for inp in "qv":
        assert paths[inp].effect()[0, 0].abs() < 1e-4, inp
    for inp in "qkv":
        assert paths[inp].effect()[0, 1].abs() < 1e-4, inp  # L0H1 writes nothing
        assert paths[inp].values[1].isnan().all()  # layer 1 heads are not senders of a layer-1 receiver
    assert paths["k"].top(1)[0][0] == (0, 0)
    json.dumps(paths["k"].to_dict())


def test_path_patching_batched_equals_one_at_a_time():
    model = induction_model(sharpness=3.0)  # soft attention: every path carries a little
    torch.manual_seed(0)
    with torch.no_grad():  # give L0H1 random queries, values and outputs, so both senders matter
        model.blocks[0].attn.qkv.weight[16:32] += 0.3 * torch.randn(16, model.cfg.d_model)  # L0H1 queries
        model.blocks[0].attn.qkv.weight[80:96] += 0.3 * torch.randn(16, model.cfg.d_model)  # L0H1 values
        model.blocks[0].attn.out.weight[:, 16:] += 0.3 * torch.randn(model.cfg.d_model, 16)
    clean, corrupt = repeated(seed=0), repeated(seed=2)
    metric = next_token_loss(clean)
    for inp in "qkv":
        batched = path_patching(model, clean, corrupt, metric, (1, 0), inp, progress=False)
        single = path_patching(model, clean, corrupt, metric, (1, 0), inp, batch_size=1, progress=False)
        torch.testing.assert_close(batched.values[0], single.values[0], atol=1e-6, rtol=0)
        assert batched.effect()[0, 1].abs() > 1e-3  # L0H1 now writes everywhere, so each path carries


def test_path_patching_bad_input():
    model = induction_model()
    clean = repeated()
    metric = next_token_loss(clean)
    for receiver, inp, msg in [((0, 0), "k", "no earlier heads"), ((1, 5), "k", "does not exist"),
                               ((1, 0), "z", "q, k, v")]:
        with pytest.raises(CircuitlabError, match=msg):
            path_patching(model, clean, clean, metric, receiver, inp)
    with pytest.raises(CircuitlabError, match="sender L1H0"):
        path_patching(model, clean, clean, metric, (1, 0), "k", senders=[(1, 0)])
    with pytest.raises(CircuitlabError, match="same shape"):
        path_patching(model, clean, clean[:, :5], metric, (1, 0), "k")


def test_default_induction_prompts_localise_both_heads():
    model = induction_model()
    clean, corrupt, answer, k = induction_pair(model, Tokenizer())
    assert clean.shape == corrupt.shape and (clean != corrupt).sum() == clean.shape[0]
    res = activation_patching(model, clean, corrupt, lambda l: l[torch.arange(len(answer)), -1, answer].mean(),
                              "head_out_by_pos", progress=False)
    rec = res.recovery()  # [layer, pos, head]
    assert rec[0, k, 0] > 0.99  # the previous-token head at the position after the replaced token
    assert rec[1, -1, 0] > 0.99  # the induction head at the last position
    rec[0, k, 0] = rec[1, -1, 0] = 0
    assert rec.abs().max() < 1e-4


class Tokenizer:
    vocab_size, eos_id = V, V - 1

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_interpret_experiments(name, tmp_path):
    model = induction_model()
    found = EXPERIMENTS[name](model, Tokenizer(), tmp_path, None, None)
    json.dumps(found.to_dict())
    assert found.figures and all((tmp_path / f).is_file() for f in found.figures)
    assert found.summary
    if name == "patching":
        assert found.to_dict()["composition"] == {"receiver": "L1H0", "sender": "L0H0", "input": "k",
                                             "fraction_of_gap": pytest.approx(1.0, abs=0.02)}
    if name == "ablation":
        assert found.to_dict()["group"]["heads"] == ["L1H0"]
        before, after = found.to_dict()["group"]["repeated_loss"]
        assert after > before + 0.3
    if name == "probing":
        assert found.to_dict()["probes"]["prev_token"]["val_score"][1] > 0.95


def test_interpret_patching_with_prompts(tmp_path):
    model = induction_model()
    # Replacing the earlier "c" changes the prediction ('d' -> 'b'): the metric is the logit difference,
    # and the replaced position carries the whole gap.
    found = EXPERIMENTS["patching"](model, Tokenizer(), tmp_path, "abcdefabc", "abhdefabc")
    assert found.to_dict()["prompts"] == "logit('d') - logit('b') at the last position"
    assert found.summary[2].startswith("resid_pre: largest recovery at L0 pos 2 (+1.00)")
    # Replacing "e" leaves the prediction alone: log-prob of 'd', equal on both, nothing to localise.
    found = EXPERIMENTS["patching"](model, Tokenizer(), tmp_path, "abcdefabc", "abcdhfabc")
    assert found.to_dict()["prompts"] == "log-prob of 'd' at the last position (both prompts predict it)"
    assert found.summary[-1] == "the metric is the same on both prompts, so there is nothing to localise"
    with pytest.raises(CircuitlabError, match="same shape"):
        EXPERIMENTS["patching"](model, Tokenizer(), tmp_path, "abcdefabc", "abcdefab")
