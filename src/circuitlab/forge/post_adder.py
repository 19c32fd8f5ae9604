"""The reference post's 2-digit adder: 2 layers, one V-only head each, d_model 3; the answer is read off EOS's
final residual in Python (PostAdder.readout)."""
from __future__ import annotations

from typing import Any

import torch

from circuitlab.forge.adder_base import D_VOCAB, EOS, Adder, AdderCheck, _fmt, _token_name, _vec, digits_of
from circuitlab.forge.builder import Forge, ResidualLayout

class PostAdder(Adder):
    """The post's 2-digit adder. Readout in Python: round(10 · x[digit] + x[acc]) of EOS's final residual."""

    design = "post"
    layout: ResidualLayout  # always built with one

    def final_eos_residual(self, prompts: torch.Tensor) -> torch.Tensor:
        """prompts [batch, 5] -> EOS's residual after the last layer [batch, 3] = [acc, digit, sign]."""
        name = f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post"
        _, cache = self.model.run_with_cache(prompts, names_filter=[name])
        return cache[name][:, -1]

    def readout(self, prompts: torch.Tensor) -> torch.Tensor:
        """[batch, 5] -> 10 · x[digit] + x[acc] before rounding [batch] (float)."""
        x = self.final_eos_residual(prompts)
        return 10 * self.layout.read(x, "digit")[:, 0] + self.layout.read(x, "acc")[:, 0]

    def answer_digits(self, prompts: torch.Tensor) -> torch.Tensor:
        value = self.readout(prompts).round().long().clamp(min=0)
        return digits_of(value, self.n_answer)

    def check(self, *args: Any, **kwargs: Any) -> AdderCheck:
        result = super().check(*args, **kwargs)
        # How far the residual is from whole numbers: the margin that rounding relies on.
        idx = torch.arange(10_000)
        prompts = torch.cat([digits_of(idx // 100, 2), digits_of(idx % 100, 2), torch.full((10_000, 1), EOS)], 1)
        raw = self.readout(prompts)
        err = (raw - (idx // 100 + idx % 100)).abs().max().item()
        truncated = int((raw.floor().long() == idx // 100 + idx % 100).sum())
        result.note = (f"readout before rounding is off by at most {err:.2g}; truncating instead of rounding "
                       f"would get {truncated}/10000")
        return result

    def explain(self, a: Any, b: Any) -> str:
        prompt = self.prompt(a, b)
        a, b = int(a), int(b)
        _, cache = self.model.run_with_cache(prompt[None])
        names = [_token_name(t) for t in prompt.tolist()]
        stages = [("embedding", cache["hook_embed"] + cache["hook_pos_embed"])]
        stages += [(f"after layer {l}", cache["resid_post", l]) for l in range(self.model.cfg.n_layers)]
        lines = [f"{a} + {b} with the reference post's adder: 2 layers, one V-only head each, "
                 f"residual [{', '.join(self.layout.names)}]",
                 "tokens: " + "  ".join(f"{n:>3}" for n in names), ""]
        width = max(len(n) for n, _ in stages)
        for label, x in stages:
            cells = "  ".join(f"{t}:{_vec(x[0, i].tolist())}" for i, t in enumerate(names))
            lines.append(f"{label:<{width}}  {cells}")
        lines.append("")
        for l in range(self.model.cfg.n_layers):
            pattern = cache["pattern", l][0, 0, -1]
            cells = "  ".join(f"{t}:{p:.2f}" for t, p in zip(names, pattern.tolist()))
            lines.append(f"layer {l}: EOS attends  {cells}")
        x = cache["resid_post", self.model.cfg.n_layers - 1][0, -1]
        acc, digit = x[self.layout["acc"]].item(), x[self.layout["digit"]].item()
        lines += ["", f"EOS residual {_vec(x.tolist())} -> 10·{_fmt(digit)} + {_fmt(acc)} = "
                      f"{round(10 * digit + acc)}   (read off the residual in Python, as in the post)"]
        return "\n".join(lines)


def build_post_adder(qk_scale: float = 10.0) -> PostAdder:
    """The reference post's 2-digit adder, exactly as published (qk_scale 10).

    Residual (d_model 3): acc (dim 0), digit (dim 1), sign (dim 2: -1 at units positions, +1 at
    tens positions and EOS). The sign comes from a hand-set learned positional embedding, so the
    tokens stay the plain digits and EOS of the task format.
    """
    layout = ResidualLayout({"acc": 1, "digit": 1, "sign": 1})
    f = Forge(layout, n_layers=2, n_heads=1, d_head=3, use_attn_out=False, d_vocab=D_VOCAB, n_ctx=5,
              positional="learned")
    for d in range(10):
        f.embed(d, digit=d)           # W_E[d] = [0, d, 0]; EOS's row stays [0, 0, 0]
    for position, sign in enumerate([+1, -1, +1, -1, +1]):
        f.pos(position, sign=sign)    # W_pos: tens(a), units(a), tens(b), units(b), EOS
    # Layer 0: score = (s·sign_q)(-s·sign_k) = -s² sign_q sign_k: EOS (+1) scores +s² on the two units
    # positions (-1) and -s² on the rest, so it averages the two units digits; W_V = 2 undoes the
    # average and moves the digit into acc. EOS gets acc = units(a) + units(b).
    f.head(0).q("sign", qk_scale, into="sign").k("sign", -qk_scale, into="sign").v("digit", 2.0, into="acc")
    # Layer 1: score = s² sign_q sign_k: EOS scores +s² on tens(a), tens(b) and itself, averages their
    # digits (EOS's is 0) and W_V = 3 undoes the average of three. EOS gets digit = tens(a) + tens(b).
    f.head(1).q("sign", qk_scale, into="sign").k("sign", qk_scale, into="sign").v("digit", 3.0, into="digit")
    # No unembedding: the post reads 10·digit + acc off EOS's residual (PostAdder.readout).
    return PostAdder(f.model, layout, 2, 2)


