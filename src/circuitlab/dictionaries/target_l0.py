"""Target-L0 mode: steer a sparsity coefficient until the dictionary fires on the L0 the user names.

    ctl = L0Controller(target=4.0, start=1.0, glide_until=800)          # one coefficient
    ctl = L0Controller(target=[8.0, 8.0, 4.0], start=1.0, glide_until=800)  # one per layer (a CLT)
    coeff = ctl.coefficient()        # [n] the coefficients to use this step
    ctl.update(step, l0, gain)       # after the step: l0 [n] measured on its batch; gain: the lr's factor

A penalty-based dictionary (ReLU + L1, JumpReLU + L0, a CLT's tanh penalty) ends at whatever L0 its
coefficient gives on the data at hand, so a coefficient tuned on one distribution misses on another.
The controller is integral control in log space toward a set point that glides: it starts at the L0 of
the first step and moves geometrically to the target over the first `glide_until` steps, then stays
there. Each step log(coeff) moves by rate · gain · clamp(log(l0 / set point), −1, 1) (a coefficient too
small grows by up to e^rate per step, one too large shrinks). The trainer passes as gain the learning
rate's factor (warm-up, then decay to 0): the coefficient moves the L0 only through the weights, which
move in proportion to the learning rate, so the loop keeps its gain as the rate changes, and it steers
to the end of training: the coefficient settles as the rate decays, and what it settles on is held and
saved. (Steering stopped when the rate began to decay, holding an average of the coefficient, left the
L0 to drift while the dictionary still moved: a JumpReLU CLT's last layer ended 11–12% under its target
of 2.) Gliding matters: steered straight at a far target, the coefficient overshoots while the
dictionary lags behind it (Adam moves the weights a little per step), and a ReLU dictionary pushed far
past its target has its latents die, never to fire again. It knows nothing of the architecture: the
trainer calls coefficient() and update(); the state is a few numbers, checkpointed with the trainer
(state_dict / load_state_dict), so resuming stays exact.

Where training starts matters as much as the steering. A dictionary initialised the usual way (zero
encoder bias, a JumpReLU threshold near 0) fires half its latents on every row; the bias or threshold
that brings it down to a few per row is a few units of the pre-activations away, and Adam at the
dictionary's learning rate moves it ~1e-3 per step, so the whole run is spent dense, where latents do
not specialise (measured on planted features: ReLU mean max cosine 0.47 after 400 steps, 0.99 at the
same L0 from the start below). So `cut_for_l0` gives each latent the encoder bias that makes it fire on
target / d_sae of the rows at initialisation: the dictionary starts at the target L0 and the
controller only has to hold it there (the trainer subtracts it from b_enc; ReLU then shrinks by it,
JumpReLU's threshold starts near 0 and takes over as the coefficient pushes it up).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from circuitlab.errors import ConfigError


class L0Controller:
    def __init__(self, target: float | Sequence[float], start: float, glide_until: int, rate: float = 0.01) -> None:
        targets = torch.as_tensor([target] if isinstance(target, (int, float)) else list(target), dtype=torch.float64)
        if not bool((targets > 0).all()) or not bool(targets.isfinite().all()):
            raise ConfigError(f"target_l0 must be positive and finite, got {targets.tolist()}")
        if start <= 0:
            raise ConfigError(f"the starting sparsity coefficient must be positive, got {start}")
        self.target, self.glide_until, self.rate = targets, max(int(glide_until), 1), rate
        self.log_coeff = torch.full_like(targets, math.log(start))   # [n] what steers
        self.log_l0_start = torch.full_like(targets, math.nan)       # [n] log L0 of the first step (set point start)

    def coefficient(self) -> torch.Tensor:
        """[n] the coefficients to use this step (and, at the end, what the dictionary is saved with)."""
        return self.log_coeff.exp()

    def set_point(self, step: int) -> torch.Tensor:
        """[n] the L0 steered toward at a step: from the first step's L0 to the target, geometrically."""
        if bool(self.log_l0_start.isnan().any()):
            return self.target.clone()
        glide = min(1.0, step / self.glide_until)
        return (self.log_l0_start + glide * (self.target.log() - self.log_l0_start)).exp()

    def update(self, step: int, l0: float | torch.Tensor, gain: float = 1.0) -> None:
        """After step `step`: l0 [n] (or a float) the L0 measured on its batch; gain scales the move (the
        learning rate's factor at that step)."""
        l0 = torch.as_tensor(l0, dtype=torch.float64).reshape(-1).cpu().clamp(min=1e-3)
        if bool(self.log_l0_start.isnan().any()):
            self.log_l0_start = l0.log()
        error = (l0 / self.set_point(step)).log().clamp(-1.0, 1.0)
        self.log_coeff = self.log_coeff + self.rate * gain * error

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"log_coeff": self.log_coeff.clone(), "log_l0_start": self.log_l0_start.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.log_coeff = state["log_coeff"].to(torch.float64).clone()
        self.log_l0_start = state["log_l0_start"].to(torch.float64).clone()


ROWS_FOR_CUT = 4096  # rows of the first chunk the initial cut looks at


@torch.no_grad()
def cut_for_l0(pre: torch.Tensor, target: float) -> torch.Tensor:
    """[d_sae] per latent, the value its pre-activations pre [rows, d_sae] exceed on target / d_sae of
    the rows (the (1 - target/d_sae) quantile, by kthvalue: torch.quantile refuses large inputs).
    b_enc − cut fires each latent on that fraction: L0 = target on these rows."""
    rows, d_sae = pre.shape
    above = min(max(round(rows * target / d_sae), 1), rows)   # rows each latent should fire on
    if above == rows:
        return pre.min(0).values - 1
    return pre.kthvalue(rows - above, dim=0).values            # `above` rows lie above the (rows − above)-th smallest
