"""Context mixing: how much of each position's residual stream came from each source token, by the norms of
what attention moves (Kobayashi et al. 2020), rolled out through every layer. No gradient, no target."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from circuitlab.analysis.input_attribution.base import InputAttribution, _decorate, _sequence
from circuitlab.analysis.input_attribution.options import DEFAULT_POS
from circuitlab.analysis.input_attribution.techniques import Technique
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@torch.no_grad()
def context_mixing(model: Transformer, tokens: torch.Tensor, pos: int = DEFAULT_POS, tokenizer=None
                   ) -> InputAttribution:
    """Norm-based context mixing, rolled out through every layer.

    In layer l, source j moves ‖Σ_h A[h, i, j] · v_h(j) W_O^h‖ into position i (v_h includes ln1 and
    b_V; b_O belongs to no source), and position i keeps its own residual ‖resid_pre(i)‖. Each row,
    normalised to sum to 1, is that layer's mixing matrix M_l [pos, pos]; MLPs act on one position
    and do not mix. scores [pos] = row `pos` of M_{L-1} ··· M_0 (the share of the final residual at
    pos that came from each input token); per_layer [layer, pos] = row `pos` of each M_l.
    """
    tokens = _sequence(tokens, model)
    T = tokens.shape[0]
    if not -T <= pos < T:
        raise CircuitlabError(f"pos {pos} is outside the sequence of length {T}")
    pos %= T
    cfg = model.cfg
    if cfg.n_layers == 0:
        raise CircuitlabError("context mixing reads attention: this model has no layers")
    names = [n for l in range(cfg.n_layers) for n in
             (f"blocks.{l}.hook_resid_pre", f"blocks.{l}.attn.hook_v", f"blocks.{l}.attn.hook_pattern")]
    _, cache = model.run_with_cache(tokens[None], names_filter=names)
    W_O = model.W_O  # [layer, head, d_head, d_model]
    rollout = torch.eye(T, dtype=torch.float64, device=tokens.device)
    rows = []
    for l in range(cfg.n_layers):
        v = cache["v", l][0]  # [pos, kv_head, d_head]
        if v.shape[1] != cfg.n_heads:
            v = v.repeat_interleave(cfg.n_heads // v.shape[1], dim=1)
        written = torch.einsum("jhd,hdm->jhm", v, W_O[l]).double()  # [pos, head, d_model]: what head h moves from j
        gram = torch.einsum("jhm,jgm->jhg", written, written)  # [pos, head, head]
        A = cache["pattern", l][0].double()  # [head, query, key]
        moved = torch.einsum("hij,jhg,gij->ij", A, gram, A).clamp(min=0).sqrt()  # [query, key] norms
        mixing = moved + torch.diag(cache["resid_pre", l][0].double().norm(dim=-1))
        mixing = mixing / mixing.sum(-1, keepdim=True).clamp(min=1e-30)
        rows.append(mixing[pos])
        rollout = mixing @ rollout
    result = InputAttribution("context-mixing", tokens.tolist(), rollout[pos].float().cpu(), pos,
                              per_layer=torch.stack(rows).float().cpu())
    return _decorate(result, tokenizer)


CONTEXT_MIXING = Technique("context-mixing", context_mixing, label="context mixing",
                           no_target="context mixing reads attention, not a target")
