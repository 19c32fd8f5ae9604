"""Models shared by the tests."""
import torch

from circuitlab import ModelConfig, Transformer


def random_model(cfg: ModelConfig, seed: int = 0, scale: float = 8.0, noise: float = 0.3) -> Transformer:
    """A Transformer whose weight matrices are `scale` times the init (sharp attention, so heads differ
    and patches matter) and whose norm gains and biases are moved off their 1 / 0 init by `noise`."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", ".bias")):
                p.copy_((1.0 if name.endswith(".w") else 0.0) + noise * torch.randn_like(p))
            else:
                p.mul_(scale)
    return model
