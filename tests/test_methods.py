"""The registry of methods (circuitlab.methods): what each method declares, and its typed result read back from
its results.json form unchanged (what the report builds its section from)."""
import argparse
import json

import pytest
import torch

from circuitlab import ModelConfig, Transformer
from circuitlab.methods import REGISTRY, REPORT_ORDER
from circuitlab.methods.base import MethodResult
from circuitlab.spec import Options, add_arguments, options_of

pytestmark = pytest.mark.usefixtures("one_thread")


class CharTokenizer:
    vocab_size, eos_id = 128, 0

    def encode(self, text: str) -> list[int]:
        return [min(ord(c), 127) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_every_method_declares_its_parts():
    # every method with a section of its own is in the report's order; circuits' and heads' come from the run
    assert set(REPORT_ORDER) == {n for n, m in REGISTRY.items() if m.section is not None} == set(REGISTRY) - {
        "circuits", "heads"} and len(REPORT_ORDER) == len(set(REPORT_ORDER))
    parser = argparse.ArgumentParser()
    for name, m in REGISTRY.items():
        assert m.name == name and m.result.name == name, name
        assert issubclass(m.options, Options) and issubclass(m.result, MethodResult), name
        assert set(m.inputs) <= {"prompt", "clean", "corrupt", "lens", "progress"}, name
        add_arguments(parser, m.options)   # no two methods declare the same flag
    # causal tracing's own, the sweeps' narrowing options, and input attribution's: every registered technique's
    # (SHAP's and LIME's samples, ...)
    techniques = {f.name for f, _ in options_of(REGISTRY["input_attribution"].options)}
    assert {"samples", "seed", "kernel_width", "steps"} <= techniques and "baseline" not in techniques
    assert {f.name for m in REGISTRY.values() for f, _ in options_of(m.options)} == {
        "subject", "noise", "noise_scale", "noise_samples", "window", "replace_with", "trace_kinds", "trace_layers",
        "trace_positions", "periods", "patch_layers", "patch_targets", "path_patching", "ablation_layers",
        "mlp_ablation"} | techniques


@pytest.mark.parametrize("name", ["circuits", "logit_lens", "attribution", "ablation", "patching", "causal_tracing"])
def test_the_typed_result_reads_back_its_results_json_form(name, tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=128, n_ctx=24))
    m = REGISTRY[name]
    found = m.run_with(model, CharTokenizer(), tmp_path, {"prompt": "Tom saw a cat. Tom", "subject": "Tom",
                                                           "noise_samples": 2, "progress": False})
    stored = json.loads(json.dumps(found.to_dict()))   # as results.json holds it
    back = m.result.from_dict(stored)
    assert type(back) is m.result and back.summary == found.summary and back.figures == found.figures
    again = json.loads(json.dumps(back.to_dict()))
    if m.section is None:   # drawn by the report from the run: the round trip is all
        assert again == stored
        return
    if name == "causal_tracing":   # the peaks are recomputed from the stored (rounded) values: same place, ~same share
        for kind, peak in stored["trace"].pop("peaks").items():
            assert again["trace"]["peaks"][kind] == {**peak, "share": pytest.approx(peak["share"], abs=1e-2)}
        again["trace"].pop("peaks")
    assert again == stored
    section = m.report_section(stored)
    assert section.parts and section.title
