"""The feature browser of `circuitlab serve --dictionary`: listing, paging, one feature's dashboard,
features on a prompt, and one-line errors (through FastAPI's test client, no server)."""
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from circuitlab import ModelConfig, Transformer  # noqa: E402
from circuitlab.data.stories import stories_text  # noqa: E402
from circuitlab.data.tokenizers import CharTokenizer  # noqa: E402
from circuitlab.dictionaries import DictionaryConfig, SparseDictionary, base_model_id  # noqa: E402
from circuitlab.dictionaries.features import feature_dashboards, text_batches  # noqa: E402
from circuitlab.errors import CircuitlabError  # noqa: E402
from circuitlab.serve import create_app  # noqa: E402
from circuitlab.training import save_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny run (char tokenizer that covers the built-in stories), an SAE on its hook_embed whose feature 0
    fires on the letter 'L' only, with saved dashboards, and a second SAE without (computed at start)."""
    root = tmp_path_factory.mktemp("features")
    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=64))
    save_checkpoint(root / "run" / "checkpoint", model, tokenizer)
    L = tokenizer.encode("L")[0]
    cfg = DictionaryConfig("relu", d_in=16, d_sae=24, hook_name="hook_embed", base_model=base_model_id(model))
    sae = SparseDictionary(cfg, seed=0)
    with torch.no_grad():
        E = model.W_E
        sae.W_enc[:, 0] = E[L] / E[L].pow(2).sum()
        sae.b_enc[0] = -0.9
    sae.save(root / "embed")
    dash = feature_dashboards(model, sae, text_batches(tokenizer, n_tokens=2048, seq_len=32), tokenizer=tokenizer)
    dash.save(root / "embed" / "dashboards")
    SparseDictionary(cfg.replace(hook_name="blocks.0.hook_resid_post"), seed=1).save(root / "resid")
    client = TestClient(create_app(root / "run", dictionaries=[root / "embed", root / "resid"]))
    return root, client, model


def test_dictionaries_are_listed_with_their_numbers(setup):
    _, client, _ = setup
    found = client.get("/api/dictionaries").json()["dictionaries"]
    assert [d["name"] for d in found] == ["embed", "resid"]
    assert found[0]["hook_name"] == "hook_embed" and found[0]["d_sae"] == 24 and found[0]["n_tokens"] == 2048
    assert "computed at start" in found[1]["dashboards_from"]
    assert client.get("/features").status_code == 200
    assert client.get("/static/features.js").status_code == 200


def test_pages_and_one_feature(setup):
    _, client, _ = setup
    page = client.get("/api/features", params={"dictionary": "embed", "page": 1, "per_page": 10}).json()
    assert page["pages"] == 3 and [f["feature"] for f in page["features"]] == list(range(10, 20))
    by_density = client.get("/api/features", params={"dictionary": "embed", "order": "density"}).json()["features"]
    densities = [f["density"] for f in by_density]
    assert densities == sorted(densities, reverse=True)
    f0 = client.get("/api/feature", params={"dictionary": "embed", "feature": 0}).json()
    assert f0["contexts"] and all(c["tokens"][c["at"]] == "L" for c in f0["contexts"])
    assert sum(f0["histogram"]["counts"]) > 0 and len(f0["logits"]["promoted"]) == 10


def test_prompt_shows_which_features_fire(setup):
    _, client, _ = setup
    r = client.post("/api/features/prompt", json={"dictionary": "embed", "prompt": "Lily and Lucy", "top": 3})
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["tokens"][0] == "L" and len(found["per_token"]) == len("Lily and Lucy")
    f0 = next(f for f in found["features"] if f["feature"] == 0)
    assert [a > 0 for a in f0["acts"]] == [c == "L" for c in "Lily and Lucy"]


def test_bad_requests_are_one_line_errors(setup):
    root, client, model = setup
    r = client.get("/api/features", params={"dictionary": "nope"})
    assert r.status_code == 422 and "unknown dictionary 'nope'" in r.json()["detail"]
    r = client.get("/api/features", params={"dictionary": "embed", "page": 9})
    assert r.status_code == 422 and "past the last page" in r.json()["detail"]
    r = client.get("/api/feature", params={"dictionary": "embed", "feature": 99})
    assert r.status_code == 422 and "not in these dashboards" in r.json()["detail"]
    r = client.post("/api/features/prompt", json={"dictionary": "embed", "prompt": "  "})
    assert r.status_code == 422 and "empty" in r.json()["detail"]
    bare = TestClient(create_app(root / "run"))
    assert bare.get("/api/dictionaries").json() == {"dictionaries": []}
    assert bare.get("/api/features", params={"dictionary": "embed"}).status_code == 409
    other = SparseDictionary(DictionaryConfig("relu", d_in=16, d_sae=8, hook_name="hook_embed",
                                              base_model={**base_model_id(model), "weights_sha": "0" * 16}))
    other.save(root / "other")
    with pytest.raises(CircuitlabError, match="not on this model"):
        create_app(root / "run", dictionaries=[root / "other"])
    with pytest.raises(CircuitlabError, match="needs --checkpoint"):
        create_app(None, dictionaries=[root / "embed"])


def test_feature_page_script_draws_the_browser(setup, tmp_path):
    """features.js run by node against a minimal fake DOM, with the API's real answers: it lists the
    dictionaries, a page of features, the first feature's contexts, and the features on a prompt."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    _, client, _ = setup
    prompt = client.post("/api/features/prompt", json={"dictionary": "embed", "prompt": "Lily and Lucy", "top": 5})
    answers = {"GET /api/dictionaries": client.get("/api/dictionaries").json(),
               "GET /api/features": client.get("/api/features", params={"dictionary": "embed"}).json(),
               "GET /api/feature": client.get("/api/feature", params={"dictionary": "embed", "feature": 0}).json(),
               "POST /api/features/prompt": prompt.json()}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    from circuitlab.serve.app import STATIC_DIR as static
    run = subprocess.run([node, str(Path(__file__).parents[1] / "js" / "features_smoke.js"), str(tmp_path / "answers.json"),
                          str(static)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    drawn = json.loads(run.stdout)
    assert drawn["rows"] == 20 and drawn["title"] == "Feature 0" and drawn["contexts"] == len(answers["GET /api/feature"]["contexts"])
    assert drawn["chips"] == len(prompt.json()["features"]) and drawn["tokens"].startswith("L|i|l|y")
    assert "hook_embed" in drawn["info"] and drawn["status"] == ""
