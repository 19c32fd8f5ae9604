"""A tiny attention-only model trained (in seconds) on repeated random sequences: it learns induction.
Shared by the input attribution, tuned lens and steering tests; trained once per test session."""
import functools

import torch

from circuitlab import ModelConfig, Transformer

VOCAB, HALF = 24, 8


def repeated_batch(batch: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, 2 * HALF]: a random sequence of distinct tokens, then the same sequence again."""
    first = torch.stack([torch.randperm(VOCAB, generator=gen)[:HALF] for _ in range(batch)])
    return torch.cat([first, first], dim=1)


@functools.lru_cache(maxsize=None)
def induction_model(steps: int = 200) -> Transformer:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = Transformer(ModelConfig.from_preset("attn-only-2l", d_model=32, n_heads=2, d_vocab=VOCAB, n_ctx=2 * HALF))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        tokens = repeated_batch(32, gen)
        mask = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, dtype=torch.bool)
        mask[:, HALF - 1:] = True  # only the second half is predictable
        loss = model.loss(tokens, loss_mask=mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model
