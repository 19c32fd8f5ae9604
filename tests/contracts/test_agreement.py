"""The command line, the config loader, the Python API and the explorer accept and refuse the same numbers,
field by field (the explorer may be stricter where it answers while you wait, never looser); the explorer's
OpenAPI schema answers; an optional peer's absence does not stop a format writer."""
import argparse
import math

import pytest
import torch
from fastapi.testclient import TestClient

from circuitlab import ModelConfig, Transformer
from circuitlab.cli import build_parser
from circuitlab.data.tokenizers import CharTokenizer
from circuitlab.errors import CircuitlabError
from circuitlab.serve import create_app
from circuitlab.training import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "Lily saw a cat. The cat was happy. Lily said hello to the dog."
# What a user may type or send: the CLI gets their text, Python and the explorer the value.
VALUES = [("0", 0), ("1", 1), ("3", 3), ("-2", -2), ("0.5", 0.5), ("2.0", 2.0), ("1e-3", 1e-3), ("nan", math.nan),
          ("inf", math.inf), ("-inf", -math.inf), ("true", True), ("false", False), ("abc", "abc"), ("300", 300),
          ("2000", 2000)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree")
    from circuitlab.data.stories import stories_text

    tok = CharTokenizer.from_texts([TEXT, stories_text(2000)])  # the explorer's steering reads built-in stories
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tok.vocab_size, n_ctx=32))
    save_checkpoint(root / "run" / "checkpoint", model, tok)
    client = TestClient(create_app(root / "run"))
    return root, model, tok, client


def cli_accepts(argv: list[str]) -> bool:
    try:
        build_parser().parse_args(argv)
        return True
    except SystemExit:
        return False


def post(client, url: str, body: dict):
    """As a browser or curl may send it: NaN and Infinity are JSON tokens Python's parser reads."""
    import json

    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


def python_accepts(call) -> bool:
    try:
        call()
        return True
    except CircuitlabError:
        return False


def test_ig_steps_agree(setup):
    from circuitlab.analysis.input_attribution import integrated_gradients

    root, model, tok, client = setup
    ids = torch.tensor(tok.encode("Lily saw"))
    for text, value in VALUES:
        cli = cli_accepts(["attribute", "--checkpoint", "x", "--prompt", "p", "--steps", text])
        api = python_accepts(lambda: integrated_gradients(model, ids, steps=value))
        r = post(client, "/api/attribute", {"prompt": "Lily saw", "method": "ig", "steps": value})
        assert r.status_code in (200, 422), r.text
        explorer = r.status_code == 200
        assert cli == api, (text, cli, api)
        assert not explorer or cli, (text, "the explorer accepts what the CLI refuses")
        assert explorer == (cli and value <= 256), text  # stricter only by its documented limit


@pytest.mark.parametrize("option, key, method", [("--samples", "samples", "shap"), ("--seed", "seed", "shap"),
                                                 ("--kernel-width", "kernel_width", "lime")])
def test_shap_and_lime_options_agree(setup, option, key, method):
    from circuitlab.analysis.input_attribution import attribute_inputs

    root, model, tok, client = setup
    ids = torch.tensor(tok.encode("Lily saw"))
    for text, value in VALUES:
        cli = cli_accepts(["attribute", "--checkpoint", "x", "--prompt", "p", "--method", method, option, text])
        few = {} if key == "samples" else {"samples": 8}
        api = python_accepts(lambda: attribute_inputs(model, ids, method, progress=False, **few, **{key: value}))
        r = post(client, "/api/attribute", {"prompt": "Lily saw", "method": method, **few, key: value})
        assert r.status_code in (200, 422), r.text
        explorer = r.status_code == 200
        assert cli == api, (option, text, cli, api)
        assert explorer == (cli and (key != "samples" or value <= 8192)), (option, text)  # stricter by its limit only


