"""Storage dtype apart from compute dtype: weights held in bfloat16 / float16, arithmetic in float32.

    storage, compute = resolve_dtypes("bfloat16", None, "cpu")   # (bfloat16, float32): fp32 arithmetic on CPU
    model.set_dtypes(storage, compute)                          # Transformer: parameters cast, compute recorded
    y = stored_linear(x, weight, bias)                          # x [..., in] @ weight [out, in]^T in x's dtype

One home for the dtype names, the device check and the one primitive every stored-weight product goes
through. A linear whose weight is already in the input's dtype is plain F.linear (float32 storage is
bit-identical to a model without this module). Otherwise the weight is upcast a block of output rows at a
time (at most _CHUNK_BYTES in the compute dtype), so no full-precision copy of a large matrix (a 256k-token
unembedding) is ever held, and under autograd the backward re-reads the stored weight instead of keeping
the upcast copy alive (a frozen-mode graph backward would otherwise hold the whole model in float32).
"""
from __future__ import annotations

from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import nn

from circuitlab.errors import InputError

# Floating dtypes by name (CLI choices, config JSON); storage may be any of them, compute too where the device can.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
HALF = (torch.bfloat16, torch.float16)
_CHUNK_BYTES = 64 * 2**20  # one upcast block of a stored weight, in the compute dtype
_TILE_BYTES = 2 * 2**20    # one upcast block when few rows multiply it: stays in the cache (measured best 1-4 MiB)
_FEW_ROWS = 256            # rows of x up to which the product is memory-bound (tiles); above, compute-bound


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(value: str | torch.dtype, what: str = "dtype") -> torch.dtype:
    """A dtype name ("bfloat16", "bf16", "fp32", ...) or torch dtype -> a floating torch.dtype, or one InputError."""
    if isinstance(value, torch.dtype):
        if value in DTYPES.values():
            return value
        raise InputError(f"{what} {dtype_name(value)} is not a floating dtype circuitlab computes in; use one of "
                         f"{', '.join(DTYPES)}")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
               "fp64": "float64", "double": "float64"}
    name = aliases.get(str(value).lower(), str(value).lower())
    if name not in DTYPES:
        raise InputError(f"unknown {what} {value!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def default_compute(storage: torch.dtype, device: str | torch.device) -> torch.dtype:
    """The compute dtype when none is asked for: the storage dtype on a GPU (half-precision tensor cores),
    float32 on a CPU for half storage (CPUs are slow or inexact at half-precision elementwise work)."""
    dev = torch.device(device)
    if storage in HALF and dev.type == "cpu":
        return torch.float32
    return storage


_CHECKED: dict[tuple[str, torch.dtype], str | None] = {}


def check_compute(dtype: torch.dtype, device: str | torch.device) -> None:
    """Raise one InputError when `device` cannot run a forward pass's kernels (matmul, softmax, norms, GELU)
    in `dtype`; probed once per (device type, dtype) on tiny tensors."""
    dev = torch.device(device)
    key = (str(dev), dtype)
    if key not in _CHECKED:
        try:
            x = torch.ones(2, 4, 8, dtype=dtype, device=dev)
            w = torch.ones(8, 8, dtype=dtype, device=dev)
            y = F.gelu(F.linear(x, w), approximate="tanh")
            F.scaled_dot_product_attention(y[None], y[None], y[None], is_causal=True)
            F.rms_norm(y.softmax(-1), (8,), torch.ones(8, dtype=dtype, device=dev))
            _CHECKED[key] = None
        except (RuntimeError, TypeError, NotImplementedError) as e:
            _CHECKED[key] = str(e).splitlines()[0] if str(e) else type(e).__name__
    if _CHECKED[key] is not None:
        raise InputError(f"this {dev.type} device cannot compute in {dtype_name(dtype)} ({_CHECKED[key]}); "
                         "use --compute-dtype float32")


def resolve_dtypes(storage: str | torch.dtype | None, compute: str | torch.dtype | None,
                   device: str | torch.device = "cpu") -> tuple[torch.dtype, torch.dtype]:
    """(storage, compute) from names or dtypes: storage defaults to float32, compute to default_compute; the
    compute dtype is checked on the device. One InputError for an unknown name or an impossible compute dtype."""
    s = torch.float32 if storage is None else parse_dtype(storage, "storage dtype")
    c = default_compute(s, device) if compute is None else parse_dtype(compute, "compute dtype")
    if c != s and s not in HALF:
        raise InputError(f"a model stored in {dtype_name(s)} computes in {dtype_name(s)} (asked: {dtype_name(c)}); "
                         f"store it in {dtype_name(c)} to compute in it")
    check_compute(c, device)
    return s, c


def compute_of(storage: torch.dtype, recorded: torch.dtype | None) -> torch.dtype:
    """The compute dtype of a module whose matrices are held in `storage` and that recorded `recorded` (None:
    none): a recorded dtype counts only while the storage is half precision, so module.double() / .float()
    compute in what they hold."""
    return recorded if recorded is not None and storage in HALF else storage


@overload
def upcast(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor: ...
@overload
def upcast(t: None, like: torch.Tensor) -> None: ...
@overload
def upcast(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None: ...
def upcast(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """t in like's dtype (t itself when it already is: no copy). For small stored tensors (norm gains, biases,
    one layer's per-head view); a large matrix goes through stored_linear instead."""
    return t if t is None or t.dtype == like.dtype else t.to(like.dtype)


def cast_parameters(module: nn.Module, storage: torch.dtype, compute: torch.dtype) -> None:
    """In place: matrices (dim >= 2) to the storage dtype, vectors (biases, norm gains, thresholds: a rounding
    error there shifts every activation or which features fire, for almost no memory) to the compute dtype."""
    with torch.no_grad():
        for p in module.parameters():
            want = storage if p.dim() >= 2 else compute
            if p.dtype != want:
                p.data = p.data.to(want)


def stored_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., a] @ w [a, b] in x's dtype: x @ w itself when w is stored in it; else w (a dictionary's W_enc /
    W_dec held in half precision) is upcast a block of its rows at a time (contiguous blocks: a transposed
    view's blocks would be strided gathers, ~30x slower), and under autograd the backward re-reads it."""
    if w.dtype == x.dtype:
        return x @ w
    if not w.is_contiguous():
        return stored_linear(x, w.T)  # w^T is the contiguous one: its rows are w's columns
    if torch.is_grad_enabled() and x.requires_grad:
        return _UpcastMatmul.apply(x, w.detach())
    return _row_blocks_matmul(x, w.detach())


def stored_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T + bias [out] computed in x's dtype, whatever the weight's storage dtype.

    Same dtype: F.linear itself. Otherwise blocks of at most _CHUNK_BYTES of output rows are upcast one at a
    time; under autograd the stored weight (not an upcast copy) is what the backward keeps."""
    if weight.dtype == x.dtype:
        return F.linear(x, weight, bias)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        # Gradients flow to the activations only: half-precision weights are for analysis, not training.
        out = _UpcastLinear.apply(x, weight.detach())
        return out if bias is None else out + bias
    return _chunked_linear(x, weight.detach(), bias)


def _rows_per_chunk(weight: torch.Tensor, dtype: torch.dtype, budget: int = _CHUNK_BYTES) -> int:
    return max(1, budget // max(1, weight.shape[-1] * dtype.itemsize))


def _chunked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T (+ bias) in x's dtype, the weight upcast a block of rows at a time.

    Few rows of x (a forward pass of one prompt: the product is memory-bound): each block is upcast into one
    reused buffer the size of a core's cache (_TILE_BYTES) and multiplied from there, so the weight is read
    once, in its half-size storage, and the upcast copy never reaches main memory (as fast as a float32
    weight, measured in docs/pretrained.md). Many rows (compute-bound): blocks of up to _CHUNK_BYTES."""
    lead, n_out = x.shape[:-1], weight.shape[0]
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] <= _FEW_ROWS:
        rows = _rows_per_chunk(weight, x.dtype, _TILE_BYTES)
        buffer = torch.empty(min(rows, n_out), weight.shape[1], dtype=x.dtype, device=x.device)
        out_t = torch.empty(n_out, flat.shape[0], dtype=x.dtype, device=x.device)  # [out, rows]: blocks contiguous
        for start in range(0, n_out, rows):
            stop = min(start + rows, n_out)
            block = buffer[:stop - start]
            block.copy_(weight[start:stop])
            torch.mm(block, flat.T, out=out_t[start:stop])
        out = out_t.T.reshape(*lead, n_out)
        return out + bias if bias is not None else out.contiguous()
    rows = _rows_per_chunk(weight, x.dtype)
    if n_out <= rows:
        return F.linear(x, weight.to(x.dtype), bias)
    out = torch.empty(*lead, n_out, dtype=x.dtype, device=x.device)
    for start in range(0, n_out, rows):
        stop = min(start + rows, n_out)
        out[..., start:stop] = F.linear(x, weight[start:stop].to(x.dtype), None if bias is None else bias[start:stop])
    return out


def _chunked_grad_input(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """grad [..., out] @ weight [out, in] in grad's dtype, the weight upcast a block of rows at a time."""
    n = _rows_per_chunk(weight, grad.dtype)
    if weight.shape[0] <= n:  # one block (no full-range slice: vmap has no rule for the alias it makes)
        return grad @ weight.to(grad.dtype)
    out: torch.Tensor | None = None
    for start in range(0, weight.shape[0], n):
        stop = min(start + n, weight.shape[0])
        part = grad[..., start:stop] @ weight[start:stop].to(grad.dtype)
        out = part if out is None else out + part
    assert out is not None  # more than n rows: the loop ran
    return out


def _row_blocks_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., a] @ w [a, b] in x's dtype, summed over blocks of w's rows, each upcast into one reused buffer
    (cache-sized for few rows of x, else up to _CHUNK_BYTES)."""
    lead, (n_in, n_out) = x.shape[:-1], w.shape
    flat = x.reshape(-1, n_in)
    budget = _TILE_BYTES if flat.shape[0] <= _FEW_ROWS else _CHUNK_BYTES
    rows = max(1, budget // max(1, n_out * x.dtype.itemsize))
    if rows >= n_in:
        return (flat @ w.to(x.dtype)).reshape(*lead, n_out)
    buffer = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    out = torch.zeros(flat.shape[0], n_out, dtype=x.dtype, device=x.device)
    for start in range(0, n_in, rows):
        stop = min(start + rows, n_in)
        block = buffer[:stop - start]
        block.copy_(w[start:stop])
        out.addmm_(flat[:, start:stop], block)
    return out.reshape(*lead, n_out)


class _UpcastMatmul(torch.autograd.Function):
    """x @ w with w [a, b] stored in another dtype (no gradient to it); the backward re-reads the stored w."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _row_blocks_matmul(x, w)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (w,) = ctx.saved_tensors  # grad [..., b] @ w^T [b, a]: w's row blocks give the input's column blocks
        rows = _rows_per_chunk(w, grad.dtype)
        if rows >= w.shape[0]:  # one block (no full-range slice: vmap has no rule for the alias it makes)
            return grad @ w.to(grad.dtype).T, None
        parts = [grad @ w[start:start + rows].to(grad.dtype).T for start in range(0, w.shape[0], rows)]
        return torch.cat(parts, dim=-1), None


class _UpcastLinear(torch.autograd.Function):
    """x @ weight^T with a weight stored in another dtype (no gradient to it); saves the stored weight and
    recomputes the upcast in the backward."""

    generate_vmap_rule = True  # batched gradients (autograd.grad(is_grads_batched=True)) go through it

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _chunked_linear(x, weight, None)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weight,) = ctx.saved_tensors
        return _chunked_grad_input(grad, weight), None


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict names) whose product runs in the input's dtype: a weight
    stored in half precision is upcast per use (stored_linear); in the input's own dtype it is F.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stored_linear(x, self.weight, self.bias)
