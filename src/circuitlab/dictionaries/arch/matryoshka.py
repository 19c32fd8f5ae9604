"""Matryoshka BatchTopK (Bussmann et al. 2025, Nabeshima 2024; SAELens's "matryoshka_batchtopk"): BatchTopK whose
first m_1 < m_2 < ... < m_n = d_sae latents (the config's matryoshka_widths) must each reconstruct the target on
their own. The loss adds, for every inner width m_i, the squared error of the output that only latents 0..m_i-1
give (b_dec, the skip connection, and their decoder rows):

    loss = Σ_i ‖y − (b + Σ_{j < m_i} a_j W_dec,j)‖²  (mean over rows; i = n is the usual MSE)  + AuxK

so the early latents learn the general features and the later ones refine them, instead of a later latent
absorbing an early one. Training keeps the batch's top k·rows (BatchTopK's, with its running threshold);
inference and the saved form are the JumpReLU with that threshold, as BatchTopK's (SAELens saves it so too).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from circuitlab.dictionaries.arch.batchtopk import BatchTopK


class MatryoshkaBatchTopK(BatchTopK):
    name = "matryoshka_batchtopk"
    uses_widths = True
    trains_clt = False  # nested prefixes of a CLT's latents are not defined here (nor in SAELens)
    formats = {}        # saved as the JumpReLU it is (saved_as), as SAELens does

    def reconstruction_terms(self, partial: Callable[[int, int], torch.Tensor], base: torch.Tensor, y: torch.Tensor,
                             widths: list[int] | None) -> list[torch.Tensor]:
        assert widths, "Matryoshka needs its widths (DictionaryConfig.matryoshka_widths)"
        terms, out, lo = [], base, 0
        for hi in widths[:-1]:  # the last width is the whole dictionary: the step's own MSE
            out = out + partial(lo, hi)   # each prefix adds its new group of latents to the last one's output
            terms.append((out - y).pow(2).sum(-1).mean())
            lo = hi
        return terms
