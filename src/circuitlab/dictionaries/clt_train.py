"""Training a cross-layer transcoder: its loss, its sparse step, and the pieces DictionaryTrainer calls for it.

    loss = Σ_layers ‖ŷ_l − y_l‖² (mean over rows)
         + λ Σ_l Σ_i tanh(c · a_i^l ‖W_dec,i^l‖)          jumprelu (Anthropic's CLT penalty)
         + λ Σ_l Σ_i a_i^l ‖W_dec,i^l‖                    relu (L1, as a ReLU SAE's)
         + λ_p Σ_l Σ_i ReLU(θ_i^l − pre_i^l) ‖W_dec,i^l‖   jumprelu, relu with θ = 0 (pre-activation penalty:
                                                           no latent stays dead; θ gets no gradient from it)
         + AuxK per layer                                  topk / batchtopk (dead latents fit the residual)

(each architecture's terms are its Architecture.clt_penalty, in dictionaries/arch/; resampling is resample.py's).

‖W_dec,i^l‖ is feature i's whole decoder, every layer it writes to together. A ReLU CLT takes L1, not the
tanh: the tanh saturates once c · a · ‖W_dec‖ passes ~1, so it pushes only the smallest activations
down, and a ReLU (no threshold to move) then held a target L0 only with a coefficient large enough to
kill latents (planted, target 2 per layer: layer 0's λ climbed to 6–67 and it ended 17% over, latents
dead; with L1 and the pre-activation penalty at θ = 0: 2.03 / 1.99 / 2.06, none dead; docs/dictionaries.md).
The pre-activation penalty moves the pre-activations of silent latents up and leaves θ alone: pushed
down on every row below it, θ fell to its floor at layers 0 and 1 (the sparsity term's straight-through
gradient reaches θ only from rows within the bandwidth) and the coefficient climbed to ~40 to hold the
L0 by other means. TopK keeps k latents per layer and row, BatchTopK k·rows per layer and batch. The
decoder is the CLT's cost (layer l writes into L − l layers), so the sparse step (sparse_ops, kept pairs
per layer) pays more than for an SAE: after the one dense product per layer (x_l @ W_enc^l), decoding
and its gradients touch only kept pairs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import torch
import torch.nn.functional as F

from circuitlab.dictionaries.clt import CLTConfig, CrossLayerTranscoder
from circuitlab.dictionaries.objectives import Coefficients, StepOutput
from circuitlab.dictionaries.sparse_ops import SPARSE_BELOW, SPARSE_DTYPES, SPARSE_MIN_WORK, DecodeKept, Kept, KeptPreActs
from circuitlab.errors import CircuitlabError


@dataclass
class CLTCoefficients(Coefficients):
    tanh_scale: float = 4.0   # c in tanh(c · a · ‖W_dec‖) (JumpReLU)
    preact: float = 0.0       # λ_p, the pre-activation penalty (JumpReLU, ReLU)
    layers: tuple[float, ...] | None = None  # one sparsity coefficient per layer (target-L0 mode); None: `sparsity`

    def layer(self, l: int) -> float:
        return self.sparsity if self.layers is None else self.layers[l]


def clt_training_step(clt: CrossLayerTranscoder, xs: torch.Tensor, ys: torch.Tensor, coef: CLTCoefficients,
                      dead: torch.Tensor | None, sparse: bool | None = None, replicas: Any = None) -> StepOutput:
    """xs, ys [rows, L, d_model] (normalised MLP inputs and outputs); dead [L · d_sae] bool or None;
    replicas: data-parallel ranks whose rows together are the batch (as objectives.training_step).

    `sparse` (default: on the CPU, below SPARSE_BELOW of the pairs kept, not tiny) decodes from the kept
    (row, latent) pairs of each layer only; otherwise dense products. Same numbers.
    """
    cfg = clt.cfg
    arch, L, n, d = cfg.arch, cfg.n_layers, cfg.d_sae, cfg.d_model
    clt._check_stack(xs)
    rows = len(xs)
    xs, ys = xs.to(clt.dtype), ys.to(clt.dtype)
    pres = [xs[:, l] @ clt.W_enc[l] + clt.b_enc[l] for l in range(L)]   # [rows, d_sae] each, with their graph
    kept_masks = [arch.keep(pre.detach(), cfg.k, clt.latent_threshold(l), coef, replicas) for l, pre in enumerate(pres)]
    n_kept = sum(len(k) if k is not None else int(torch.count_nonzero(m)) for k, m in kept_masks)
    if sparse is None:
        sparse = (xs.device.type == "cpu" and xs.dtype in SPARSE_DTYPES and n_kept < SPARSE_BELOW * rows * L * n
                  and rows * n * d * L >= SPARSE_MIN_WORK)
    elif sparse and xs.dtype not in SPARSE_DTYPES:
        raise CircuitlabError(f"the sparse training step needs a float32 or float64 CLT, not {xs.dtype}")
    norms = clt.decoder_norms()                                           # [L, d_sae]
    y_flat = torch.cat(list(clt.b_dec)).expand(rows, L * d)               # [rows, L·d]: the biases
    sparsity = xs.new_zeros(())
    fires, layer_acts, layer_kept = [], [], []
    for l, (pre, (kept, mask)) in enumerate(zip(pres, kept_masks)):
        threshold = clt.threshold[l] if arch.learns_threshold else None
        norm = norms[l]
        W = clt.W_dec[l].flatten(1)                                       # [d_sae, T·d]
        if sparse:
            kept = kept if kept is not None else Kept.from_mask(mask)
            pre_kept = KeptPreActs.apply(pre.detach(), xs[:, l], clt.W_enc[l], clt.b_enc[l], kept)   # [nnz]
            threshold = threshold[kept.latents] if threshold is not None else None
            norm = norm[kept.latents]
        else:
            pre_kept = pre if kept is None else pre * kept.dense_mask()
        acts = arch.train_activate(pre_kept, threshold, coef)
        out = DecodeKept.apply(acts, W, kept) if sparse else acts @ W     # [rows, T·d]
        if cfg.tied:
            out = out.repeat(1, L - l)
        y_flat = y_flat + F.pad(out, (l * d, 0))
        fires.append(torch.bincount(kept.latents[acts > 0], minlength=n) if sparse else torch.count_nonzero(acts, dim=0))
        for term in arch.clt_penalty(acts, pre, clt.latent_threshold(l), norm, norms[l], coef.layer(l), coef, rows):
            sparsity = sparsity + term
        layer_acts.append(acts)
        layer_kept.append(kept)
    y_hat = y_flat.view(rows, L, d)
    if cfg.skip:
        y_hat = y_hat + torch.stack([xs[:, l] @ clt.W_skip[l] for l in range(L)], dim=1)
    mse = (y_hat - ys).pow(2).sum((-1, -2)).mean()
    fired = torch.cat(fires)                                              # [L · d_sae]
    aux = xs.new_zeros(())
    if arch.unit_decoder(clt=True) and dead is not None and bool(dead.any()):
        residual = (ys - y_hat).detach()
        for l in range(L):
            dead_l = dead[l * n:(l + 1) * n]
            if bool(dead_l.any()):
                # sparse: only the dead columns' product, not a dense [rows, d_sae] gradient through pres[l]
                dead_pre = (xs[:, l] @ clt.W_enc[l][:, dead_l] + clt.b_enc[l][dead_l]) if sparse else pres[l][:, dead_l]
                aux = aux + _auxk(clt, l, dead_pre, dead_l.nonzero().squeeze(1), residual[:, l:].flatten(1), sparse)
        aux = coef.aux * aux
    return StepOutput(mse + sparsity + aux, mse.detach(), sparsity.detach(), aux.detach(), fired,
                      float(fired.sum()) / rows / L)


def _auxk(clt: CrossLayerTranscoder, layer: int, dead_pre: torch.Tensor, dead_ids: torch.Tensor,
          residual: torch.Tensor, sparse: bool) -> torch.Tensor:
    """Layer `layer`'s dead latents' top pre-activations (dead_pre [rows, n_dead]) decode, through their whole
    decoders, what the CLT missed in layers layer..L-1 (residual [rows, (L - layer)·d]): their squared error."""
    cfg = clt.cfg
    rows, n_dead = dead_pre.shape
    k_aux = min(max(cfg.d_model // 2, 1), n_dead)
    values, which = dead_pre.topk(k_aux, dim=-1, sorted=False)
    values = values.relu()
    W = clt.W_dec[layer].flatten(1)
    if sparse:
        which, order = which.sort(dim=-1)
        recon = DecodeKept.apply(values.gather(-1, order).flatten(), W, Kept.per_row(dead_ids[which], cfg.d_sae))
    else:
        recon = values.new_zeros(rows, cfg.d_sae).scatter(-1, dead_ids[which], values) @ W
    if cfg.tied:
        recon = recon.repeat(1, cfg.n_layers - layer)
    return (recon - residual).pow(2).sum(-1).mean()


# ---------------------------------------------------------------------------- what DictionaryTrainer calls

@torch.no_grad()
def init_from_data(clt: CrossLayerTranscoder, sample: dict[str, torch.Tensor], normalise: bool,
                   init_threshold: float) -> tuple[list[float], list[float]]:
    """Per-layer input and output scales (E‖x_l‖ = √d_model; a tied CLT shares one output scale) and b_dec
    (each layer's mean output) from a chunk of raw activations. Returns (in_scales, out_scales)."""
    cfg = clt.cfg
    xs, ys = stack_layers(cfg, sample, clt.device)
    root = math.sqrt(cfg.d_model)
    s_in = [root / float(xs[:, l].norm(dim=-1).mean()) if normalise else 1.0 for l in range(cfg.n_layers)]
    s_out = [root / float(ys[:, l].norm(dim=-1).mean()) if normalise else 1.0 for l in range(cfg.n_layers)]
    if cfg.tied:
        s_out = [root / float(ys.norm(dim=-1).mean()) if normalise else 1.0] * cfg.n_layers
    for l in range(cfg.n_layers):
        clt.b_dec[l].copy_((ys[:, l] * s_out[l]).mean(0))
        if cfg.arch.learns_threshold:
            clt.threshold[l].fill_(init_threshold)
    return s_in, s_out


@torch.no_grad()
def start_at_l0(clt: CrossLayerTranscoder, sample: dict[str, torch.Tensor], in_scales: list[float], targets: list[float]) -> None:
    """Target-L0 mode: each layer's encoder bias lowered so that every latent fires on target_l / d_sae of
    the sample's rows (target_l0.cut_for_l0): the CLT starts at its target L0 per layer."""
    from circuitlab.dictionaries.target_l0 import ROWS_FOR_CUT, cut_for_l0

    xs, _ = stack_layers(clt.cfg, sample, clt.device)
    for l, (scale, target) in enumerate(zip(in_scales, targets)):
        clt.b_enc[l].sub_(cut_for_l0(clt.pre_acts(xs[:ROWS_FOR_CUT, l] * scale, l), target))


def stack_layers(cfg: CLTConfig, batch: dict[str, torch.Tensor], device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A store batch {hook: [rows, d]} -> (inputs, outputs) [rows, L, d_model], layer by layer."""
    missing = [h for h in cfg.hooks() if h not in batch]
    if missing:
        raise CircuitlabError(f"the activations have no {missing[0]!r} (a CLT needs every layer's MLP input and output)")
    xs = torch.stack([batch[cfg.in_hook(l)] for l in range(cfg.n_layers)], dim=1).to(device)
    ys = torch.stack([batch[cfg.out_hook(l)] for l in range(cfg.n_layers)], dim=1).to(device)
    return xs, ys


def scaled_inputs(clt: CrossLayerTranscoder, batch: dict[str, torch.Tensor], scales: tuple[Any, Any]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = stack_layers(clt.cfg, batch, clt.device)
    s_in, s_out = (torch.tensor(s, dtype=xs.dtype, device=xs.device)[None, :, None] for s in scales)
    return xs * s_in, ys * s_out


@torch.no_grad()
def after_step(clt: CrossLayerTranscoder) -> None:
    """Unless the penalty weighs decoder norms (TopK family): each feature's whole decoder back to unit norm.
    A learned threshold (JumpReLU) stays positive."""
    if clt.cfg.arch.unit_decoder(clt=True):
        for W in clt.W_dec:
            W.div_(W.flatten(1).norm(dim=-1).clamp(min=1e-8)[:, None, None])
    if clt.cfg.arch.learns_threshold:
        for t in clt.threshold:
            t.clamp_(min=1e-4)


# ---------------------------------------------------------------------------- metrics

@dataclass
class CLTMetrics:
    """Held-out reconstruction of every layer's MLP output, and sparsity, layer by layer.

    fvu / explained_variance pool all layers (Σ squared error / Σ variance); l0 is the mean per layer."""

    n_rows: int
    l0: float
    mse: float
    fvu: float
    explained_variance: float
    dead_frac: float
    dense_frac: float
    layer_fvu: list[float]
    layer_explained_variance: list[float]
    layer_l0: list[float]
    layer_dead_frac: list[float]
    density: torch.Tensor = field(repr=False)  # [L, d_sae]
    spliced: Any = None   # SplicedLoss (dictionaries.metrics) when measured

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("density", "spliced")}
        if self.spliced is not None:
            out["spliced"] = self.spliced.to_dict()
        return out

    def _repr_html_(self) -> str:
        head = "".join(f"<th>layer {i}</th>" for i in range(len(self.layer_l0)))
        rows = "".join(f"<tr><td>{name}</td>{''.join(f'<td>{v:.4g}</td>' for v in vals)}</tr>" for name, vals in (
            ("explained variance", self.layer_explained_variance), ("L0", self.layer_l0), ("dead", self.layer_dead_frac)))
        return (f"<p>{self.n_rows} rows: explained variance {self.explained_variance:.4f}, L0 {self.l0:.2f} per layer, "
                f"dead {self.dead_frac:.1%}</p><table><tr><th></th>{head}</tr>{rows}</table>")


@torch.no_grad()
def evaluate_clt(clt: CrossLayerTranscoder, batches: Iterable[dict[str, torch.Tensor]]) -> CLTMetrics:
    """Every layer's reconstruction and sparsity over batches of raw activations {hook: [rows, d_model]}."""
    from circuitlab.dictionaries.metrics import DENSE_ABOVE

    L = clt.cfg.n_layers
    n, sse, sum_y, sum_y2 = 0, torch.zeros(L, dtype=torch.float64), None, torch.zeros(L, dtype=torch.float64)
    fires = torch.zeros(L, clt.cfg.d_sae, dtype=torch.float64)
    for batch in batches:
        xs, ys = stack_layers(clt.cfg, batch, clt.device)
        y_hat, acts = clt(xs)
        ys = ys.double()
        n += len(xs)
        sse += (y_hat.double() - ys).pow(2).sum((0, 2)).cpu()
        sum_y = ys.sum(0).cpu() if sum_y is None else sum_y + ys.sum(0).cpu()        # [L, d]
        sum_y2 += ys.pow(2).sum((0, 2)).cpu()
        fires += (acts > 0).sum(0).double().cpu()
    if n == 0 or sum_y is None:  # (sum_y is None only when n == 0)
        raise CircuitlabError("no activations to evaluate on")
    sst = sum_y2 - sum_y.pow(2).sum(-1) / n
    layer_fvu = (sse / sst).tolist()
    fvu = float(sse.sum() / sst.sum())
    density = (fires / n).float()
    return CLTMetrics(n_rows=n, l0=float(fires.sum()) / n / L, mse=float(sse.sum()) / n, fvu=fvu, explained_variance=1 - fvu,
                      dead_frac=float((density == 0).float().mean()), dense_frac=float((density > DENSE_ABOVE).float().mean()),
                      layer_fvu=layer_fvu, layer_explained_variance=[1 - f for f in layer_fvu],
                      layer_l0=(fires.sum(-1) / n).tolist(), layer_dead_frac=(density == 0).float().mean(-1).tolist(),
                      density=density)
