"""What a dictionary's features do to the logits: their logit effect (W_dec · W_U) and their direct
logit attribution on a prompt.

    effects = feature_logit_effects(model, sae)                    # [d_sae, d_vocab] per unit activation
    dla = feature_logit_attribution(model, sae, tokens, answer=id) # each feature's share of the logit
    dla.top(5)

A feature writes acts · W_dec[f] into the space the dictionary reconstructs (for a transcoder, the MLP
output). Into the residual stream that is W_dec[f] itself (resid_*, attn_out, mlp_out), W_dec[f] @ W_out
(mlp.hook_post), or the heads' W_O (attn.hook_z). The final norm is read as analysis.logit_attribution reads it
(through_final_norm: centred for LayerNorm, times the gain, and for DLA divided by the cached scale).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.checks import LAST_POS
from circuitlab.analysis.logit_attribution import through_final_norm, token_ids
from circuitlab.dictionaries.splice import sae_hook_name, splice
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.dictionaries.sae import SparseDictionary
    from circuitlab.model import Transformer

_RESIDUAL = re.compile(r"^(hook_embed|hook_pos_embed|blocks\.\d+\.(hook_resid_pre|hook_resid_mid|hook_resid_post|"
                       r"hook_attn_out|hook_mlp_out))$")
_MLP_POST = re.compile(r"^blocks\.(\d+)\.mlp\.hook_post$")
_HOOK_Z = re.compile(r"^blocks\.(\d+)\.attn\.hook_z$")



def output_hook(dictionary: Any) -> str:
    """The hook whose activation the dictionary reconstructs (its out_hook_name for a transcoder)."""
    return getattr(dictionary.cfg, "out_hook_name", None) or dictionary.cfg.hook_name


def to_residual(model: Transformer, hook: str, v: torch.Tensor) -> torch.Tensor:
    """Vectors in the space of `hook` [..., width] as the residual-stream vectors they write [..., d_model]
    (the linear part: no b_out / b_O)."""
    if _RESIDUAL.match(hook):
        return v
    if m := _MLP_POST.match(hook):
        return v @ model.W_out[int(m.group(1))]
    if m := _HOOK_Z.match(hook):
        W_O = model.W_O[int(m.group(1))]  # [head, d_head, d_model]
        return torch.einsum("...hd,hdm->...m", v.reshape(*v.shape[:-1], *W_O.shape[:2]), W_O)
    raise CircuitlabError(f"feature logit effects need a dictionary writing into the residual stream (resid, "
                          f"attn_out, mlp_out, mlp.hook_post or attn.hook_z); {hook} is none of those")


@torch.no_grad()
def feature_directions(model: Transformer, dictionary: SparseDictionary,
                       features: list[int] | None = None) -> torch.Tensor:
    """Each feature's decoder row as a residual-stream direction: [feature, d_model]."""
    W_dec = dictionary.W_dec if features is None else dictionary.W_dec[features]
    return to_residual(model, output_hook(dictionary), W_dec.to(model.W_U.dtype))


@torch.no_grad()
def feature_logit_effects(model: Transformer, dictionary: SparseDictionary,
                          features: list[int] | None = None) -> torch.Tensor:
    """The logit change per unit activation of each feature, through the final norm's gain and W_U
    (its positive per-token scale left out): [feature, d_vocab]. features default: all."""
    return model.unembed_directions(feature_directions(model, dictionary, features))


