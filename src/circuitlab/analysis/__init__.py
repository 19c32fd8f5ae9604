"""Analyses: pure functions over a model (and tokens or a cache) returning result objects.

Import from the submodules, e.g. ``from circuitlab.analysis.heads.detectors import detect_heads``.
"""
