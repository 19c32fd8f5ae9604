"""circuit-tracer's side of bench_graphs.py, run in circuit-tracer's own virtual environment (it imports
no circuitlab): read the model (TransformerLens config + state dict), the transcoders (config.yaml +
layer_{i}.safetensors) and the prompt from DIR, attribute, prune, score, and write DIR/peer.safetensors +
DIR/peer.json.

    python _graphs_peer.py DIR [DIR ...]      # several graphs in one process (tests/graphs/test_attribution_circuit_tracer.py)
"""
import json
import sys
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file


class Tokenizer:
    """Enough of a tokenizer for circuit-tracer on token ids: token 0 is the special (BOS) token."""

    all_special_ids = [0]
    bos_token_id = pad_token_id = eos_token_id = 0
    padding_side = "right"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def decode(self, ids):
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        ids = [ids] if isinstance(ids, int) else ids
        return "".join(f"<{i}>" for i in ids)


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(folder: str) -> None:
    from transformer_lens import HookedTransformerConfig

    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.utils.hf_utils import load_transcoders

    d = Path(folder)
    spec = json.loads((d / "spec.json").read_text())
    torch.set_num_threads(spec["threads"])
    options = dict(spec["tl_config"], dtype=getattr(torch, spec["tl_config"]["dtype"]), device="cpu")
    cfg = HookedTransformerConfig(**options)
    model = TransformerLensReplacementModel(cfg)
    params = dict(model.named_parameters())  # buffers (masks, rotary tables) are TransformerLens's own
    state = {k: v for k, v in load_file(str(d / "tl_model.safetensors")).items() if k in params}
    assert set(state) == set(params), sorted(set(params) ^ set(state))
    model.load_state_dict(state, strict=False)
    config = yaml.safe_load((d / "transcoders" / "config.yaml").read_text())
    config["transcoders"] = [str(d / "transcoders" / p) for p in config["transcoders"]]
    transcoders = load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32,
                                   lazy_encoder=False, lazy_decoder=False)
    model._configure_replacement_model(transcoders)
    model.tokenizer = Tokenizer(cfg.d_vocab)
    tokens = torch.tensor(spec["tokens"])
    out = {}
    for run in range(spec["repeats"]):
        t0 = time.perf_counter()
        graph = attribute(tokens, model, max_n_logits=spec["max_n_logits"], desired_logit_prob=spec["desired_logit_prob"],
                          batch_size=spec["batch_size"], max_feature_nodes=spec["max_feature_nodes"])
        out.setdefault("seconds", []).append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    pruned = prune_graph(graph, spec["node_threshold"], spec["edge_threshold"])
    scores = compute_graph_scores(graph)
    out["prune_seconds"] = time.perf_counter() - t0
    out["replacement"], out["completeness"] = scores
    out["peak_rss_mb"] = peak_mb()
    out["n_tokens"] = len(graph.input_tokens)
    save_file({"adjacency": graph.adjacency_matrix.contiguous(), "active_features": graph.active_features.contiguous(),
               "activations": graph.activation_values.contiguous(), "selected": graph.selected_features.contiguous(),
               "logit_tokens": torch.tensor([t.vocab_idx for t in graph.logit_targets]),
               "logit_probs": graph.logit_probabilities.contiguous(), "node_mask": pruned.node_mask.contiguous(),
               "edge_mask": pruned.edge_mask.contiguous()}, str(d / "peer.safetensors"))
    (d / "peer.json").write_text(json.dumps(out))


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        main(folder)
