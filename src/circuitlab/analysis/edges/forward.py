"""The model's forward pass written over the edge graph, so that each edge can be patched on its own.

    run = graph_forward(model, graph, tokens)                       # same logits as model(tokens)
    run = graph_forward(model, graph, tokens, ref=ref, mask=mask)   # mask [copies, n_sources, n_readers]

Every reader input gets its own copy of the residual stream: the input of reader r is
    Σ_s out_s + b_O constants + Σ_s mask[c, s, r] · (ref_s − out_s)
where out_s is writer s's output in this run (so effects propagate) and ref_s its reference output
(the corrupted run's, zero, or a mean). mask 0 keeps an edge, 1 patches it fully, values between
interpolate (EAP-IG over edges). The reader then applies its own norm to its input. Each head gets
its own query, key and value inputs (TransformerLens's use_split_qkv_input: Block.split_attention), so
the model's plain forward carries no extra cost. Copies run in one batch: tensors are [copies, batch,
pos, ...]. Embedding, attention and read-out are the model's own (embed_tokens, split_attention, readout).

Architecture: every family circuitlab builds. A head writer's output is what it adds to the residual
stream: z_h W_O in a pre-norm block; under a post-norm (Gemma's ln1_post, OLMo-2) its share of the
normalised attention output, the norm read as the linear map it is at the scale of that copy's whole
attention output (Block.attn_out_shares), so with no edge patched the graph computes the model exactly,
and a patched edge carries the reference run's share. An MLP writer's output is hook_mlp_out (after any
post-norm).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from circuitlab.analysis.edges.edge_graph import EdgeGraph

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class EdgeRun:
    """One (batched) run over the graph.

    logits [copies, batch, pos, d_vocab]; outputs: per group of writers (input, each layer's heads, each
    MLP) the writers' indices and their outputs [copies, batch, pos, n_group, d_model]; inputs: per group
    of readers (each layer's q/k/v, each MLP, logits) the reader indices and their inputs
    [copies, batch, pos, n_group, d_model] (before the reader's norm); resid[l]: the residual stream
    entering layer l [copies, batch, pos, d_model] (constants included).
    """

    logits: torch.Tensor
    outputs: list[tuple[list[int], torch.Tensor]]
    inputs: list[tuple[list[int], torch.Tensor]] = field(default_factory=list)
    resid: list[torch.Tensor] = field(default_factory=list)

    def source_outputs(self) -> torch.Tensor:
        """All writers' outputs [copies, batch, pos, n_sources, d_model], in graph order."""
        copies = max(o.shape[0] for _, o in self.outputs)
        return torch.cat([o.expand(copies, *o.shape[1:]) for _, o in self.outputs], dim=-2)


def input_output(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """The input node's output: token + position embeddings, tokens [batch, pos] -> [1, batch, pos, d_model]."""
    return model.embed_tokens(tokens)[None]


def graph_forward(model: Transformer, graph: EdgeGraph, tokens: torch.Tensor, *, ref: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None, input_out: torch.Tensor | None = None,
                  base: EdgeRun | None = None, start: int = 0, reads: Sequence[int] | None = None
                  ) -> EdgeRun:
    """Run tokens [batch, pos] through the graph.

    ref: reference writer outputs, broadcastable to [batch, pos, n_sources, d_model]; mask: [copies,
    n_sources, n_readers] patch weights (entries off the graph's edges are ignored); input_out: the input
    node's output [copies or 1, batch, pos, d_model] instead of the embeddings; base + start: begin at
    layer `start`, taking the writers before it and the residual stream entering it from `base` (a run
    of the same tokens whose earlier layers the mask does not touch); reads: the only positions whose
    logits are computed (others NaN). Gradients flow when enabled.
    """
    cfg = model.cfg
    H, K = cfg.n_heads, cfg.kv_heads
    if base is not None and start > 0:
        n_before = 1 + sum(1 for l in graph.source_layer if 0 <= l < start)
        outputs = [(idx, o) for idx, o in base.outputs if idx[0] < n_before]
        resid = base.resid[start]
    else:
        start = 0
        x0 = input_out if input_out is not None else input_output(model, tokens)
        outputs, resid = [([0], x0[..., None, :])], x0
    run = EdgeRun(None, outputs, [], [])  # type: ignore[arg-type]

    def reader_inputs(readers: list[int]) -> torch.Tensor:
        x = resid[..., None, :]
        if mask is None or ref is None:
            return x.expand(*x.shape[:-2], len(readers), x.shape[-1])
        terms = x
        for idx, out in run.outputs:
            weights = mask[:, idx][:, :, readers]  # [copies, n_group, n_readers]
            if not bool(weights.any()):
                continue
            diff = ref[..., idx, :] - out  # [copies or 1, batch, pos, n_group, d_model]
            terms = terms + torch.einsum("cbpsd,csr->cbprd", diff.expand(weights.shape[0], *diff.shape[1:]),
                                         weights.to(diff.dtype))
        return terms.expand(*terms.shape[:-2], len(readers), terms.shape[-1])

    for l in range(start, cfg.n_layers):
        block = model.blocks[l]
        run.resid.append(resid)
        readers = graph.layer_readers(l)
        attn_readers = readers[: H + 2 * K]
        x_attn = reader_inputs(attn_readers)  # [c, b, p, H + 2K, d]
        run.inputs.append((attn_readers, x_attn))
        mlp_in = None
        if cfg.has_mlp and cfg.parallel_attn_mlp:  # the MLP reads what attention reads
            mlp_in = reader_inputs(readers[-1:])
        head_out = block.split_attention(x_attn[..., :H, :], x_attn[..., H:H + K, :],
                                         x_attn[..., H + K:, :])  # [c, b, p, H, d]
        head_out, rest = block.attn_out_shares(head_out)  # post-norm: each head's share at this copy's scale
        first = 1 + l * (H + int(cfg.has_mlp))
        run.outputs.append((list(range(first, first + H)), head_out))
        resid = resid + head_out.sum(-2) + rest
        if cfg.has_mlp:
            if mlp_in is None:
                mlp_in = reader_inputs(readers[-1:])
            run.inputs.append((readers[-1:], mlp_in))
            mlp_out = block.mlp_out(mlp_in[..., 0, :])
            run.outputs.append(([first + H], mlp_out[..., None, :]))
            resid = resid + mlp_out
    run.resid.append(resid)
    x_final = reader_inputs([len(graph.readers) - 1])
    run.inputs.append(([len(graph.readers) - 1], x_final))
    final = x_final[..., 0, :]  # [c, b, p, d]
    if reads is None:
        run.logits = model.readout(final)
    else:
        run.logits = torch.full((*final.shape[:-1], cfg.d_vocab), float("nan"), dtype=final.dtype,
                                device=final.device)
        run.logits[..., list(reads), :] = model.readout(final[..., list(reads), :])
    return run

