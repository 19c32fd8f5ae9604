"""`circuitlab serve`: the JSON API through FastAPI's test client (no server), bad inputs included,
and the command's checks before it starts a server."""
import socket

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")  # fastapi.testclient needs it

from fastapi.testclient import TestClient  # noqa: E402

from circuitlab import ModelConfig, Transformer  # noqa: E402
from circuitlab.cli import main  # noqa: E402
from circuitlab.data.tokenizers import CharTokenizer  # noqa: E402
from circuitlab.serve import create_app  # noqa: E402
from circuitlab.training import save_checkpoint  # noqa: E402

TEXT = "the cat sat on the mat. a dog ran to the park, then the dog sat."
N_LAYERS, N_HEADS, N_CTX = 2, 2, 32


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny trained-format run: char tokenizer, 2 layers x 2 heads, LayerNorm and MLPs."""
    tokenizer = CharTokenizer.from_texts([TEXT])
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=N_LAYERS, d_model=16, n_heads=N_HEADS, d_vocab=tokenizer.vocab_size, n_ctx=N_CTX)
    path = tmp_path_factory.mktemp("serve") / "run"
    save_checkpoint(path / "checkpoint", Transformer(cfg), tokenizer)
    return path


@pytest.fixture(scope="module")
def client(run_dir):
    return TestClient(create_app(run_dir, max_prompt_chars=60, max_tokens=40))


@pytest.fixture(scope="module")
def tokenizer():
    return CharTokenizer.from_texts([TEXT])


def test_model_info_has_config_limits_and_a_label_list_per_head(client):
    r = client.get("/api/model")
    assert r.status_code == 200
    info = r.json()
    assert info["loaded"] and info["checkpoint"].endswith("/run")
    assert info["config"]["n_layers"] == N_LAYERS and info["config"]["n_heads"] == N_HEADS
    assert [h["name"] for h in info["heads"]] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert all(isinstance(h["labels"], list) for h in info["heads"])
    # max_tokens is capped by the model's context
    assert info["limits"]["max_tokens"] == N_CTX and info["limits"]["max_prompt_chars"] == 60


def test_analyse_shapes_match_the_model_and_the_tokenizer(client, tokenizer):
    prompt = "the dog sat on the mat"
    r = client.post("/api/analyse", json={"prompt": prompt})
    assert r.status_code == 200, r.text
    found = r.json()
    ids = tokenizer.encode(prompt)
    T = len(ids)
    assert [t["id"] for t in found["tokens"]] == ids
    assert "".join(t["text"] for t in found["tokens"]) == prompt
    patterns = torch.tensor(found["attention"]["patterns"])
    assert patterns.shape == (N_LAYERS, N_HEADS, T, T)
    assert found["attention"]["heads"] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert torch.allclose(patterns.sum(-1), torch.ones(N_LAYERS, N_HEADS, T), atol=1e-3)
    assert float(patterns.triu(1).abs().max()) == 0.0  # causal
    assert set(found["head_labels"]) == {"L0H0", "L0H1", "L1H0", "L1H1"}

    lens = found["logit_lens"]
    assert lens["labels"] == ["embed", "L0", "L1"]
    assert torch.tensor(lens["top_probs"]).shape == (N_LAYERS + 1, T, lens["k"])
    assert len(lens["top_strs"]) == N_LAYERS + 1 and len(lens["top_strs"][0]) == T

    dla = found["dla"]
    labels = [c["component"] for c in dla["components"]]
    assert labels == ["embed", "pos_embed", "L0H0", "L0H1", "L0 MLP", "L1H0", "L1H1", "L1 MLP", "biases"]
    total = sum(c["attribution"] for c in dla["components"]) + dla["constant"]
    assert total == pytest.approx(dla["logit"], abs=1e-3)
    assert dla["position"] == T - 1
    assert dla["target"]["id"] == dla["predictions"][0]["id"]  # default: the top prediction


def test_dla_for_a_chosen_target_by_text_or_id(client, tokenizer):
    by_text = client.post("/api/analyse", json={"prompt": "the cat", "target": "t"}).json()["dla"]
    assert by_text["target"] == {"id": tokenizer.encode("t")[0], "token": "t"}
    by_id = client.post("/api/analyse", json={"prompt": "the cat", "target": tokenizer.encode("d")[0],
                                              "position": 2}).json()["dla"]
    assert by_id["target"]["token"] == "d" and by_id["position"] == 2
    assert by_text["logit"] != by_id["logit"]


def test_analyse_can_return_plotly_figures(client):
    found = client.post("/api/analyse", json={"prompt": "the cat", "figures": True}).json()
    figures = found["figures"]
    assert set(figures) == {"attention", "logit_lens", "attribution"}
    assert len(figures["attention"]["data"]) == N_LAYERS * N_HEADS  # one heatmap per head
    assert all("data" in f and "layout" in f for f in figures.values())
    assert "figures" not in client.post("/api/analyse", json={"prompt": "the cat"}).json()


def test_adder_17_plus_25_and_where_eos_attends(client):
    r = client.get("/api/adder", params={"a": 17, "b": 25})
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["result"] == 42 and found["correct"] and found["design"] == "post"
    assert found["tokens"] == ["1", "7", "2", "5", "EOS"] and found["eos_position"] == 4
    assert found["coordinates"] == ["acc", "digit", "sign"]
    assert [s["label"] for s in found["stages"]] == ["embedding", "after layer 0", "after layer 1"]
    assert found["stages"][-1]["residual"][4] == pytest.approx([12, 3, 1], abs=1e-3)
    eos = {a["name"]: a["eos"] for a in found["attention"]}
    assert eos["L0H0"] == pytest.approx([0, 0.5, 0, 0.5, 0], abs=1e-3)      # the units digits
    assert eos["L1H0"] == pytest.approx([1 / 3, 0, 1 / 3, 0, 1 / 3], abs=1e-3)  # the tens digits and itself
    carry = client.post("/api/adder", json={"a": "999", "b": 1, "design": "carry", "digits": 3}).json()
    assert carry["result"] == 1000 and carry["correct"] and carry["answer_tokens"] == [1, 0, 0, 0]
    assert len(carry["coordinates"]) == len(carry["stages"][0]["residual"][0])


BAD_REQUESTS = [
    ("post", "/api/analyse", {"json": {"prompt": ""}}, 422, "empty"),
    ("post", "/api/analyse", {"json": {"prompt": "   "}}, 422, "empty"),
    ("post", "/api/analyse", {"json": {"prompt": "the " * 20}}, 422, "characters; the limit is 60"),
    ("post", "/api/analyse", {"json": {"prompt": "the mat " * 5}}, 422, "tokens; the limit is 32"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "target": "zz"}}, 422, "unknown target token"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "target": "Q"}}, 422, "unknown target token"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "target": ""}}, 422, "target token is empty"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "target": 10_000}}, 422, "outside the vocabulary"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "target": True}}, 422, "target: should be a valid integer or a valid string"),
    ("post", "/api/analyse", {"json": {"prompt": "the cat", "position": 7}}, 422, "outside the prompt"),
    ("post", "/api/analyse", {"json": {"prompt": "ZZZ"}}, 422, "not in the char tokenizer"),
    ("post", "/api/analyse", {"json": {"prompt": 5}}, 422, "prompt: Input should be a valid string"),
    ("post", "/api/analyse", {"json": ["the cat"]}, 422, "JSON object"),
    ("post", "/api/analyse", {"json": {}}, 422, "prompt: Field required"),
    ("post", "/api/analyse", {"json": {"prompt": "the", "extra": 1}}, 422, "extra"),
    ("post", "/api/analyse", {}, 422, "JSON body"),
    ("post", "/api/analyse", {"content": b"{not json", "headers": {"content-type": "application/json"}},
     422, "not valid JSON"),
    ("post", "/api/analyse", {"content": b"x" * 70_000, "headers": {"content-type": "application/json"}},
     413, "the limit is 65536"),
    ("get", "/api/analyse", {}, 405, "Method Not Allowed"),
    ("get", "/api/adder", {"params": {"a": "1x", "b": 2}}, 422, "whole number"),
    ("get", "/api/adder", {"params": {"a": "1.5", "b": 2}}, 422, "whole number"),
    ("get", "/api/adder", {"params": {"a": 100, "b": 2}}, 422, "2-digit"),
    ("get", "/api/adder", {"params": {"a": -1, "b": 2}}, 422, "negative"),
    ("get", "/api/adder", {"params": {"a": 1}}, 422, "b: Field required"),
    ("get", "/api/adder", {"params": {"a": 1, "b": 2, "design": "magic"}}, 422, "design"),
    ("get", "/api/adder", {"params": {"a": 1, "b": 2, "design": "carry", "digits": 99}}, 422, "digits"),
    ("get", "/api/adder", {"params": {"a": 1, "b": 2, "digits": 3}}, 422, "2-digit numbers"),
    ("post", "/api/adder", {"json": {"a": 1.5, "b": 2}}, 422, "a: should be"),
    ("post", "/api/adder", {"json": {"a": [1], "b": 2}}, 422, "a: should be"),
    ("get", "/api/nothing", {}, 404, "Not Found"),
]


@pytest.mark.parametrize("method, path, kwargs, status, message", BAD_REQUESTS,
                         ids=[f"{m} {p} {i}" for i, (m, p, *_rest) in enumerate(BAD_REQUESTS)])
def test_bad_input_is_a_4xx_with_a_json_message(client, method, path, kwargs, status, message):
    r = getattr(client, method)(path, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    detail = r.json()["detail"]
    assert isinstance(detail, str) and message in detail


@pytest.mark.parametrize("path", ["/static/../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd",
                                  "/static/..%2f..%2fetc%2fpasswd", "/static/%2Fetc%2Fpasswd",
                                  "/static/app.py", "/static/../app.py", "/static/index.html/..", "/../../etc/passwd",
                                  "/static/", "/static/.%2e/serve.py"])
def test_static_route_serves_only_its_named_files(client, path):
    r = client.get(path)
    assert r.status_code == 404, (path, r.status_code)
    assert r.json()["detail"] and "root:" not in r.text and "import" not in r.text


def test_pages_and_static_files(client):
    for path, marker in [("/", 'id="prompt"'), ("/adder", 'id="adder-form"'), ("/static/explorer.js", "data-head"),
                         ("/static/style.css", ".token"), ("/static/common.js", "const cl =")]:
        r = client.get(path)
        assert r.status_code == 200 and marker in r.text, path
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'self'" in r.headers["content-security-policy"]
    js = client.get("/static/plotly.min.js")  # from the installed plotly package: the page works offline
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert len(js.content) > 1_000_000 and b"plotly" in js.content[:2000].lower()


def test_without_a_checkpoint_the_adder_works_and_the_explorer_says_why_not():
    client = TestClient(create_app(None))
    info = client.get("/api/model").json()
    assert info["loaded"] is False and "--checkpoint" in info["message"]
    r = client.post("/api/analyse", json={"prompt": "hello"})
    assert r.status_code == 409 and "no model loaded" in r.json()["detail"]
    assert client.post("/api/adder", json={"a": 99, "b": 99}).json()["result"] == 198
    assert client.get("/").status_code == 200


def test_an_unexpected_error_is_a_json_500_not_a_traceback(run_dir, monkeypatch):
    from circuitlab.serve import prompt as prompt_page

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(prompt_page, "analyse_prompt", broken)
    client = TestClient(create_app(run_dir), raise_server_exceptions=False)
    r = client.post("/api/analyse", json={"prompt": "the cat"})
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert r.json()["detail"].startswith("internal error (RuntimeError)")
    assert "secret" not in r.text and "Traceback" not in r.text


def test_host_header_check_when_bound_to_loopback():
    client = TestClient(create_app(None, allowed_hosts=["127.0.0.1", "localhost"]), base_url="http://127.0.0.1:8000")
    assert client.get("/api/adder", params={"a": 1, "b": 2}).status_code == 200
    r = client.get("/api/adder", params={"a": 1, "b": 2}, headers={"host": "evil.example:8000"})
    assert r.status_code == 400 and "Host" in r.json()["detail"]


def test_create_app_refuses_a_missing_or_corrupt_checkpoint(tmp_path, run_dir):
    from circuitlab.errors import CircuitlabError

    with pytest.raises(CircuitlabError, match="not found"):
        create_app(tmp_path / "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((run_dir / "checkpoint" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CircuitlabError, match="corrupt"):
        create_app(broken)
    with pytest.raises(CircuitlabError, match="max_tokens"):
        create_app(None, max_tokens=0)


def test_serve_command_errors_before_starting_a_server(tmp_path, capsys):
    assert main(["serve", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be" in capsys.readouterr().err


# ---------------------------------------------------------------------------- ServeOptions: the flags, declared once


def serve_parser():
    import argparse

    from circuitlab.commands import serve as serve_command

    p = argparse.ArgumentParser(exit_on_error=False)
    serve_command.add_arguments(p)
    return p


def test_the_serve_flags_the_class_and_a_config_agree(tmp_path, monkeypatch):
    """Every flag is a field of ServeOptions; no flag given is the class's defaults (and a config's), create_app's
    keyword defaults are the class's; the repeatable flags and --device read the class's defaults."""
    import inspect
    from dataclasses import fields, replace

    from circuitlab.serve.app import ServeOptions

    p = serve_parser()
    assert {a.dest for a in p._actions} - {"help"} == {f.name for f in fields(ServeOptions)}
    args = p.parse_args([])
    defaults = ServeOptions().check()
    assert ServeOptions.from_args(args) == defaults == ServeOptions.from_dict({})
    assert (defaults.host, defaults.port, defaults.max_tokens, defaults.max_prompt_chars) == ("127.0.0.1", 8000, 128,
                                                                                              2000)
    assert (args.dictionaries, args.circuits, args.device) == ([], [], ServeOptions.device)
    keywords = inspect.signature(create_app).parameters
    for name in ("max_tokens", "max_prompt_chars", "device"):
        assert keywords[name].default == getattr(ServeOptions, name), name
    got = ServeOptions.from_args(p.parse_args(["--model", "ck", "--lens", "l", "--graphs", "g", "--transcoders", "t",
                                               "--transcoder-set", "s", "--host", "0.0.0.0", "--port", "9",
                                               "--max-tokens", "7", "--max-prompt-chars", "70"]))
    assert got == ServeOptions(checkpoint="ck", lens="l", graphs="g", transcoders="t", transcoder_set="s",
                               host="0.0.0.0", port=9, max_tokens=7, max_prompt_chars=70)
    assert ServeOptions.from_dict(got.to_dict()) == got
    monkeypatch.chdir(tmp_path)   # no runs/ folder: /graphs lists none; with one, runs/
    assert replace(got, graphs=None).given()["graphs"] is None
    (tmp_path / "runs").mkdir()
    assert replace(got, graphs=None).given() == {"dictionaries": [], "lens": "l", "circuits": [], "graphs": "runs",
                                                 "transcoders": "t", "transcoder_set": "s"}


@pytest.mark.parametrize("flag, field, value, said", [
    ("--port", "port", 0, "must be from 1 to 65535, got 0"),
    ("--port", "port", 70000, "must be from 1 to 65535, got 70000"),
    ("--max-tokens", "max_tokens", 0, "must be a positive whole number, got 0"),
    ("--max-prompt-chars", "max_prompt_chars", -1, "must be a positive whole number, got -1"),
])
def test_a_bad_serve_value_is_refused_by_the_command_line_check_and_create_app_alike(capsys, flag, field, value,
                                                                                        said):
    """One rule, one line: the command line (the port under its flag's name), check(), a config, create_app."""
    import re

    from circuitlab.errors import CircuitlabError, ConfigError, InputError
    from circuitlab.serve.app import ServeOptions

    assert main(["serve", flag, str(value)]) == 2
    named = flag if field == "port" else field
    assert capsys.readouterr().err == f"circuitlab serve: error: {named} {said}\n"
    with pytest.raises(InputError, match=f"^{field} {re.escape(said)}$"):
        ServeOptions(**{field: value}).check()
    with pytest.raises(ConfigError, match=f"^{field} {re.escape(said)}$"):
        ServeOptions.from_dict({field: value})
    if field != "port":
        with pytest.raises(CircuitlabError, match=f"^{field} {re.escape(said)}$"):
            create_app(None, **{field: value})
