"""The hookable Transformer and its parts."""
from circuitlab.model.hooks import ActivationCache, HookPoint, act_name
from circuitlab.model.transformer import (KVCache, Transformer, check_device, frozen_parameters, lm_loss,
                                         model_device, model_dtype)

__all__ = ["ActivationCache", "HookPoint", "KVCache", "Transformer", "act_name", "check_device", "frozen_parameters",
           "lm_loss", "model_device", "model_dtype"]
