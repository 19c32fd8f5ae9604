"""The computational graph of a Transformer: nodes that write to the residual stream, reader inputs, edges.

    graph = EdgeGraph.of(model)
    graph.summary()            # "attn-only 2 layers: 10 nodes (input, 8 heads, logits), 25 reader inputs, 81 edges"
    graph.edges[0]             # ("input", "L0H0.q")
    graph.edge_index("L0H0", "L1H2.k")

Writers (sources), in forward order: "input" (token + position embeddings), every head "L{l}H{h}"
(its z @ W_O, without the shared output bias b_O), every MLP "MLP{l}" (its output, b_out included).
Readers: each head's query, key and value inputs ("L{l}H{h}.q", ".k", ".v"; under grouped-query
attention keys and values are read once per kv head: "L{l}KV{g}.k", ".v"), each MLP's input
"MLP{l}.in", and "logits". An edge joins every writer to every reader that comes after it (a head
of layer l feeds layer l's MLP unless attention and MLP run in parallel). The attention output
biases b_O belong to no node: they are the same in every run, so they are never patched.

A reader's input is the sum of the outputs of the writers upstream of it (plus the b_O constants);
the reader applies its own norm (ln1 for heads, ln2 for MLPs, ln_final for the logits) to that sum,
so patching an edge changes the reader's input before its norm, as in ACDC and auto-circuit.

Architecture: every block layout. Readers normalise their own input (ln1 for heads, ln2 for MLPs; a
post-norm-only block has none). A writer's output is what it adds to the residual stream: under a
post-norm (block_norms "sandwich" / "post") a head's output is its share of the normalised attention
output at that run's scale (Block.attn_out_shares), the MLP's is hook_mlp_out, so the graph's forward is
the model's exactly (forward.py). Any positions (learned: part of "input"; rotary) and any read-out (the
logits reader runs model.readout, soft-cap included) are fine.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from circuitlab.errors import CircuitlabError
from circuitlab.names import head_name


@dataclass(frozen=True)
class EdgeGraph:
    """Writers, readers and edges of one model architecture.

    sources: writer names in forward order; source_layer[i]: the layer of writer i (-1 for input);
    readers: reader-input names in forward order; reader_layer[j] (n_layers for logits);
    reader_node[j]: the writer (or "logits") that reader input j feeds; edges: (source, reader) name
    pairs, in reader order then source order — the order of every edge-score vector [n_edges].
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    has_mlp: bool
    parallel: bool
    sources: tuple[str, ...]
    source_layer: tuple[int, ...]
    readers: tuple[str, ...]
    reader_layer: tuple[int, ...]
    reader_node: tuple[str, ...]

    @classmethod
    def of(cls, model_or_cfg) -> "EdgeGraph":
        cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
        H, K = cfg.n_heads, cfg.kv_heads
        sources, source_layer, readers, reader_layer, reader_node = ["input"], [-1], [], [], []
        for l in range(cfg.n_layers):
            for h in range(H):
                sources.append(head_name(l, h))
                source_layer.append(l)
            if cfg.has_mlp:
                sources.append(f"MLP{l}")
                source_layer.append(l)
            heads = [head_name(l, h) for h in range(H)]
            kv = heads if K == H else [f"L{l}KV{g}" for g in range(K)]
            for kind, names in (("q", heads), ("k", kv), ("v", kv)):
                for i, name in enumerate(names):
                    readers.append(f"{name}.{kind}")
                    reader_layer.append(l)
                    # a kv reader feeds every head of its group; its node is the group's first head
                    reader_node.append(name if K == H or kind == "q" else head_name(l, i * (H // K)))
            if cfg.has_mlp:
                readers.append(f"MLP{l}.in")
                reader_layer.append(l)
                reader_node.append(f"MLP{l}")
        readers.append("logits")
        reader_layer.append(cfg.n_layers)
        reader_node.append("logits")
        return cls(cfg.n_layers, H, K, cfg.has_mlp, bool(cfg.parallel_attn_mlp), tuple(sources),
                   tuple(source_layer), tuple(readers), tuple(reader_layer), tuple(reader_node))

    # ------------------------------------------------------------------ structure
    def upstream(self, source: int, reader: int) -> bool:
        """Whether writer `source` comes before reader input `reader` (so an edge joins them)."""
        ls, lr = self.source_layer[source], self.reader_layer[reader]
        if ls < lr:
            return True
        if ls == lr and self.readers[reader].endswith(".in") and not self.parallel:
            return self.sources[source].startswith("L")  # a head of the same layer feeds its MLP
        return False

    @cached_property
    def allowed(self) -> torch.Tensor:
        """[n_sources, n_readers] bool: True where an edge exists."""
        return torch.tensor([[self.upstream(s, r) for r in range(len(self.readers))]
                             for s in range(len(self.sources))], dtype=torch.bool)

    @cached_property
    def feeds(self) -> torch.Tensor:
        """[n_readers, n_sources + 1] bool: the nodes each reader input feeds (last column: the logits).
        A query or MLP input feeds its own node; a key or value input every head of its kv group."""
        out = torch.zeros(len(self.readers), len(self.sources) + 1, dtype=torch.bool)
        index = {name: i for i, name in enumerate(self.sources)}
        group = self.n_heads // self.n_kv_heads
        for j, name in enumerate(self.readers):
            node = self.reader_node[j]
            if node == "logits":
                out[j, -1] = True
            elif self.n_kv_heads != self.n_heads and self.reader_kind(j) in ("k", "v"):
                first = index[node]
                out[j, first:first + group] = True
            else:
                out[j, index[node]] = True
        return out

    @cached_property
    def edge_pairs(self) -> torch.Tensor:
        """[n_edges, 2] (source index, reader index), in reader order then source order."""
        r, s = self.allowed.T.nonzero(as_tuple=True)
        return torch.stack([s, r], dim=1)

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(self.sources[s], self.readers[r]) for s, r in self.edge_pairs.tolist()]

    @property
    def n_edges(self) -> int:
        return int(self.edge_pairs.shape[0])

    @property
    def nodes(self) -> list[str]:
        """Every node: the writers, then "logits"."""
        return [*self.sources, "logits"]

    def edge_index(self, source: str, reader: str) -> int:
        """Position of edge (source, reader) in edge-score vectors."""
        lookup = self._edge_lookup
        if (source, reader) not in lookup:
            known = source in self.sources and reader in self.readers
            why = "it does not feed that reader (it comes later)" if known else "no such node or reader input"
            raise CircuitlabError(f"no edge {source} -> {reader}: {why}; graph.edges lists all {self.n_edges}")
        return lookup[(source, reader)]

    @cached_property
    def _edge_lookup(self) -> dict[tuple[str, str], int]:
        return {e: i for i, e in enumerate(self.edges)}

    def reader_kind(self, reader: int) -> str:
        """"q", "k", "v", "mlp" or "logits"."""
        name = self.readers[reader]
        return "logits" if name == "logits" else "mlp" if name.endswith(".in") else name.rsplit(".", 1)[1]

    def layer_readers(self, layer: int) -> list[int]:
        return [j for j, l in enumerate(self.reader_layer) if l == layer]

    def dense(self, scores: torch.Tensor) -> torch.Tensor:
        """Edge scores [n_edges] -> [n_sources, n_readers] (0 where no edge)."""
        out = torch.zeros(len(self.sources), len(self.readers), dtype=scores.dtype, device=scores.device)
        s, r = self.edge_pairs.to(scores.device).T
        out[s, r] = scores
        return out

    def flat(self, dense: torch.Tensor) -> torch.Tensor:
        """[..., n_sources, n_readers] -> [..., n_edges]."""
        s, r = self.edge_pairs.to(dense.device).T
        return dense[..., s, r]

    def summary(self) -> str:
        heads = self.n_layers * self.n_heads
        mlps = self.n_layers if self.has_mlp else 0
        parts = [f"{heads} heads"] + ([f"{mlps} MLPs"] if mlps else [])
        return (f"{self.n_layers} layers: {len(self.nodes)} nodes (input, {', '.join(parts)}, logits), "
                f"{len(self.readers)} reader inputs, {self.n_edges} edges")

    def to_dict(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "has_mlp": self.has_mlp, "parallel_attn_mlp": self.parallel, "n_nodes": len(self.nodes),
                "n_readers": len(self.readers), "n_edges": self.n_edges, "nodes": self.nodes,
                "readers": list(self.readers)}
