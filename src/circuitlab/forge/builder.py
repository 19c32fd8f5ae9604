"""Set a transformer's weights by hand, on named subspaces of the residual stream.

    layout = ResidualLayout({"acc": 1, "digit": 1, "sign": 1})
    f = Forge(layout, n_layers=2, n_heads=1, d_head=3, use_attn_out=False, d_vocab=11, n_ctx=5,
              positional="learned")
    f.embed(7, digit=7)                  # W_E[7] = 7 on "digit", 0 elsewhere
    f.pos(1, sign=-1)                    # W_pos[1] = -1 on "sign"
    h = f.head(0, 0)
    h.q("sign", 10.0)                    # q[0] = 10 · sign
    h.k("sign", -10.0)                   # k[0] = -10 · sign    -> score = -100 · sign_q · sign_k
    h.v("digit", 2.0, into="acc")        # V-only head: z = 2 · digit, written into "acc"
    model = f.model

Every matrix is given in the framework paper's orientation (x @ W): a block of W_Q, W_K or
W_V is [size of the residual subspace, number of head dims]; a block of W_O is
[number of head dims, size of the residual subspace]. The builder writes these blocks into the
model's fused parameters (attn.qkv.weight, attn.out.weight, mlp.fc_in/fc_out, embed, pos_embed,
unembed), so the result is an ordinary Transformer: hooks, caches and every analysis work on it.
All weights start at zero; a hand-built model has no norm, no biases and unscaled scores
unless asked for.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch

from circuitlab.config import ModelConfig
from circuitlab.errors import CircuitlabError, did_you_mean
from circuitlab.model.transformer import Transformer

Weight = Union[float, int, Sequence[Any], torch.Tensor]
HeadDims = Union[int, Sequence[int], range, str]

# Hand-built models: no normalisation, no biases (a constant residual dimension does their job),
# scores not divided by sqrt(d_head) (so the numbers written are the numbers that reach softmax).
HAND_DEFAULTS: dict[str, Any] = dict(norm="none", bias=False, scale_scores=False, attn_only=True,
                                     positional="none", mlp="relu", tied_embeddings=False)


class ResidualLayout:
    """Named, consecutive subspaces of the residual stream.

    ResidualLayout({"one": 1, "tok": 20, "pos": 32}) puts "one" at coordinate 0, "tok" at
    1..20 and "pos" at 21..52; d_model is the total size (53).
    """

    def __init__(self, sizes: Mapping[str, int]) -> None:
        if not sizes:
            raise CircuitlabError("a ResidualLayout needs at least one named subspace")
        self._slices: dict[str, slice] = {}
        start = 0
        for name, size in sizes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise CircuitlabError(f"subspace names must be Python identifiers, got {name!r}")
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise CircuitlabError(f"subspace {name!r} needs a positive integer size, got {size!r}")
            self._slices[name] = slice(start, start + size)
            start += size
        self.d_model = start

    @property
    def names(self) -> list[str]:
        return list(self._slices)

    def __contains__(self, name: object) -> bool:
        return name in self._slices

    def __getitem__(self, name: str) -> slice:
        """The coordinates of a subspace, as a slice of the residual vector."""
        if name not in self._slices:
            hint = did_you_mean(name, self._slices)
            raise CircuitlabError(f"no residual subspace named {name!r}{hint}; "
                                  f"the layout has {', '.join(self._slices)}")
        return self._slices[name]

    def size(self, name: str) -> int:
        s = self[name]
        return s.stop - s.start

    def coords(self, name: str) -> list[int]:
        return list(range(self[name].start, self[name].stop))

    def vector(self, **values: Weight) -> torch.Tensor:
        """[d_model] with the given values on the named subspaces and 0 elsewhere."""
        out = torch.zeros(self.d_model)
        for name, value in values.items():
            out[self[name]] = _as_vector(value, self.size(name), name)
        return out

    def read(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x [..., d_model] -> the subspace's coordinates [..., size]."""
        return x[..., self[name]]

    def describe(self, x: torch.Tensor, names: Sequence[str] | None = None) -> dict[str, float | list[float]]:
        """x [d_model] -> {name: value} (a float for size-1 subspaces, else a list)."""
        out: dict[str, float | list[float]] = {}
        for name in names or self.names:
            part = x[self[name]].tolist()
            out[name] = part[0] if len(part) == 1 else part
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{n!r}: {self.size(n)}" for n in self._slices)
        return f"ResidualLayout({{{inner}}})"


