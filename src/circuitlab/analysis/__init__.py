"""Analyses: pure functions over a model (and tokens or a cache) returning result objects.

Import from the submodules, e.g. ``from circuitlab.analysis.head_detectors import detect_heads``.
"""
