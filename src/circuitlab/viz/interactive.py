"""Every view in one place, and how each result object displays in Jupyter (offline, viz/notebook.py).

Every view is defined once, as a FigureSpec (circuitlab.viz.figure) built in its topic module; they are
gathered here for convenience (`from circuitlab.viz.interactive import heatmap_figure`):

    attention_figure, attention_patterns_figure, head_scores_figure     viz.heads
    training_curves_figure, induction_by_period_figure                  viz.training
    heatmap_figure, lines_figure (viz.figure), qk_ov_figure, copying_scores_figure,
    composition_figure                                                  viz.qk_ov
    logit_lens_figure, logit_attribution_figure                         viz.lens
    patching_figure, path_patching_figure, ablation_figure,
    attribution_vs_patching_figure                                      viz.patching
    probe_figure                                                        viz.probing
    steering_figure                                                     viz.steering

A method's own views live in its module (circuitlab/methods/: causal tracing's there, with the display of
its results). `spec.to_plotly()` is the plotly Figure (report.html, serve), `spec.save_png(path)` the PNG (report.md);
a spec displays itself in Jupyter (viz/notebook.py; notebook_html and reset_notebook are re-exported here).
Nothing here reads or writes files.
"""
from __future__ import annotations

from circuitlab.analysis.heads import AttentionPatterns
from circuitlab.analysis.lens import LogitLens
from circuitlab.analysis.logit_attribution import LogitAttribution
from circuitlab.analysis.patching import PatchResult
from circuitlab.analysis.probing import ProbeResult
from circuitlab.display import renders
from circuitlab.viz.heads import attention_figure, attention_patterns_figure, head_scores_figure
from circuitlab.viz.lens import logit_attribution_figure, logit_lens_figure
from circuitlab.viz.notebook import notebook_html, reset_notebook
from circuitlab.viz.patching import (ablation_figure, attribution_vs_patching_figure, path_patching_figure,
                                     patching_figure)
from circuitlab.viz.probing import probe_figure
from circuitlab.viz.qk_ov import composition_figure, copying_scores_figure, qk_ov_figure
from circuitlab.viz.figure import FigureSpec, heatmap_figure, lines_figure
from circuitlab.viz.steering import steering_figure
from circuitlab.viz.training import induction_by_period_figure, training_curves_figure

# How each result object displays in Jupyter (circuitlab.display): its figure, plotly.js inlined.
renders(AttentionPatterns)(lambda view: notebook_html(attention_patterns_figure(view)))
renders(LogitLens)(lambda lens: notebook_html(logit_lens_figure(lens)))
renders(LogitAttribution)(lambda dla: notebook_html(logit_attribution_figure(dla)))
renders(PatchResult)(lambda result: notebook_html(patching_figure(result)))
renders(ProbeResult)(lambda result: notebook_html(probe_figure(result)))

__all__ = ["FigureSpec", "ablation_figure", "attention_figure", "attention_patterns_figure",
           "attribution_vs_patching_figure", "qk_ov_figure",
           "composition_figure", "copying_scores_figure",
           "head_scores_figure", "heatmap_figure", "induction_by_period_figure", "lines_figure",
           "logit_attribution_figure", "logit_lens_figure", "notebook_html", "path_patching_figure",
           "patching_figure", "probe_figure", "reset_notebook", "steering_figure", "training_curves_figure"]
