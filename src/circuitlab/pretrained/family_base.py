"""Moved: the Family interface and its helpers are circuitlab.pretrained.families.base (one module per family
beside it). This module keeps the old import path for one release, with a DeprecationWarning."""
from __future__ import annotations

import warnings

from circuitlab.pretrained.catalog import model_type
from circuitlab.pretrained.families.base import (_NORM, Family, Piece, Transform, _activation, _bias, _get,
                                                 _n_ctx, _rope, _rotary_dim, _rows, _state, _transpose)

__all__ = ["_NORM", "Family", "Piece", "Transform", "_activation", "_bias", "_get", "_n_ctx", "_rope", "_rotary_dim",
           "_rows", "_state", "_transpose", "model_type"]

warnings.warn("circuitlab.pretrained.family_base moved to circuitlab.pretrained.families.base (model_type: "
              "circuitlab.pretrained.catalog); the old path goes in the next release", DeprecationWarning, stacklevel=2)