class Forge:
    """Builds a Transformer whose weights are all zero, then lets you set them block by block.

    config: ModelConfig fields (d_vocab, n_ctx, n_layers, n_heads, d_head, use_attn_out, d_mlp,
    positional, ...). d_model comes from the layout. Defaults are HAND_DEFAULTS; giving d_mlp
    turns the MLPs on (attn_only=False) unless attn_only is given.
    """

    def __init__(self, layout: ResidualLayout, **config: Any) -> None:
        if "d_model" in config and config["d_model"] != layout.d_model:
            raise CircuitlabError(f"d_model {config['d_model']} differs from the layout's size {layout.d_model}")
        fields = {**HAND_DEFAULTS, **config, "d_model": layout.d_model}
        if "d_mlp" in config and "attn_only" not in config:
            fields["attn_only"] = False
        if fields.get("tied_embeddings"):
            raise CircuitlabError("hand-built models set W_E and W_U separately; tied_embeddings must be False")
        self.layout = layout
        self.cfg = ModelConfig(**fields)
        self.model = Transformer(self.cfg)
        with torch.no_grad():
            for p in self.model.parameters():
                p.zero_()
        self.model.eval()

    # ------------------------------------------------------------------ embeddings
    def embed(self, token: int, **values: Weight) -> None:
        """W_E[token] = the given values on the named subspaces (others left as they are)."""
        self._check_index("token", token, self.cfg.d_vocab)
        with torch.no_grad():
            for name, value in values.items():
                self.model.embed.weight[token, self.layout[name]] = _as_vector(value, self.layout.size(name), name)

    def pos(self, position: int, **values: Weight) -> None:
        """W_pos[position] = the given values on the named subspaces (needs positional="learned")."""
        if self.cfg.positional != "learned":
            raise CircuitlabError("Forge.pos needs positional='learned' in the config")
        self._check_index("position", position, self.cfg.n_ctx)
        with torch.no_grad():
            for name, value in values.items():
                self.model.pos_embed.weight[position, self.layout[name]] = _as_vector(
                    value, self.layout.size(name), name)

    def unembed(self, token: int, **weights: Weight) -> None:
        """logit[token] = Σ weights · residual[subspace]: sets W_U[subspace, token] (that column's block)."""
        self._check_index("token", token, self.cfg.d_vocab)
        with torch.no_grad():
            for name, value in weights.items():
                self.model.unembed.weight[token, self.layout[name]] = _as_vector(value, self.layout.size(name), name)

    # ------------------------------------------------------------------ blocks
    def head(self, layer: int, head: int = 0) -> "HeadForge":
        self._check_index("layer", layer, self.cfg.n_layers)
        self._check_index("head", head, self.cfg.n_heads)
        return HeadForge(self, layer, head)

    def mlp(self, layer: int) -> "MLPForge":
        self._check_index("layer", layer, self.cfg.n_layers)
        if not self.cfg.has_mlp:
            raise CircuitlabError("this model has no MLPs; give Forge a d_mlp to build one")
        if self.cfg.mlp == "swiglu":
            raise CircuitlabError("Forge.mlp writes ReLU/GELU MLPs; SwiGLU is not supported")
        return MLPForge(self, layer)

    @staticmethod
    def _check_index(what: str, i: int, n: int) -> None:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise CircuitlabError(f"{what} must be an integer in 0..{n - 1}, got {i!r}")


class HeadForge:
    """One attention head's W_Q, W_K, W_V, W_O, written into the fused qkv / out weights.

    Fused layout: qkv.weight [(H + 2K)·D, d_model], rows = q heads, then k heads, then v heads
    (K = n_kv_heads; with grouped-query attention head h shares k/v head h // (H // K)).
    """

    def __init__(self, forge: Forge, layer: int, head: int) -> None:
        self.forge, self.layer, self.head = forge, layer, head
        cfg = forge.cfg
        self.attn = forge.model.blocks[layer].attn
        H, K, D = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        kv = head // (H // K)
        self._row0 = {"q": head * D, "k": (H + kv) * D, "v": (H + K + kv) * D}

    def q(self, src: str, weight: Weight, into: HeadDims = 0) -> "HeadForge":
        """W_Q[src, into] = weight: the query's head dims `into` read the residual subspace `src`."""
        return self._in("q", src, weight, into)

    def k(self, src: str, weight: Weight, into: HeadDims = 0) -> "HeadForge":
        """W_K[src, into] = weight."""
        return self._in("k", src, weight, into)

    def v(self, src: str, weight: Weight, into: HeadDims = 0) -> "HeadForge":
        """W_V[src, into] = weight. For V-only heads (use_attn_out=False) `into` may name a residual
        subspace: the head's z is written straight into the residual, so its dims are residual dims."""
        return self._in("v", src, weight, into)

    def o(self, dst: str, weight: Weight, from_: HeadDims = 0) -> "HeadForge":
        """W_O[from_, dst] = weight: head dims `from_` of z are written into the residual subspace `dst`."""
        if self.attn.out is None:
            raise CircuitlabError("this head is V-only (use_attn_out=False): it has no W_O; "
                                  "write W_V straight into a residual subspace with v(..., into=name)")
        layout = self.forge.layout
        cols = layout.coords(dst)
        block = _as_block(weight, None, len(cols), f"W_O → {dst}", from_)
        rows = self._head_dims(from_, block.shape[0])
        D = self.forge.cfg.head_dim
        with torch.no_grad():
            # out.weight is [d_model, H·D]; W_O[head] is its transpose restricted to this head's columns.
            w = self.attn.out.weight
            for i, r in enumerate(rows):
                w[cols, self.head * D + r] = block[i]
        return self

    def _in(self, part: str, src: str, weight: Weight, into: HeadDims) -> "HeadForge":
        layout = self.forge.layout
        src_coords = layout.coords(src)
        block = _as_block(weight, len(src_coords), None, f"W_{part.upper()} ← {src}", into, layout)
        dims = self._head_dims(into, block.shape[1])
        row0 = self._row0[part]
        with torch.no_grad():
            # qkv.weight rows are head dims, columns residual coordinates: row (row0 + d) holds W[:, d]ᵀ.
            w = self.attn.qkv.weight
            for j, d in enumerate(dims):
                w[row0 + d, src_coords] = block[:, j]
        return self

    def _head_dims(self, dims: HeadDims, width: int) -> list[int]:
        D = self.forge.cfg.head_dim
        if isinstance(dims, str):
            if self.forge.cfg.use_attn_out:
                raise CircuitlabError(f"head dims given as a residual subspace ({dims!r}) only make sense for "
                                      "V-only heads; give head dim indices")
            out = self.forge.layout.coords(dims)
        elif isinstance(dims, int):
            out = list(range(dims, dims + width))
        else:
            out = list(dims)
        if len(out) != width:
            raise CircuitlabError(f"the weight block has {width} head dims but {len(out)} were named")
        if any(not 0 <= d < D for d in out):
            raise CircuitlabError(f"head dims {out} out of range: d_head is {D}")
        return out


