"""How good a dictionary is: reconstruction, sparsity, feature density, and the model's loss when spliced in.

    m = evaluate(sae, batches)                    # batches: iterable of {hook: [rows, width]}
    m.l0, m.fvu, m.explained_variance, m.mse, m.cosine, m.l2_ratio, m.dead_frac, m.dense_frac
    s = spliced_loss(model, sae, tokens)          # CE clean / spliced / zero-ablated, CE recovered, KL

Definitions (SAELens's): FVU = Σ‖y − ŷ‖² / Σ‖y − ȳ‖², explained variance = 1 − FVU; cosine and
L2 ratio ‖ŷ‖/‖y‖ are averaged over rows (L2 ratio < 1 is shrinkage); a latent's density is the
fraction of rows where it fires: dead = never fired, dense = fires on more than 10% of rows.
CE recovered = (CE_zero − CE_spliced) / (CE_zero − CE_clean): 1 for a perfect dictionary, 0 for one
no better than zeroing the hook.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.dictionaries.sae import SparseDictionary, check_base_model
from circuitlab.dictionaries.splice import splice
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

DENSE_ABOVE = 0.1


@dataclass
class DictionaryMetrics:
    n_rows: int
    l0: float
    mse: float
    fvu: float
    explained_variance: float
    cosine: float
    l2_ratio: float
    dead_frac: float
    dense_frac: float
    density: torch.Tensor = field(repr=False)  # [d_sae] fraction of rows each latent fires on
    spliced: "SplicedLoss | None" = None

    def density_histogram(self, bins: int = 20) -> tuple[list[int], list[float]]:
        """Counts of live latents by log10 density, and the bin edges (dead latents are dead_frac)."""
        live = self.density[self.density > 0].double().log10()
        if not len(live):
            return [0] * bins, [0.0] * (bins + 1)
        lo, hi = float(live.min()), max(float(live.max()), float(live.min()) + 1e-6)
        counts = torch.histc(live, bins=bins, min=lo, max=hi)
        return [int(c) for c in counts], [lo + (hi - lo) * i / bins for i in range(bins + 1)]

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("density", "spliced")}
        counts, edges = self.density_histogram()
        out["log10_density_histogram"] = {"counts": counts, "edges": [round(e, 4) for e in edges]}
        if self.spliced is not None:
            out["spliced"] = self.spliced.to_dict()
        return out

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{k}</td><td>{v:.4g}</td></tr>" for k, v in self.to_dict().items()
                       if isinstance(v, float))
        return f"<table><tr><th>metric</th><th>value</th></tr>{rows}</table>"


@torch.no_grad()
def evaluate(sae: SparseDictionary, batches: Iterable[dict[str, torch.Tensor]]) -> DictionaryMetrics:
    """Reconstruction and sparsity over batches of raw activations {hook: [rows, width]}."""
    cfg = sae.cfg
    out_hook = cfg.out_hook_name or cfg.hook_name
    n, sse, sum_y, sum_y2, cos, ratio, l0 = 0, 0.0, None, 0.0, 0.0, 0.0, 0.0
    fires = torch.zeros(cfg.d_sae, dtype=torch.float64)
    for batch in batches:
        for name in (cfg.hook_name, out_hook):
            if name not in batch:
                raise CircuitlabError(f"the evaluation batches have no {name!r} (they have {', '.join(batch)})")
        x = batch[cfg.hook_name].to(sae.device)
        y = batch[out_hook].to(sae.device).to(sae.W_dec.dtype)
        y_hat, acts = sae(x)
        active = acts > 0
        n += len(x)
        sse += float((y_hat - y).pow(2).sum())
        sum_y = y.sum(0).double() if sum_y is None else sum_y + y.sum(0).double()
        sum_y2 += float(y.double().pow(2).sum())
        cos += float(torch.nn.functional.cosine_similarity(y_hat, y, dim=-1).sum())
        ratio += float((y_hat.norm(dim=-1) / y.norm(dim=-1).clamp(min=1e-12)).sum())
        l0 += float(active.sum())
        fires += active.sum(0).double().cpu()
    if n == 0 or sum_y is None:  # (sum_y is None only when n == 0)
        raise CircuitlabError("no activations to evaluate on")
    sst = sum_y2 - float(sum_y.pow(2).sum()) / n
    fvu = sse / sst if sst > 0 else float("nan")
    density = (fires / n).float()
    return DictionaryMetrics(n_rows=n, l0=l0 / n, mse=sse / n, fvu=fvu, explained_variance=1 - fvu,
                             cosine=cos / n, l2_ratio=ratio / n, dead_frac=float((density == 0).float().mean()),
                             dense_frac=float((density > DENSE_ABOVE).float().mean()), density=density)


# ---------------------------------------------------------------------------- spliced into the model

@dataclass
class SplicedLoss:
    ce_clean: float
    ce_spliced: float
    ce_zero: float
    ce_recovered: float
    kl: float          # KL(clean ‖ spliced) of the next-token distributions, mean per token

    def to_dict(self) -> dict:
        return asdict(self)

    def recovered_note(self) -> str:
        """What a printed "CE recovered" needs beside it when the numbers cannot carry it: "" or " (not measurable:
        zeroing moves the loss by only +0.018 nats)"."""
        from circuitlab.analysis.patching.metrics import gap_within_noise

        if gap_within_noise(self.ce_clean, self.ce_zero) or self.ce_zero < self.ce_clean:
            return f" (not measurable: zeroing moves the loss by only {self.ce_zero - self.ce_clean:+.3f} nats)"
        return ""

    def kept(self, what: str, owner: str, by: str) -> str:
        """loss_kept in words for these numbers (what="the MLPs", owner="the MLPs'", by="the transcoders")."""
        return loss_kept(self.ce_clean, self.ce_spliced, self.ce_zero, self.ce_recovered, what, owner, by)


