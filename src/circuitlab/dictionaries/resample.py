"""Resampling dead latents, for SAEs, transcoders and CLTs alike: resample_dead.

    n = resample_dead(dictionary, optimizer, dead, x, y, generator, threshold=0.1, method="inputs")

Called by DictionaryTrainer every resample_every steps (see train.py for when); x, y are rows of the
current and next batches, scaled as in training ([rows, d_in] / [rows, d_out]; a CLT's [rows, L, d_model]).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from circuitlab.dictionaries.clt import CrossLayerTranscoder, _unit_rows
from circuitlab.dictionaries.sae import SparseDictionary
from circuitlab.errors import CircuitlabError


@torch.no_grad()
def resample_dead(dictionary: SparseDictionary | CrossLayerTranscoder, optimizer: torch.optim.Optimizer,
                  dead: torch.Tensor, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator,
                  threshold: float | None = None, method: str = "inputs") -> int:
    """Re-initialise the dead latents (dead [n_latents] bool) of an SAE, transcoder or CLT from rows x with
    targets y; "inputs" toward the worst-reconstructed rows, "split" (SAEs only) by splitting live latents
    that serve two features. A learned threshold goes back to `threshold`; Adam's moments of what moved are
    reset. Returns how many were resampled."""
    if isinstance(dictionary, CrossLayerTranscoder):
        return _resample_clt(dictionary, optimizer, dead, x, y, generator, threshold, method)
    return _resample_sae(dictionary, optimizer, dead, x, y, generator, threshold, method)


def _fresh_moments(optimizer: torch.optim.Optimizer, params: Iterable[tuple[torch.Tensor, int]], moved: torch.Tensor,
                   live: torch.Tensor | None = None) -> None:
    """Adam's moments of the moved latents (indices along each parameter's latent axis): first moments zeroed;
    second moments zeroed, or (live given) set to the live latents' mean."""
    for p, axis in params:
        state = optimizer.state.get(p, {})
        if "exp_avg" not in state:
            continue
        where = (slice(None), moved) if axis else (moved,)
        state["exp_avg"][where] = 0
        if live is not None:
            state["exp_avg_sq"][where] = state["exp_avg_sq"].index_select(axis, live).mean(axis, keepdim=True)
        else:
            state["exp_avg_sq"][where] = 0


def _resample_sae(sae: SparseDictionary, optimizer: torch.optim.Optimizer, dead: torch.Tensor, x: torch.Tensor,
                  y: torch.Tensor, generator: torch.Generator, threshold: float | None, method: str) -> int:
    """An SAE's or transcoder's dead latents [d_sae] bool from rows x [rows, d_in] with targets y [rows, d_out].

    "inputs" (Anthropic, 2023): toward inputs the dictionary reconstructs worst. Picks rows with
    probability ∝ squared error; the decoder row becomes that row's residual direction, the encoder
    column its input direction at 0.2 × the live latents' mean encoder norm; Adam moments zeroed.

    "split" (SAEs only): each dead latent splits a live latent that serves two features at once
    (see split_targets); the two take the two directions it was averaging, both at the parent's
    encoder norm. Both get fresh Adam moments: first moments zeroed (the parent's pointed back to the
    merge), second moments set to the live latents' mean, because zeroed second moments under Adam's
    global bias correction make the next ~100 steps 3-6x the learning rate, which throws a latent
    placed on a good direction off it. Dead latents left without a latent to split (none with
    structure in its residual) get "inputs".

    A learned threshold (JumpReLU) goes back to `threshold`. Returns how many were resampled.
    """
    idx = dead.nonzero().flatten()
    if not len(idx):
        return 0
    x, y = x.to(sae.W_enc.dtype), y.to(sae.W_dec.dtype)  # a float64 dictionary on float32 activations
    y_hat, acts = sae(x)  # inference activations: BatchTopK as the threshold it is used with
    residual = y - y_hat
    children, parents = idx[:0], idx[:0]
    if method == "split":
        children, parents, child_dirs, parent_dirs = split_targets(sae, dead, acts, residual)
        gain = sae.W_enc[:, parents].norm(dim=0)  # both keep the parent's encoder scale
        sae.W_dec[children], sae.W_enc[:, children] = child_dirs, (child_dirs * gain[:, None]).T
        sae.W_dec[parents], sae.W_enc[:, parents] = parent_dirs, (parent_dirs * gain[:, None]).T
    rest = idx[~torch.isin(idx, children)]
    if len(rest):
        err = residual.pow(2).sum(-1)
        pick = torch.multinomial(err.cpu() + 1e-12, len(rest), replacement=True, generator=generator).to(x.device)
        enc = (x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x)[pick]
        alive_norm = sae.W_enc[:, ~dead].norm(dim=0).mean() if bool((~dead).any()) else torch.tensor(1.0)
        sae.W_dec[rest] = _unit(residual[pick])
        sae.W_enc[:, rest] = (_unit(enc) * alive_norm * 0.2).T
    sae.b_enc[idx] = 0
    if threshold is not None and sae.cfg.arch.learns_threshold:
        sae.threshold[idx] = threshold
    live = (~dead).nonzero().flatten()
    moved = torch.cat([idx, parents])  # a split parent moved too: its old moments point back to the merge
    _fresh_moments(optimizer, ((sae.W_dec, 0), (sae.W_enc, 1), (sae.b_enc, 0)), moved,
                   live if method == "split" and len(live) else None)
    return len(idx)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-8)