def test_steering_coefficients_agree(setup):
    from circuitlab.analysis.steering import contrast_direction, steering_sweep

    root, model, tok, client = setup
    pos, neg = [torch.tensor(tok.encode("Lily saw a cat."))], [torch.tensor(tok.encode("The dog said hello."))]
    vector = contrast_direction(model, pos, neg, layer=0)
    for text, value in VALUES:
        cli = cli_accepts(["steer", "--checkpoint", "x", "--positive", "p", "--negative", "n", "--layer", "0",
                           "--coef", text])
        api = python_accepts(lambda: steering_sweep(model, vector, [value], pos, neg, pos))
        r = post(client, "/api/steer", {"positive": ["Lily saw a cat."], "negative": ["The dog said hello."],
                                            "layer": 0, "coefs": [value], "max_tokens": 2, "prompt": "Lily"})
        assert r.status_code in (200, 422), r.text
        assert cli == api == (r.status_code == 200), (text, cli, api, r.text)


def test_circuit_steps_and_edges_agree(setup):
    from circuitlab.analysis.edges.discovery import find_circuit, induction_rows

    root, model, tok, client = setup
    data = induction_rows(model.cfg.d_vocab, batch=2, half=4)
    for option, key in (("--steps", "steps"), ("--edges", "edges")):
        for text, value in VALUES:
            if option == "--steps" and isinstance(value, int) and not isinstance(value, bool) and value > 50:
                continue  # accepted by both; too slow to run here
            cli = cli_accepts(["circuit", "--checkpoint", "x", "--task", "induction", option, text])
            api = python_accepts(lambda: find_circuit(model, data, "logit-diff", "eap-ig", progress=False,
                                                      **{key: value}))
            r = post(client, "/api/circuits/run", {"task": "induction", "method": "eap-ig", key: value})
            assert r.status_code in (200, 422), r.text
            assert cli == api, (option, text, cli, api)
            assert r.status_code != 200 or cli, (option, text)


