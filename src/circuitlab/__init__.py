"""circuitlab: build, train, load and take apart transformer language models."""
from circuitlab.config import ModelConfig, presets
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.model import ActivationCache, HookPoint, Transformer, act_name

__version__ = "0.1.0"

__all__ = ["ActivationCache", "CircuitlabError", "ConfigError", "HookPoint", "ModelConfig", "Transformer",
           "act_name", "presets", "__version__"]

import sys as _sys

if "IPython" in _sys.modules:  # a notebook: results display as their figures (circuitlab/display.py)
    import circuitlab.viz.interactive  # noqa: E402,F401  registers the renderers
    import circuitlab.viz.tokens  # noqa: E402,F401
    import circuitlab.viz.features  # noqa: E402,F401
    import circuitlab.viz.graph_view  # noqa: E402,F401
    import circuitlab.methods  # noqa: E402,F401  the methods' own views

