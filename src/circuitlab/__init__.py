"""circuitlab: build, train, load and take apart transformer language models."""
from circuitlab.config import ModelConfig, presets
from circuitlab.errors import CircuitlabError, ConfigError
from circuitlab.model import ActivationCache, HookPoint, Transformer, act_name

__version__ = "0.1.0"

__all__ = ["ActivationCache", "CircuitlabError", "ConfigError", "HookPoint", "ModelConfig", "Transformer",
           "act_name", "presets", "__version__"]
