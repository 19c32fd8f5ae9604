"""The residual stream taken apart: decomposition, direct logit attribution, MLP neurons.

    _, cache = model.run_with_cache(tokens)
    parts = residual_decomposition(model, cache)       # embed, pos_embed, L0H0.., L0 MLP.., biases
    dla = direct_logit_attribution(model, cache, answer=tok_id, wrong=other_id)
    dla.top(5)                                         # the components that push the answer most

The final residual stream is a sum: token embedding + position embedding + every head's output
(z @ W_O, per head) + every MLP's output (without its bias) + all the output biases (b_O, b_out).
`residual_decomposition` returns exactly those parts. Direct logit attribution sends each part
through the final norm, using the norm's cached per-position scale (so the parts still add up),
and onto an unembedding direction.

Under post-norms (Gemma's ln1_post / ln2_post, OLMo-2) a sublayer's output is normalised before it
joins the residual stream, so the heads' outputs do not add up to it by themselves. A head's part is
then its share of the normalised attention output: the post-norm read as the linear map it is once its
scale is fixed to this run's (cached ln1_post.hook_scale), applied to the head's z @ W_O, i.e.
w ⊙ result_h / scale (centred first for LayerNorm). The heads' parts plus the biases' share (b_O through
the same map, plus the norm's bias) are exactly hook_attn_out; likewise for the MLP. With a final-logit
soft-cap, direct logit attribution explains the logit before the cap (the unembedding's output); the
model's logit is c·tanh(that / c), a monotone function of it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from circuitlab.checks import LAST_POS
from circuitlab.analysis._json import round_tensor
from circuitlab.display import Displayed
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.model.assumptions import require
from circuitlab.model.components import Norm
from circuitlab.names import head_name

if TYPE_CHECKING:
    from circuitlab.model import Transformer


# ---------------------------------------------------------------------------- decomposition


@dataclass
class ResidualDecomposition:
    """labels[i] names components[i]; components [component, batch, pos, d_model] sum to the final
    residual stream (blocks.{last}.hook_resid_post)."""

    labels: list[str]
    components: torch.Tensor

    def total(self) -> torch.Tensor:
        """[batch, pos, d_model]"""
        return self.components.sum(dim=0)

    def norms(self) -> torch.Tensor:
        """Mean L2 norm of each component over batch and positions: [component]."""
        return self.components.norm(dim=-1).mean(dim=(1, 2))

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "mean_norm": [round(float(x), 6) for x in self.norms()]}


def _require(cache, names: list[str]) -> None:
    missing = [n for n in names if n not in cache]
    if missing:
        raise CircuitlabError(f"the cache lacks {', '.join(missing[:3])}: run model.run_with_cache(tokens) "
                              "with no names_filter")


@torch.no_grad()
def residual_decomposition(model: Transformer, cache) -> ResidualDecomposition:
    """Split the final residual stream into embed, pos_embed (learned positions), each head L{l}H{h}
    (hook_result if cached, else z @ W_O), each MLP "L{l} MLP" (hook_mlp_out minus b_out) and
    "biases" (all b_O and b_out). Components: [component, batch, pos, d_model]. Under post-norms a head's
    part is its share of the post-normed output at this run's scale (Block.attn_out_shares; module doc)."""
    cfg = model.cfg
    post = cfg.block_norms != "pre"
    names = ["hook_embed"] + (["hook_pos_embed"] if cfg.positional == "learned" else [])
    for layer in range(cfg.n_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        if cfg.has_mlp:
            names.append(f"blocks.{layer}.hook_mlp_out")
            names += [f"blocks.{layer}.ln2_post.hook_scale"] if post else []
    _require(cache, names)
    labels, parts = ["embed"], [cache["hook_embed"]]
    if cfg.positional == "learned":
        labels.append("pos_embed")
        parts.append(cache["hook_pos_embed"])
    W_O = model.W_O
    bias = torch.zeros(cfg.d_model, device=parts[0].device, dtype=parts[0].dtype)
    for layer in range(cfg.n_layers):
        block = model.blocks[layer]
        if f"blocks.{layer}.attn.hook_result" in cache:
            result = cache["result", layer]  # [batch, pos, head, d_model]
        else:
            result = torch.einsum("bphd,hdm->bphm", cache["z", layer], W_O[layer])
        result, b_O = block.attn_out_shares(result)  # post-norm: each head's share at this run's scale
        labels += [head_name(layer, h) for h in range(cfg.n_heads)]
        parts += list(result.unbind(dim=2))
        bias = bias + b_O
        if cfg.has_mlp:
            b_out = model.b_out[layer]
            if post:  # b_out's share of the post-normed MLP output, at this run's scale
                norm = block.ln2_post
                assert isinstance(norm, Norm)  # post-norm blocks have one (a norm kind is required)
                b_out = norm.linear(b_out, cache[f"blocks.{layer}.ln2_post.hook_scale"]) + norm.bias
            labels.append(f"L{layer} MLP")
            parts.append(cache["mlp_out", layer] - b_out)
            bias = bias + b_out
    labels.append("biases")
    parts.append(bias.expand_as(parts[0]))
    return ResidualDecomposition(labels, torch.stack(parts))


# ---------------------------------------------------------------------------- direct logit attribution


@dataclass
class LogitAttribution(Displayed):
    """Direct logit attribution at one position.

    attributions [component, batch]: each component's direct effect on the logit of `answer`
    (minus that of `wrong`, when given); constant [batch]: the part no component owns (final norm
    bias and b_U); logit [batch]: the model's actual logit (difference). Σ attributions + constant
    = logit.
    """

    labels: list[str]
    attributions: torch.Tensor
    constant: torch.Tensor
    logit: torch.Tensor
    answer: list[int]
    wrong: list[int] | None
    pos: int

    def mean(self) -> torch.Tensor:
        """[component], averaged over the batch."""
        return self.attributions.mean(dim=1)

    def top(self, n: int = 5) -> list[tuple[str, float]]:
        """The n components with the largest mean |attribution|, with their signed mean."""
        mean = self.mean()
        order = mean.abs().argsort(descending=True)[:n].tolist()
        return [(self.labels[i], float(mean[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "mean": [round(float(x), 6) for x in self.mean()],
                "constant": round(float(self.constant.mean()), 6), "logit": round(float(self.logit.mean()), 6),
                "answer": self.answer, "wrong": self.wrong, "pos": self.pos,
                "top": [{"component": c, "attribution": round(v, 6)} for c, v in self.top(8)]}



def token_ids(x: int | torch.Tensor | list[int], batch: int, what: str, d_vocab: int) -> torch.Tensor:
    """x as [batch] token ids: one id for every sequence, or one per sequence; a one-line error (naming
    `what`) when the count or a value is wrong."""
    ids = torch.as_tensor(x, dtype=torch.long).flatten()
    if ids.numel() == 1:
        ids = ids.expand(batch)
    if ids.numel() != batch:
        raise CircuitlabError(f"{what} must be one token id or one per sequence ({batch}), got {ids.numel()}")
    if bool((ids < 0).any() or (ids >= d_vocab).any()):
        raise CircuitlabError(f"{what} token ids must be in [0, {d_vocab}), got {ids.tolist()}")
    return ids


def through_final_norm(model: Transformer, stream: torch.Tensor, direction: torch.Tensor, scale: torch.Tensor | None
                       ) -> torch.Tensor:
    """Each part of the residual stream's direct contribution to a logit direction: stream [..., batch,
    d_model] read through the final norm as the linear map it is once its scale [batch, 1] (the cached
    ln_final.hook_scale) is fixed (centred for LayerNorm, divided by the scale, times the gain), then dotted
    with direction [batch, d_model] (W_U columns). Returns [..., batch]; the norm's bias is not included.
    With a logit soft-cap (cfg.linear_readout False) this explains the logit before the cap."""
    cfg = model.cfg
    if cfg.norm == "layernorm":
        stream = stream - stream.mean(dim=-1, keepdim=True)
    if isinstance(model.ln_final, Norm):  # cfg.norm != "none"
        assert scale is not None, "through_final_norm needs the final norm's scale (ln_final.hook_scale)"
        stream = stream / scale
        direction = direction * model.ln_final.w
    return (stream * direction).sum(dim=-1)


@torch.no_grad()
def direct_logit_attribution(model: Transformer, cache, answer: int | list[int] | torch.Tensor,
                             wrong: int | list[int] | torch.Tensor | None = None, pos: int = LAST_POS,
                             decomposition: ResidualDecomposition | None = None) -> LogitAttribution:
    """Each residual component's direct contribution to the logit of `answer` at position pos
    (or to logit(answer) - logit(wrong)).

    answer / wrong: a token id, or one per sequence [batch]. A component c contributes
    norm_linear(c) · (w ⊙ u), where u = W_U[:, answer] (- W_U[:, wrong]), w is the final norm's gain
    and norm_linear centres c (LayerNorm) and divides by the final norm's cached scale
    (ln_final.hook_scale) at that position. The cache must hold that scale when the model has norms.
    """
    cfg = model.cfg
    parts = decomposition if decomposition is not None else residual_decomposition(model, cache)
    T = parts.components.shape[2]
    if not -T <= pos < T:
        raise CircuitlabError(f"pos {pos} is outside the sequence of length {T}")
    comps = parts.components[:, :, pos]  # [component, batch, d_model]
    B = comps.shape[1]
    answer_ids = token_ids(answer, B, "answer", cfg.d_vocab).to(comps.device)
    wrong_ids = token_ids(wrong, B, "wrong", cfg.d_vocab).to(comps.device) if wrong is not None else None
    W_U, b_U = model.W_U, model.b_U
    direction = W_U[:, answer_ids].T  # [batch, d_model]
    const = b_U[answer_ids]
    if wrong_ids is not None:
        direction = direction - W_U[:, wrong_ids].T
        const = const - b_U[wrong_ids]
    scale = None
    if cfg.norm != "none":
        _require(cache, ["ln_final.hook_scale"])
        scale = cache["ln_final.hook_scale"][:, pos]  # [batch, 1]
        if isinstance(model.ln_final, Norm) and model.ln_final.b is not None:
            const = const + direction @ model.ln_final.b
    attributions = through_final_norm(model, comps, direction, scale)  # [component, batch]
    final = cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"] if cfg.n_layers else parts.total()
    logits = model.readout(final[:, pos], soft_cap=False)  # [batch, d_vocab], before any soft-cap
    logit = logits.gather(1, answer_ids[:, None])[:, 0]
    if wrong_ids is not None:
        logit = logit - logits.gather(1, wrong_ids[:, None])[:, 0]
    return LogitAttribution(parts.labels, attributions.cpu(), const.cpu(), logit.cpu(), answer_ids.tolist(),
                            wrong_ids.tolist() if wrong_ids is not None else None, pos % T)


# ---------------------------------------------------------------------------- MLP neurons


@dataclass
class NeuronTokens:
    """The tokens each neuron's output direction promotes and suppresses through the unembedding.

    top_tokens, top_values, bottom_tokens, bottom_values: [neuron, k]."""

    layer: int
    neurons: list[int]
    top_tokens: torch.Tensor
    top_values: torch.Tensor
    bottom_tokens: torch.Tensor
    bottom_values: torch.Tensor
    top_strs: list[list[str]] | None = None
    bottom_strs: list[list[str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"layer": self.layer, "neurons": self.neurons, "top_tokens": self.top_tokens.tolist(),
                             "top_values": round_tensor(self.top_values), "bottom_tokens": self.bottom_tokens.tolist(),
                             "bottom_values": round_tensor(self.bottom_values)}
        if self.top_strs is not None:
            d.update(top_strs=self.top_strs, bottom_strs=self.bottom_strs)
        return d


def _check_neurons(model: Transformer, layer: int, neurons: list[int] | None) -> list[int]:
    cfg = model.cfg
    if not cfg.has_mlp:
        raise CircuitlabError("this model is attention-only: it has no MLP neurons")
    if not 0 <= layer < cfg.n_layers:
        raise CircuitlabError(f"layer {layer} is out of range: the model has {cfg.n_layers} layers")
    neurons = list(range(cfg.mlp_dim)) if neurons is None else [int(n) for n in neurons]
    bad = [n for n in neurons if not 0 <= n < cfg.mlp_dim]
    if bad or not neurons:
        raise CircuitlabError(f"neuron indices must be in [0, {cfg.mlp_dim}), got {bad or 'none'}")
    return neurons


@torch.no_grad()
def neuron_output_tokens(model: Transformer, layer: int, neurons: list[int] | None = None, k: int = 10,
                         tokenizer=None) -> NeuronTokens:
    """Key-value view of MLP neurons: neuron n writes its activation times W_out[layer, n] [d_model];
    its "value" is that direction read through the final norm's gain (centred for LayerNorm) and W_U,
    a logit change [d_vocab] per unit of activation. The norm's per-token scale is left out: it is
    positive and does not change which tokens rank highest. neurons default: all of the layer.
    Pre-norm models only: a post-norm (ln2_post) would stand between W_out and the residual stream.
    """
    require(model, "the neurons' output tokens", "pre_norm")
    neurons = _check_neurons(model, layer, neurons)
    logits = model.unembed_directions(model.W_out[layer, neurons])  # [neuron, d_vocab]
    k = min(k, logits.shape[-1])
    top_values, top_tokens = logits.topk(k, dim=-1)
    bottom_values, bottom_tokens = logits.topk(k, dim=-1, largest=False)
    result = NeuronTokens(layer, neurons, top_tokens.cpu(), top_values.cpu(), bottom_tokens.cpu(), bottom_values.cpu())
    if tokenizer is not None:
        result.top_strs = [[tokenizer.decode([t]) for t in row] for row in top_tokens.tolist()]
        result.bottom_strs = [[tokenizer.decode([t]) for t in row] for row in bottom_tokens.tolist()]
    return result


@dataclass
class NeuronExamples:
    """The inputs that activate each neuron most: values, seq (index in the dataset), pos: [neuron, k];
    contexts[i][j]: the tokens up to and including the activating one (at most `context` + 1)."""

    layer: int
    neurons: list[int]
    values: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor
    contexts: list[list[list[int]]]
    context_strs: list[list[str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"layer": self.layer, "neurons": self.neurons, "values": round_tensor(self.values),
                             "seq": self.seq.tolist(), "pos": self.pos.tolist(), "contexts": self.contexts}
        if self.context_strs is not None:
            d["context_strs"] = self.context_strs
        return d


@torch.no_grad()
def top_activating_inputs(model: Transformer, batches: Iterable[torch.Tensor] | torch.Tensor, layer: int,
                          neurons: list[int],
                          k: int = 10, context: int = 8, tokenizer=None, progress: bool = False) -> NeuronExamples:
    """The k (sequence, position) pairs with the highest activation (mlp.hook_post) of each neuron.

    batches: token batches [batch, pos] (an iterable, or one tensor taken as a single batch); sequences are
    numbered in the order seen. Memory stays at k candidates per neuron, whatever the dataset size.
    """
    neurons = _check_neurons(model, layer, neurons)
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    name = f"blocks.{layer}.mlp.hook_post"
    device = model_device(model)
    n = len(neurons)
    best_vals = torch.empty(n, 0)
    best_seq = best_pos = torch.empty(n, 0, dtype=torch.long)
    best_ctx: list[list[list[int]]] = [[] for _ in neurons]
    seen = 0
    for tokens in tqdm(batches, desc=f"neurons L{layer}", disable=not progress):
        tokens = (tokens[None] if tokens.dim() == 1 else tokens).cpu()
        _, cache = model.run_with_cache(tokens.to(device), names_filter=name)
        acts = cache[name][..., neurons].float().cpu()  # [batch, pos, neuron]
        B, T = acts.shape[:2]
        vals, idx = acts.reshape(B * T, n).T.topk(min(k, B * T), dim=-1)  # [neuron, k] this batch's best
        seq, pos = idx // T, idx % T
        ctx = [[tokens[b, max(0, p - context):p + 1].tolist() for b, p in zip(seq[i].tolist(), pos[i].tolist())]
               for i in range(n)]
        # Merge with the best so far, keeping k per neuron.
        all_vals = torch.cat([best_vals, vals], dim=1)
        best_vals, order = all_vals.topk(min(k, all_vals.shape[1]), dim=-1)
        best_seq = torch.cat([best_seq, seq + seen], dim=1).gather(1, order)
        best_pos = torch.cat([best_pos, pos], dim=1).gather(1, order)
        best_ctx = [[(best_ctx[i] + ctx[i])[j] for j in order[i].tolist()] for i in range(n)]
        seen += B
    if seen == 0:
        raise CircuitlabError("top_activating_inputs got no token batches")
    result = NeuronExamples(layer, neurons, best_vals, best_seq, best_pos, best_ctx)
    if tokenizer is not None:
        result.context_strs = [[tokenizer.decode(c) for c in row] for row in best_ctx]
    return result