@dataclass
class FeatureAttribution:
    """Direct logit attribution of a dictionary's features at one position.

    attributions [d_sae, batch]: each feature's direct effect on logit(answer) (- logit(wrong));
    error [batch], bias [batch], skip [batch]: the same for the error term, the decoder bias b_dec and a
    skip transcoder's x @ W_skip (zero without one), so attributions.sum(0) + error + bias + skip is the
    direct effect of the whole hook (transcoder: MLP output) activation, without b_out / b_O.
    """

    hook_name: str
    attributions: torch.Tensor
    error: torch.Tensor
    bias: torch.Tensor
    skip: torch.Tensor
    answer: list[int]
    wrong: list[int] | None
    pos: int

    def mean(self) -> torch.Tensor:
        """[d_sae], averaged over the batch."""
        return self.attributions.mean(dim=1)

    def top(self, n: int = 10) -> list[tuple[int, float]]:
        """The n features with the largest mean |attribution|, with their signed mean."""
        mean = self.mean()
        order = mean.abs().argsort(descending=True)[:n].tolist()
        return [(i, float(mean[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        return {"hook_name": self.hook_name, "answer": self.answer, "wrong": self.wrong, "pos": self.pos,
                "error": round(float(self.error.mean()), 6), "bias": round(float(self.bias.mean()), 6),
                "top": [{"feature": f, "attribution": round(v, 6)} for f, v in self.top(10)]}

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{f}</td><td>{v:+.4f}</td></tr>" for f, v in self.top(10))
        return (f"<b>Feature DLA at {self.hook_name}, position {self.pos}</b> (error {float(self.error.mean()):+.4f}, "
                f"b_dec {float(self.bias.mean()):+.4f})<table><tr><th>feature</th><th>attribution</th></tr>"
                f"{rows}</table>")


@torch.no_grad()
def feature_logit_attribution(model: Transformer, dictionary: SparseDictionary, tokens: torch.Tensor, answer: Any,
                              wrong: Any = None,
                              pos: int = LAST_POS) -> FeatureAttribution:
    """Each feature's direct contribution to logit(answer) (- logit(wrong)) at position pos.

    tokens [batch, pos]; answer / wrong: a token id or one per sequence [batch]. The model runs once with
    the dictionary spliced in (output unchanged), caching the features, the error and the final norm's scale.
    """
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    B, T = tokens.shape
    if not -T <= pos < T:
        raise CircuitlabError(f"pos {pos} is outside the sequence of length {T}")
    cfg = model.cfg
    acts_name, error_name = sae_hook_name(dictionary, "acts_post"), sae_hook_name(dictionary, "error")
    input_name, has_skip = sae_hook_name(dictionary, "input"), bool(getattr(dictionary.cfg, "skip", False))
    names = [acts_name, error_name] + (["ln_final.hook_scale"] if cfg.norm != "none" else [])
    names += [input_name] if has_skip else []
    with splice(model, dictionary):
        _, cache = model.run_with_cache(tokens, names_filter=names)
    answer_ids = token_ids(answer, B, "answer", cfg.d_vocab)
    wrong_ids = token_ids(wrong, B, "wrong", cfg.d_vocab) if wrong is not None else None
    direction = model.W_U[:, answer_ids].T  # [batch, d_model]
    if wrong is not None:
        direction = direction - model.W_U[:, wrong_ids].T
    scale = cache["ln_final.hook_scale"][:, pos] if cfg.norm != "none" else None  # [batch, 1]
    hook = output_hook(dictionary)
    dtype = model.W_U.dtype

    def logit_of(stream: torch.Tensor) -> torch.Tensor:  # [..., batch, d_model] -> [..., batch]
        return through_final_norm(model, stream, direction, scale)

    per_feature = logit_of(feature_directions(model, dictionary)[:, None, :])  # [d_sae, batch] per unit
    acts = cache[acts_name][:, pos].to(dtype)  # [batch, d_sae]
    error = logit_of(to_residual(model, hook, cache[error_name][:, pos].to(dtype)))
    bias = logit_of(to_residual(model, hook, dictionary.b_dec.to(dtype)).expand(B, -1))
    skip = torch.zeros(B, dtype=dtype)
    if has_skip:
        skip = logit_of(to_residual(model, hook, (cache[input_name][:, pos] @ dictionary.W_skip).to(dtype)))
    return FeatureAttribution(dictionary.cfg.hook_name, (acts.T * per_feature).cpu(), error.cpu(), bias.cpu(),
                              skip.cpu(),
                              answer_ids.tolist(), None if wrong_ids is None else wrong_ids.tolist(),
                              pos % T)