def test_dictionary_learning_rate_agrees_between_cli_config_and_python(tmp_path):
    """sae train's --set train.lr=TEXT (YAML), a config file and DictTrainConfig(lr=value) alike."""
    import yaml

    from circuitlab.dictionaries.train import DictTrainConfig
    from circuitlab.training.config import apply_override

    for text, value in VALUES:
        data: dict = {"train": {}}
        apply_override(data, f"train.lr={text}")  # what --set does
        via_set = python_accepts(lambda: DictTrainConfig.from_dict(data["train"]))
        (tmp_path / "c.yaml").write_text(f"train:\n  lr: {text}\n")
        via_file = python_accepts(lambda: DictTrainConfig.from_dict(yaml.safe_load((tmp_path / "c.yaml").read_text())["train"]))
        api = python_accepts(lambda: DictTrainConfig(lr=value))
        assert via_set == via_file, text
        if text not in ("true", "false"):  # YAML reads those as booleans: refused like True / False
            assert via_set == api, (text, via_set, api)
        assert via_set == (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                           and value > 0), text


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A model with transcoders and a saved graph (helpers.saved_graph_run), and the explorer serving them
    with a graph runner that only records what it was given (the explorer's own checks come first)."""
    import helpers

    root = tmp_path_factory.mktemp("agree-graphs")
    model, tok, tc, run = helpers.saved_graph_run(root)
    given = []
    client = TestClient(create_app(root / "model", graphs=root / "graphs", transcoders=root / "transcoders",
                                   graph_runner=lambda *a, **kw: given.append(kw)))
    return model, tok, tc, run, client


def test_graph_thresholds_and_feature_cap_agree(graphs):
    """`circuitlab graph`'s --node-threshold, --edge-threshold, --logit-prob and --max-feature-nodes, the
    Python API (Graph.prune, attribute) and the explorer's /api/graphs/compute, value by value."""
    from circuitlab.graphs import attribute

    model, tok, tc, run, client = graphs
    tokens = torch.tensor(tok.encode("Lily saw"))
    fields = [("--node-threshold", "node_threshold", lambda v: run.graph.prune(node_threshold=v)),
              ("--edge-threshold", "edge_threshold", lambda v: run.graph.prune(edge_threshold=v)),
              ("--logit-prob", None, lambda v: attribute(model, tc, tokens, desired_logit_prob=v)),
              ("--max-feature-nodes", "max_feature_nodes", lambda v: attribute(model, tc, tokens, max_feature_nodes=v))]
    for option, key, call in fields:
        for text, value in VALUES:
            cli = cli_accepts(["graph", "--planted", "--prompt", "x", option, text])
            api = python_accepts(lambda: call(value))
            assert cli == api, (option, text, cli, api)
            if key is None:
                continue
            r = post(client, "/api/graphs/compute", {"prompt": "Lily saw", key: value})
            assert r.status_code in (200, 422), r.text
            assert r.status_code != 200 or cli, (option, text, "the explorer accepts what the CLI refuses")
            if key != "max_feature_nodes":  # the explorer caps feature nodes at 4000 (it answers while you wait)
                assert (r.status_code == 200) == cli, (option, text)
    assert cli_accepts(["graph", "--planted", "--prompt", "x", "--node-threshold", "1", "--edge-threshold", "0.5"])


def test_graph_counts_and_causal_tracing_noise_agree(graphs):
    """--batch-size, --max-logits and --dashboard-tokens of `circuitlab graph`, and causal tracing's
    --noise-scale and --noise-samples, between the command line and the Python API."""
    from circuitlab.analysis.patching.noise import Noise
    from circuitlab.graphs.options import graph_options
    from circuitlab.graphs import attribute

    model, tok, tc, run, _ = graphs
    tokens = torch.tensor(tok.encode("Lily saw"))
    graph = [("--batch-size", lambda v: attribute(model, tc, tokens, batch_size=v)),
             ("--max-logits", lambda v: attribute(model, tc, tokens, max_n_logits=v)),
             ("--dashboard-tokens", lambda v: graph_options(dashboard_tokens=v))]
    trace = [("--noise-scale", lambda v: Noise(scale=v).check()), ("--noise-samples", lambda v: Noise(samples=v).check())]
    for option, call in graph + trace:
        for text, value in VALUES:
            argv = (["graph", "--planted", "--prompt", "x"] if (option, call) in graph else
                    ["interpret", "--checkpoint", "x", "--experiments", "causal_tracing"]) + [option, text]
            cli, api = cli_accepts(argv), python_accepts(lambda: call(value))
            assert cli == api, (option, text, cli, api)
    from circuitlab.methods.graph import graph_experiment

    with pytest.raises(CircuitlabError, match="dashboard_tokens"):   # the experiment checks it too
        graph_experiment(model, tc, "Lily saw", tok, dashboard_tokens=-1, progress=False)


def test_openapi_schema_answers(setup):
    r = setup[3].get("/api/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert {"/api/steer", "/api/attribute", "/api/circuit.svg", "/api/circuits/run"} <= set(paths)


def test_saelens_folder_written_without_sae_lens(tmp_path, monkeypatch):
    """Saving a SAELens-format folder reads no sae_lens (an optional peer): blocked, it still works."""
    import importlib.metadata
    import sys

    from circuitlab.dictionaries import DictionaryConfig, SparseDictionary
    from circuitlab.dictionaries.saelens import SAELENS_FORMAT, load_saelens, save_saelens

    monkeypatch.setitem(sys.modules, "sae_lens", None)  # `import sae_lens` raises ImportError

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    sae = SparseDictionary(DictionaryConfig("topk", d_in=8, d_sae=16, k=2, hook_name="blocks.0.hook_resid_pre"), seed=0)
    save_saelens(sae, tmp_path / "s")
    import json

    assert json.loads((tmp_path / "s" / "cfg.json").read_text())["metadata"]["sae_lens_version"] == SAELENS_FORMAT
    back = load_saelens(tmp_path / "s")
    torch.testing.assert_close(back.W_enc, sae.W_enc)
