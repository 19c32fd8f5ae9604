"""Forge: the builder API, the hand-built heads, the adders (exhaustively), the comparison functions, the CLI.

(Split out of the flat test_forge module, issue 38.)"""
import torch

from circuitlab.forge import build_induction_model, build_previous_token_model


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
