"""Logit lens: read the residual stream after every layer as if it were the last.

    lens = logit_lens(model, tokens, k=5, tokenizer=tok)
    lens.top_strs[-1][3]        # the model's top-5 next tokens at position 3
    lens.final_top_probs[:, 3]  # how sure each layer already is of the final answer there

The residual after the embeddings and after each block goes through the model's own final norm
(recomputed on that residual: its mean and scale are those of the partial residual, as in the
original logit lens) and the unembedding, b_U included. The last point is the model's output.

The package: this module (the logit lens) and tuned.py (the tuned lens: a trained affine translator per
layer, read out the same way).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis._json import round_tensor
from circuitlab.analysis.patching.checks import one_sequence
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class LogitLens(Displayed):
    """Per point of the residual stream (`labels`: "embed", "L0", "L1", ...) and per position.

    top_tokens, top_probs [point, pos, k]: the k most likely next tokens and their probabilities;
    entropy [point, pos]: of the full next-token distribution (nats);
    final_top_probs [point, pos]: probability given to the model's final top-1 token at that position.
    """

    labels: list[str]
    tokens: list[int]
    top_tokens: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    final_top_probs: torch.Tensor
    token_strs: list[str] | None = None
    top_strs: list[list[list[str]]] | None = None  # [point][pos][k]
    kl_to_final: torch.Tensor | None = None  # [point, pos]: KL(final distribution ‖ this point's), nats
    name: str = "logit lens"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"labels": self.labels, "tokens": self.tokens,
                             "top_tokens": self.top_tokens.tolist(),
                             "top_probs": round_tensor(self.top_probs, 5), "entropy": round_tensor(self.entropy, 5),
                             "final_top_probs": round_tensor(self.final_top_probs, 5)}
        if self.token_strs is not None:
            d["token_strs"] = self.token_strs
            d["top_strs"] = self.top_strs
        if self.kl_to_final is not None:
            d["kl_to_final"] = round_tensor(self.kl_to_final, 5)
            d["mean_kl_to_final"] = round_tensor(self.kl_to_final.mean(dim=-1), 5)
        d["name"] = self.name
        return d



def residual_points(model: Transformer, cache) -> tuple[list[str], torch.Tensor]:
    """The residual stream after the embeddings and after each block: (labels, [point, batch, pos, d_model])."""
    L = model.cfg.n_layers
    names = (["blocks.0.hook_resid_pre"] if L else []) + [f"blocks.{l}.hook_resid_post" for l in range(L)]
    missing = [n for n in names if n not in cache]
    if missing:
        raise CircuitlabError(f"the cache lacks {missing[0]}: run model.run_with_cache(tokens) with no names_filter")
    if L:
        return ["embed"] + [f"L{l}" for l in range(L)], torch.stack([cache[n] for n in names])
    resid = cache["hook_embed"] + (cache["hook_pos_embed"] if model.cfg.positional == "learned" else 0)
    return ["embed"], resid[None]


@torch.no_grad()
def logit_lens(model: Transformer, tokens: torch.Tensor, k: int = 5, tokenizer=None, cache=None) -> LogitLens:
    """Logit lens on one sequence, tokens [pos] (or [1, pos]).

    tokenizer: optional, anything with decode(list[int]) -> str, to fill token_strs and top_strs.
    cache: optional ActivationCache of this sequence holding the residual hooks (saves a forward pass).
    """
    tokens = one_sequence(model, tokens, "logit_lens")
    if cache is None:
        _, cache = model.run_with_cache(tokens[None],
                                        names_filter=lambda n: "resid" in n or n in ("hook_embed", "hook_pos_embed"))
    labels, resid = residual_points(model, cache)  # [point, 1, pos, d_model]
    logits = model.readout(resid[:, 0])  # [point, pos, d_vocab]
    return lens_readout(labels, tokens, logits, k, tokenizer)


@torch.no_grad()
def lens_readout(labels: list[str], tokens: torch.Tensor, logits: torch.Tensor, k: int = 5, tokenizer=None,
                 name: str = "logit lens") -> LogitLens:
    """The read-outs of any lens from its logits [point, pos, d_vocab], the last point being the model's
    output: top-k tokens, entropy, probability of the final top-1 token, KL(final ‖ point) per position."""
    log_probs = logits.float().log_softmax(dim=-1)
    probs = log_probs.exp()
    top_probs, top_tokens = probs.topk(min(k, probs.shape[-1]), dim=-1)
    entropy = -(probs * log_probs).sum(dim=-1)
    final_top = top_tokens[-1, :, 0]  # [pos]
    final_top_probs = probs.gather(-1, final_top.expand(probs.shape[0], -1)[..., None])[..., 0]
    kl = (probs[-1] * (log_probs[-1] - log_probs)).sum(dim=-1).clamp(min=0)  # [point, pos]
    lens = LogitLens(labels, tokens.tolist(), top_tokens.cpu(), top_probs.cpu(), entropy.cpu(), final_top_probs.cpu(),
                     kl_to_final=kl.cpu(), name=name)
    if tokenizer is not None:
        lens.token_strs = [tokenizer.decode([t]) for t in lens.tokens]
        lens.top_strs = [[[tokenizer.decode([t]) for t in row] for row in point] for point in top_tokens.tolist()]
    return lens