@torch.no_grad()
def split_targets(sae: SparseDictionary, dead: torch.Tensor, acts: torch.Tensor, residual: torch.Tensor,
                  candidates: int = 64, iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which live latents to split for the dead ones, and into what (k-means' cluster splitting).

    A latent that serves two features (two features merged into one latent, the usual reason a
    threshold dictionary leaves a latent dead) decodes their average direction, so on the rows where
    it fires the residual [rows, d_out] is large and two-sided along the direction that separates
    them. Score each of the `candidates` live latents carrying the most squared error by how much more
    residual energy its rows have along their own principal direction than the other rows have; the
    best-scoring (score > 0) are split, one per dead latent: 2-means on what the latent explains
    there (residual + its own contribution), started from the sign of the residual along that
    direction. The child takes the centroid farther from the parent's decoder, the parent the other.

    Returns (children, parents) [n] latent indices and their unit directions (child_dirs, parent_dirs) [n, d_out].
    """
    fired = acts > 0                                                  # [rows, d_sae]
    err = residual.pow(2).sum(-1)                                     # [rows]
    load = (fired.to(err.dtype) * err[:, None]).sum(0).masked_fill(dead | (fired.sum(0) < 8), -1)
    cand = load.topk(min(candidates, int((load > 0).sum()))).indices  # [m]
    mask = fired[:, cand].to(err.dtype)                               # [rows, m]
    # principal direction of each candidate's residuals on its rows (power iteration), from its worst row
    v = _unit(residual[(mask * err[:, None]).argmax(0)])              # [m, d_out]
    for _ in range(iters):
        v = _unit((mask * (residual @ v.T)).T @ residual)
    along = (residual @ v.T).pow(2)                                   # [rows, m]
    n = mask.sum(0)
    elsewhere = ((1 - mask) * along).sum(0) / (len(residual) - n).clamp(min=1)
    score = (mask * along).sum(0) - n * elsewhere                     # [m]
    order = score.argsort(descending=True)
    free = dead.nonzero().flatten().tolist()
    children: list[int] = []
    parents: list[int] = []
    child_dirs: list[torch.Tensor] = []
    parent_dirs: list[torch.Tensor] = []
    for c in order[score[order] > 0].tolist():
        if len(children) == len(free):
            break
        latent, rows = int(cand[c]), mask[:, c] > 0
        explained = residual[rows] + acts[rows, latent, None] * sae.W_dec[latent]  # [n, d_out]
        side = residual[rows] @ v[c] > 0
        for _ in range(5):
            if side.all() or not side.any():
                break
            a, b = _unit(explained[side].sum(0)), _unit(explained[~side].sum(0))
            side = explained @ a > explained @ b
        if side.all() or not side.any():  # one group only: nothing to split here
            continue
        a, b = _unit(explained[side].sum(0)), _unit(explained[~side].sum(0))
        if a @ sae.W_dec[latent] > b @ sae.W_dec[latent]:
            a, b = b, a
        children.append(free[len(children)])
        parents.append(latent)
        child_dirs.append(a)
        parent_dirs.append(b)
    index = torch.tensor(children, dtype=torch.long, device=residual.device)
    if not children:
        empty = residual.new_zeros(0, residual.shape[-1])
        return index, index, empty, empty
    return index, torch.tensor(parents, dtype=torch.long, device=residual.device), torch.stack(child_dirs), torch.stack(parent_dirs)


def _resample_clt(clt: CrossLayerTranscoder, optimizer: torch.optim.Optimizer, dead: torch.Tensor, xs: torch.Tensor,
                  ys: torch.Tensor, generator: torch.Generator, threshold: float | None, method: str) -> int:
    """A CLT's dead latents [L · d_sae] bool, toward the rows the CLT reconstructs worst (Anthropic, 2023):
    a dead latent of layer l gets as decoder the residual of a row (picked ∝ its squared error in layers
    l..L-1) over those layers, as encoder that row's layer-l input at 0.2 × the live encoders' mean norm;
    its bias goes to 0, its learned threshold to `threshold`, its Adam moments to 0. xs, ys [rows, L, d].
    Returns how many were resampled."""
    if method != "inputs":
        raise CircuitlabError(f"a CLT resamples toward its worst-reconstructed rows ('inputs'), not {method!r}")
    cfg = clt.cfg
    L, n = cfg.n_layers, cfg.d_sae
    y_hat, _ = clt(xs)
    residual = ys.to(clt.dtype) - y_hat                                              # [rows, L, d]
    total = 0
    for l in range(L):
        idx = dead[l * n:(l + 1) * n].nonzero().flatten()
        if not len(idx):
            continue
        res = residual[:, l:] if not cfg.tied else residual[:, l:].mean(1, keepdim=True)
        err = res.pow(2).sum((1, 2))
        pick = torch.multinomial(err.cpu() + 1e-12, len(idx), replacement=True, generator=generator).to(xs.device)
        live = torch.ones(n, dtype=torch.bool, device=xs.device)
        live[idx] = False
        scale = clt.W_enc[l][:, live].norm(dim=0).mean() if bool(live.any()) else torch.tensor(1.0)
        clt.W_dec[l][idx] = _unit_rows(res[pick])
        enc = xs[pick, l].to(clt.dtype)
        clt.W_enc[l][:, idx] = (enc / enc.norm(dim=-1, keepdim=True).clamp(min=1e-8) * scale * 0.2).T
        clt.b_enc[l][idx] = 0
        if threshold is not None and cfg.arch.learns_threshold:
            clt.threshold[l][idx] = threshold
        _fresh_moments(optimizer, ((clt.W_dec[l], 0), (clt.W_enc[l], 1), (clt.b_enc[l], 0)), idx)
        total += len(idx)
    return total
