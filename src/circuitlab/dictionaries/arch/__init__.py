"""Dictionary architectures as classes in a registry, shared by SAEs, transcoders and CLTs.

    from circuitlab.dictionaries.arch import Architecture, register_architecture, get_architecture
    get_architecture("topk").activate(pre, k=32, threshold=None)     # [..., d_sae] -> [..., d_sae]

    @register_architecture
    class ShiftedReLU(Architecture):          # then DictionaryConfig("shifted_relu", ...) trains, saves, loads
        name = "shifted_relu"
        def activate(self, pre, k, threshold):
            return (pre - 1).relu()

One file per built-in (relu.py, topk.py, batchtopk.py, jumprelu.py, matryoshka.py), registered here; base.py holds the class and
the registry.
"""
from circuitlab.dictionaries.arch.base import (
    Architecture, Coefficients, architecture_in, architecture_names, find_architecture, format_names,
    get_architecture, register_architecture, unregister_architecture,
)
from circuitlab.dictionaries.arch.relu import ReLU
from circuitlab.dictionaries.arch.topk import TopK
from circuitlab.dictionaries.arch.batchtopk import BatchTopK
from circuitlab.dictionaries.arch.jumprelu import JumpReLU
from circuitlab.dictionaries.arch.matryoshka import MatryoshkaBatchTopK

for _builtin in (ReLU, TopK, BatchTopK, JumpReLU, MatryoshkaBatchTopK):  # the order messages list them in
    register_architecture(_builtin)

__all__ = ["Architecture", "BatchTopK", "Coefficients", "JumpReLU", "MatryoshkaBatchTopK", "ReLU", "TopK", "architecture_in",
           "architecture_names", "find_architecture", "format_names", "get_architecture", "register_architecture",
           "unregister_architecture"]