class MLPForge:
    """One MLP layer, written neuron by neuron: neuron i computes act(Σ read · residual) and adds
    act · write into the residual."""

    def __init__(self, forge: Forge, layer: int) -> None:
        self.forge = forge
        self.mlp = forge.model.blocks[layer].mlp

    def neuron(self, i: int, read: Mapping[str, Weight], write: Mapping[str, Weight]) -> "MLPForge":
        """fc_in.weight[i, read subspaces] = read values; fc_out.weight[write subspaces, i] = write values."""
        Forge._check_index("neuron", i, self.mlp.d_mlp)
        layout = self.forge.layout
        with torch.no_grad():
            for name, value in read.items():
                self.mlp.fc_in.weight[i, layout[name]] = _as_vector(value, layout.size(name), name)
            for name, value in write.items():
                self.mlp.fc_out.weight[layout[name], i] = _as_vector(value, layout.size(name), name)
        return self


# ---------------------------------------------------------------------- helpers
def _as_vector(value: Weight, size: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32)
    if t.dim() == 0:
        if size != 1:
            raise CircuitlabError(f"subspace {name!r} has size {size}: give a list of {size} values, not one number")
        return t.reshape(1)
    if t.shape != (size,):
        raise CircuitlabError(f"subspace {name!r} has size {size}, got a value of shape {tuple(t.shape)}")
    return t


def _as_block(weight: Weight, rows: int | None, cols: int | None, what: str, dims: HeadDims,
              layout: ResidualLayout | None = None) -> torch.Tensor:
    """A [rows, cols] block from a number (× identity), a vector (one row or column) or a matrix.

    One of rows/cols is the residual side (known); the other is the head side, taken from the
    weight, from an explicit list of head dims, or from a residual subspace name (V-only heads).
    """
    t = torch.as_tensor(weight, dtype=torch.float32)
    known = rows if rows is not None else cols
    assert known is not None  # one side is the residual stream's
    head_width = None
    if isinstance(dims, str) and layout is not None:
        head_width = layout.size(dims)
    elif not isinstance(dims, (int, str)):
        head_width = len(list(dims))
    if t.dim() == 0:
        width = head_width if head_width is not None else known
        if width != known:
            raise CircuitlabError(f"{what}: a single number means number × identity, but the residual side has "
                                  f"{known} dims and the head side {width}; give a [{known}, {width}] matrix")
        t = t * torch.eye(known)
    elif t.dim() == 1:
        # A vector is the block's only residual coordinate when that side has size 1, else its only head dim.
        if rows is not None:
            t = t[None, :] if known == 1 else t[:, None]
        else:
            t = t[:, None] if known == 1 else t[None, :]
    if t.dim() != 2:
        raise CircuitlabError(f"{what}: expected a number, a vector or a matrix, got shape {tuple(t.shape)}")
    side = t.shape[0] if rows is not None else t.shape[1]
    if side != known:
        raise CircuitlabError(f"{what}: the residual side of the block has {known} dims, got shape {tuple(t.shape)}")
    return t