def loss_kept(clean: float, spliced: float, zero: float, recovered: float, what: str, owner: str, by: str) -> str:
    """The share of `what`'s contribution to the loss a dictionary (`by`) keeps when spliced in, in words, when the
    numbers can say it: zeroing `what` must raise the loss by at least GAP_FLOOR nats for the share to mean anything
    (a short run's 6.286 -> 6.270 with 6.292 zeroed is not "363.6% kept"); outside [0, 1] it says all or none."""
    from circuitlab.analysis.patching.metrics import GAP_FLOOR, gap_within_noise

    if gap_within_noise(clean, zero) or zero < clean or math.isnan(recovered):
        return (f"zeroing {what} moves the loss by {zero - clean:+.3f} nats (a rise of at least {GAP_FLOOR:g} would "
                f"show {owner} contribution), so nothing can be concluded about the share of it kept with {by}")
    if spliced <= clean:
        return f"the loss with {by} is no higher than the model's own: all of {owner} contribution kept"
    if spliced >= zero:
        return f"the loss with {by} is no lower than with {what} zeroed: none of {owner} contribution kept"
    return f"{recovered:.1%} of {owner} contribution kept"


@torch.no_grad()
def spliced_loss(model: Transformer, sae: Any, tokens: torch.Tensor) -> SplicedLoss:
    """tokens [batch, pos+1]: next-token CE of the model as is, with the dictionary's reconstruction
    in place of its hook (a transcoder replaces the MLP output), and with that hook zeroed.

    `sae` may be a list of dictionaries (all replaced at once: a transcoder per layer replaces every MLP)
    or a CrossLayerTranscoder (every MLP output replaced by what the CLT's features write into it)."""
    from circuitlab.dictionaries.clt import CrossLayerTranscoder

    dictionaries = list(sae) if isinstance(sae, (list, tuple)) else [sae]
    for d in dictionaries:
        check_base_model(d, model)
    logp_clean = model(tokens[:, :-1]).log_softmax(-1)
    targets = tokens[:, 1:]

    def ce(logp: torch.Tensor) -> float:
        return float(-logp.gather(-1, targets[..., None]).mean())

    with splice(model, dictionaries, error_term=False):  # the reconstructions alone in place of the hooks they write
        logp_spliced = model(tokens[:, :-1]).log_softmax(-1)
    written = [h for d in dictionaries for h in (
        [d.cfg.out_hook(l) for l in range(d.cfg.n_layers)] if isinstance(d, CrossLayerTranscoder)
        else [d.cfg.out_hook_name if d.cfg.is_transcoder else d.cfg.hook_name])]
    zeroed = [(h, lambda t, hook: torch.zeros_like(t)) for h in written]
    logp_zero = model.run_with_hooks(tokens[:, :-1], fwd_hooks=zeroed).log_softmax(-1)
    clean, spliced, zero = ce(logp_clean), ce(logp_spliced), ce(logp_zero)
    kl = float((logp_clean.exp() * (logp_clean - logp_spliced)).sum(-1).mean())
    denom = zero - clean
    recovered = (zero - spliced) / denom if abs(denom) > 1e-12 else math.nan
    return SplicedLoss(clean, spliced, zero, recovered, kl)
