"""A family's two weight mappings against each other, without Hugging Face: export_tensors then pieces (through
assemble, as an import places them) must give back every parameter bit for bit, and its export config must read
back as the same ModelConfig. (Against transformers itself: tests/pretrained/test_importer.py, test_families.py.)"""
import re

import torch

from circuitlab.config import ModelConfig
from circuitlab.model import Transformer
from circuitlab.pretrained.assemble import assemble
from circuitlab.pretrained.families.base import Family
from circuitlab.pretrained.source import LoadedTensor


def random_model(family: Family, hf: dict, seed: int = 0) -> Transformer:
    """The family's model of config.json `hf`, every weight random (norm gains 1 ± 0.1, so that Gemma's stored
    gain - 1 is exact) except those the architecture lacks (zero_targets: zero, as an import leaves them)."""
    cfg = family.config(hf)
    model = Transformer(cfg)
    zeros = family.zero_targets(hf, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if name.endswith(".w") else 0.3 * noise)
            if any(re.fullmatch(z, name) for z in zeros):
                p.zero_()
    return model.eval()


def round_trip(family: Family, model: Transformer) -> Transformer:
    """model exported by family (tensors and config.json) and imported back by the same family."""
    common = {"vocab_size": model.cfg.d_vocab, "tie_word_embeddings": model.cfg.tied_embeddings}
    hf = family.hf_config(model.cfg, common)
    assert family.export_problems(model.cfg) == []
    cfg = family.config(hf)
    assert cfg == model.cfg, (cfg, model.cfg)
    tensors = family.export_tensors(model)
    return assemble(cfg, family, hf, ((k, LoadedTensor(v.clone())) for k, v in tensors.items()))


def assert_same_weights(a: Transformer, b: Transformer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
