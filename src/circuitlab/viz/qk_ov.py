"""Views of QK / OV circuits (weight products): a circuit block (QK, OV, direct path), copying scores,
composition scores.
Scores may be tensors or their JSON form (nested lists, None for NaN)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from circuitlab.analysis.qk_ov import MODES
from circuitlab.names import head_name
from circuitlab.viz import token_label
from circuitlab.viz.figure import FigureSpec, Heatmap, Panel, as_array, heatmap_figure


def qk_ov_figure(matrix: Any, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
                   title: str = "", x_title: str = "key token", y_title: str = "query token",
                   value_name: str = "score") -> FigureSpec:
    """A dense circuit block [rows, cols] (e.g. FactoredMatrix.submatrix on a token subset) on a scale
    centred at 0 (red positive, blue negative); labels are token strings, made visible with token_label."""
    rows = [token_label(s, 12) for s in row_labels] if row_labels is not None else None
    cols = [token_label(s, 12) for s in col_labels] if col_labels is not None else None
    return heatmap_figure(matrix, rows, cols, title, x_title=x_title, y_title=y_title, value_name=value_name)


def copying_scores_figure(scores: Any) -> FigureSpec:
    """Copying score of every head, [layer, head], annotated (1 = pure copying, -1 = anti-copying).
    scores: CopyingScores.scores or its JSON."""
    m = as_array(scores)
    return heatmap_figure(m, [f"L{l}" for l in range(m.shape[0])], [f"H{h}" for h in range(m.shape[1])],
                          "OV copying score per head (Σλ / Σ|λ|; 1 = copies the attended token)", x_title="head",
                          y_title="layer", zmin=-1.0, zmax=1.0, value_name="copying", annotate=True)


def composition_figure(scores: dict[str, Any], baseline_mean: float, baseline_std: float | None = None,
                       modes: Sequence[str] = MODES) -> FigureSpec:
    """Q-, K- and V-composition of every earlier head (rows) into every later head (columns), one panel
    per mode; blank where no path exists; the colour scale starts at the random baseline.
    scores: mode -> [layer, head, layer, head] (CompositionScores.q/.k/.v or their JSON)."""
    grids = {m: as_array(scores[m]) for m in modes}
    L, H = next(iter(grids.values())).shape[:2]
    n = L * H
    names = [head_name(i // H, i % H) for i in range(n)]
    top = max(float(np.nan_to_num(g, nan=0.0).max()) for g in grids.values())
    top = max(top, baseline_mean + 1e-6)
    panels = [Panel(f"{m.upper()}-composition", "reader head", "writer head",
                    Heatmap(g.reshape(n, n), names, names, baseline_mean, top, "Viridis",
                            value_name=f"{m.upper()}-composition"), name=m.upper())
              for m, g in grids.items()]
    spread = f" ± {baseline_std:.3f}" if baseline_std is not None else ""
    return FigureSpec(panels, f"composition scores (random baseline {baseline_mean:.3f}{spread})")
