"""The circuit browser of `circuitlab serve --circuit`: a saved `circuitlab circuit` folder, discovery on the
loaded model, the drawing as an image, and one-line errors (through FastAPI's test client, no server)."""
import xml.dom.minidom

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from circuitlab import CircuitlabError  # noqa: E402
from circuitlab.analysis.edges import find_circuit, induction_rows  # noqa: E402
from circuitlab.data.tokenizers import CharTokenizer  # noqa: E402
from circuitlab.experiments.circuit import write_circuit_outputs  # noqa: E402
from circuitlab.forge import build_induction_model  # noqa: E402
from circuitlab.serve import create_app  # noqa: E402
from circuitlab.training import save_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A run holding the hand-built induction model (char tokenizer over its 20 tokens) and a saved circuit
    of it: EAP-IG on the built-in induction task."""
    root = tmp_path_factory.mktemp("circuits")
    model = build_induction_model(d_vocab=20, n_ctx=32).model
    tokenizer = CharTokenizer.from_texts(["abcdefghijklmnopqrst"])
    assert tokenizer.vocab_size >= 20
    save_checkpoint(root / "run" / "checkpoint", model, tokenizer)
    result = find_circuit(model, induction_rows(20, batch=8, half=8), "logit-diff", "eap-ig", progress=False)
    write_circuit_outputs(result, root / "induction")
    client = TestClient(create_app(root / "run", circuits=[root / "induction"]))
    return root, client, result


def test_a_saved_circuit_is_listed_shown_and_drawn(setup):
    _, client, result = setup
    listed = client.get("/api/circuits").json()
    assert listed["can_run"] and [c["name"] for c in listed["circuits"]] == ["induction"]
    assert listed["circuits"][0]["n_edges"] == result.circuit.n_edges
    shown = client.get("/api/circuit", params={"name": "induction"}).json()
    assert shown["summary"] == result.summary() and shown["method"] == "eap-ig"
    assert [tuple(e[:2]) for e in shown["circuit"]["edges"]] == result.circuit.edge_list()
    assert [tuple(e[:2]) for e in shown["top_edges"][:5]] == [e[:2] for e in result.scores.top(5)]
    assert shown["faithfulness"]["faithfulness"][-1] == pytest.approx(1.0)
    svg = client.get("/api/circuit.svg", params={"name": "induction"})
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert len(xml.dom.minidom.parseString(svg.text).getElementsByTagName("path")) == result.circuit.n_edges
    page = client.get("/circuits")
    assert page.status_code == 200 and "/static/circuits.js" in page.text
    assert "/api/circuits/run" in client.get("/static/circuits.js").text


def test_discovery_runs_on_the_loaded_model(setup):
    _, client, _ = setup
    r = client.post("/api/circuits/run", json={"task": "induction", "corruption": "no-repeat", "method": "exact",
                                               "edges": 5})
    assert r.status_code == 200, r.text
    found = r.json()
    # the hand-built circuit: previous-token head -> induction head's key, query and value from the input
    assert {tuple(e[:2]) for e in found["circuit"]["edges"]} == {
        ("input", "L0H0.v"), ("L0H0", "L1H0.k"), ("input", "L1H0.q"), ("input", "L1H0.v"), ("L1H0", "logits")}
    assert found["name"] in [c["name"] for c in client.get("/api/circuits").json()["circuits"]]
    assert client.get("/api/circuit.svg", params={"name": found["name"]}).status_code == 200
    pairs = client.post("/api/circuits/run", json={"clean": ["abcab"], "corrupt": ["abcad"], "method": "eap",
                                                   "metric": "kl"})
    assert pairs.status_code == 200 and pairs.json()["name"].endswith("1 prompt pair, eap")


@pytest.mark.parametrize("method, path, body, message", [
    ("get", "/api/circuit?name=nope", None, "unknown circuit 'nope'"),
    ("get", "/api/circuit.svg?name=nope", None, "unknown circuit 'nope'"),
    ("post", "/api/circuits/run", {"method": "acdc"}, "method"),
    ("post", "/api/circuits/run", {"edges": 0}, "edges must be a whole number >= 1"),
    ("post", "/api/circuits/run", {"clean": ["abc"], "corrupt": ["abcd"]}, "same token length"),
    ("post", "/api/circuits/run", {"clean": ["abc"]}, "give both clean and corrupt"),
])
def test_bad_requests_are_one_line_errors(setup, method, path, body, message):
    _, client, _ = setup
    r = client.get(path) if method == "get" else client.post(path, json=body)
    assert r.status_code == 422 and message in r.json()["detail"], r.text


def test_without_a_model_saved_circuits_show_and_discovery_says_why_not(setup, tmp_path, monkeypatch):
    root, _, _ = setup
    client = TestClient(create_app(None, circuits=[root / "induction"]))
    assert client.get("/api/circuits").json()["can_run"] is False
    assert client.get("/api/circuit", params={"name": "induction"}).status_code == 200
    r = client.post("/api/circuits/run", json={})
    assert r.status_code == 409 and "--checkpoint" in r.json()["detail"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(CircuitlabError, match="not a `circuitlab circuit` output folder"):
        create_app(None, circuits=[tmp_path / "empty"])
    from circuitlab.serve import circuits

    monkeypatch.setattr(circuits, "MAX_EXACT_EDGES", 10)
    big = TestClient(create_app(root / "run"))
    r = big.post("/api/circuits/run", json={"method": "exact"})
    assert r.status_code == 422 and "too slow for the server" in r.json()["detail"]


def test_serve_command_takes_circuit_folders(tmp_path, capsys):
    from circuitlab.cli import main

    rc = main(["serve", "--circuit", str(tmp_path), "--port", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not a `circuitlab circuit` output folder" in err and len(err.splitlines()) == 1
