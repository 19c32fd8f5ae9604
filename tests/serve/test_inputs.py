"""Input attribution, the tuned lens and steering where users see them: `circuitlab interpret`'s results.json
and report.html, `circuitlab steer --out`'s report, and the /inputs page's API of `circuitlab serve`
(FastAPI's test client, no server)."""
import json
import re

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from circuitlab import ModelConfig, Transformer  # noqa: E402
from circuitlab.analysis.lens.tuned import TunedLens, story_batches, train_tuned_lens  # noqa: E402
from circuitlab.analysis.input_attribution import technique_names  # noqa: E402
from circuitlab.cli import main  # noqa: E402
from circuitlab.data.stories import stories_text  # noqa: E402
from circuitlab.data.tokenizers import CharTokenizer  # noqa: E402
from circuitlab.errors import CircuitlabError  # noqa: E402
from circuitlab.report import report_for_run  # noqa: E402
from circuitlab.serve import create_app  # noqa: E402
from circuitlab.serve.inputs import explorer_options  # noqa: E402
from circuitlab.training import save_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "Lily saw a cat. Lily"


def section_ids(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', page)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-layer model with a char tokenizer covering the built-in stories, saved as a run, and the
    output of `circuitlab interpret --experiments input_attribution tuned_lens` on it."""
    root = tmp_path_factory.mktemp("inputs")
    tokenizer = CharTokenizer.from_texts([stories_text(300, seed=1)])
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=2, d_vocab=tokenizer.vocab_size, n_ctx=64))
    save_checkpoint(root / "run" / "checkpoint", model, tokenizer)
    n = torch.get_num_threads()
    assert main(["interpret", "--checkpoint", str(root / "run"), "--experiments", "input_attribution", "tuned_lens",
                 "--prompt", PROMPT, "--out", str(root / "interp")]) == 0
    torch.set_num_threads(n)
    return root, model, tokenizer


def test_interpret_results_hold_every_method_and_both_lenses(run):
    root, model, tokenizer = run
    found = json.loads((root / "interp" / "results.json").read_text())
    methods = found["input_attribution"]["methods"]
    assert list(methods) == list(technique_names())
    n = len(tokenizer.encode(PROMPT))
    top2 = model(torch.tensor([tokenizer.encode(PROMPT)]))[0, -1].topk(2).indices.tolist()
    for m, d in methods.items():
        assert len(d["scores"]) == n and d["pos"] == n - 1
        assert d["target"] == (None if m == "context-mixing" else top2[0])
    assert methods["ig"]["foil"] == top2[1] and methods["ig"]["completeness_error"] < 1e-3
    shap = methods["shap"]  # efficiency: the Shapley values add up to the change from the mean-embedding baseline
    assert shap["samples"] == 1024 and shap["baseline"] == "mean"
    assert abs(sum(shap["scores"]) - (shap["metric_value"] - shap["baseline_value"])) < 1e-4
    assert methods["lime"]["kernel_width"] == 1.0 and "intercept" in methods["lime"]
    kl = found["tuned_lens"]["held_out_kl"]
    assert kl["labels"] == ["embed", "L0", "L1"] and kl["logit"][-1] == kl["tuned"][-1] == 0
    assert all(t < l for t, l in zip(kl["tuned"][:-1], kl["logit"][:-1]))  # the lens learned something
    assert "trained here for" in found["tuned_lens"]["summary"][0]


def test_report_shades_tokens_per_method_and_shows_both_lenses(run):
    root, _, _ = run
    page = (root / "interp" / "report.html").read_text()
    ids = section_ids(page)
    assert ids.index("tuned-lens") < ids.index("input-attribution")
    results = json.loads((root / "interp" / "results.json").read_text())
    attribution = page[page.index('<section id="input-attribution"'):]
    for method, d in results["input_attribution"]["methods"].items():
        assert f">{method}</span>" in attribution  # the line's label
        best = d["top"][0]
        # the most attributed token carries its exact score and the strongest shading of its line
        assert f'title="pos {best["pos"]}: {d["scores"][best["pos"]]:.4g}" style="background:rgba(' in attribution
    lens = page[page.index('<section id="tuned-lens"'):page.index('<section id="input-attribution"')]
    assert "Tuned lens: top-1 next token" in lens and "Logit lens: top-1 next token" in lens
    assert "KL to the model" in lens
    # rebuilt from results.json alone: the same sections
    assert section_ids(report_for_run(root / "interp", root / "again.html").read_text()) == ids


def test_interpret_uses_a_saved_lens_and_refuses_a_missing_one(run, capsys):
    root, model, tokenizer = run
    lens = train_tuned_lens(model, story_batches(tokenizer, n_batches=2, batch_size=4, seq_len=32), steps=5)
    lens.save(root / "saved_lens")
    out = root / "interp_saved"
    args = ["interpret", "--checkpoint", str(root / "run"), "--experiments", "tuned_lens", "--prompt", PROMPT]
    assert main([*args, "--lens", str(root / "saved_lens"), "--out", str(out)]) == 0
    found = json.loads((out / "results.json").read_text())["tuned_lens"]
    assert found["summary"][0].startswith("tuned lens loaded from") and found["train"]["steps"] == 5
    assert main([*args, "--lens", str(root / "nowhere"), "--out", str(root / "x")]) == 2
    assert "holds no tuned lens" in capsys.readouterr().err


def test_steer_writes_a_report_with_the_sweep(run, tmp_path):
    root, _, _ = run
    (tmp_path / "pos.txt").write_text("Lily saw a dragon.\nThe dragon flew.\n")
    (tmp_path / "neg.txt").write_text("Lily saw a cat.\nThe cat sat.\n")
    assert main(["steer", "--checkpoint", str(root / "run"), "--positive", str(tmp_path / "pos.txt"),
                 "--negative", str(tmp_path / "neg.txt"), "--layer", "1", "--coef", "0", "1", "3", "--samples", "2",
                 "--max-tokens", "4", "--out", str(tmp_path / "steer")]) == 0
    page = (tmp_path / "steer" / "report.html").read_text()
    found = json.loads((tmp_path / "steer" / "steering.json").read_text())
    assert section_ids(page) == ["steering"] and "blocks.1.hook_resid_pre" in page
    table = page[page.index("<table><thead><tr><th>coefficient"):]
    assert table[:table.index("</table>")].count("<tr>") == 4  # header + one row per coefficient
    assert f'{found["preference"][2]:.4g}' in table and "Plotly.newPlot(" in page


# ---------------------------------------------------------------------------- serve: /inputs


@pytest.fixture(scope="module")
def client(run):
    root, _, _ = run
    return TestClient(create_app(root / "run"))


def test_attribute_endpoint_all_methods_and_one(client, run):
    _, model, tokenizer = run
    assert client.get("/inputs").status_code == 200 and client.get("/static/inputs.js").status_code == 200
    found = client.post("/api/attribute", json={"prompt": PROMPT}).json()
    assert found["tokens"] == list(PROMPT) and list(found["methods"]) == list(technique_names())
    top = int(model(torch.tensor([tokenizer.encode(PROMPT)]))[0, -1].argmax())
    assert found["target"]["id"] == top and found["foil"] is None
    ig = found["methods"]["ig"]
    assert len(ig["scores"]) == len(PROMPT) and ig["completeness_error"] < 1e-3
    assert len(found["methods"]["context-mixing"]["per_layer"]) == 2
    one = client.post("/api/attribute", json={"prompt": PROMPT, "target": "a", "foil": "b", "method": "occlusion"}).json()
    assert list(one["methods"]) == ["occlusion"] and one["target"]["token"] == "a" and one["foil"]["token"] == "b"
    few = client.post("/api/attribute", json={"prompt": PROMPT, "method": "ig", "steps": 2}).json()
    assert few["methods"]["ig"]["steps"] == 2
    for body in ({"method": "shap", "samples": 100, "seed": 3, "baseline": "delete"},
                 {"method": "lime", "samples": 50, "kernel_width": 0.5, "baseline": 3}):
        r = client.post("/api/attribute", json={"prompt": PROMPT, **body}).json()["methods"][body["method"]]
        assert r["samples"] == body["samples"] and len(r["scores"]) == len(PROMPT) and "coalitions" in r["summary"]
        assert r["baseline"] == ("delete" if body["method"] == "shap" else "token 3")
    # the same seed draws the same coalitions: the same scores as the Python API
    from circuitlab.analysis.input_attribution import kernel_shap

    served = client.post("/api/attribute", json={"prompt": PROMPT, "method": "shap", "samples": 80, "seed": 5}).json()
    direct = kernel_shap(model, torch.tensor(tokenizer.encode(PROMPT)), target=served["target"]["id"], samples=80,
                         seed=5, progress=False)
    assert served["methods"]["shap"]["scores"] == pytest.approx(direct.scores.tolist(), abs=1e-5)


@pytest.mark.parametrize("body, message", [
    ({"prompt": PROMPT, "target": "a", "foil": "a"}, "the foil is the target"),
    ({"prompt": PROMPT, "foil": "ab"}, "unknown foil token 'ab'"),
    ({"prompt": PROMPT, "method": "magic"}, "method"),
    ({"prompt": PROMPT, "steps": 0}, "steps must be a whole number from 1 to 256"),
    ({"prompt": PROMPT, "method": "shap", "samples": 0}, "samples must be a whole number from 3 to 8192"),
    ({"prompt": PROMPT, "method": "shap", "samples": 10 ** 9}, "samples must be a whole number from 3 to 8192 (the"),
    ({"prompt": PROMPT, "method": "lime", "baseline": 10 ** 6}, "the baseline token must be a token id in [0, "),
    ({"prompt": PROMPT, "method": "lime", "kernel_width": 0}, "kernel_width must be a finite number > 0"),
    ({"prompt": PROMPT, "method": "lime", "kernel_width": -2.5}, "kernel_width must be a finite number > 0"),
    ({"prompt": PROMPT, "method": "shap", "seed": -1}, "seed must be a whole number from 0"),
    ({"prompt": PROMPT, "method": "shap", "baseline": "ones"}, "baseline"),
    ({"prompt": ""}, "the prompt is empty"),
])
def test_attribute_endpoint_bad_input_is_one_line(client, body, message):
    r = client.post("/api/attribute", json=body)
    assert r.status_code == 422 and message in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_lens_endpoint_with_and_without_a_tuned_lens(client, run, tmp_path):
    root, model, tokenizer = run
    plain = client.post("/api/lens", json={"prompt": PROMPT}).json()
    assert plain["labels"] == ["embed", "L0", "L1"] and not plain["tuned_available"] and "tuned" not in plain
    assert len(plain["logit"]["top"][0]) == len(PROMPT) and plain["logit"]["mean_kl"][-1] == 0
    lens = train_tuned_lens(model, story_batches(tokenizer, n_batches=2, batch_size=4, seq_len=32), steps=20)
    lens.save(tmp_path / "lens")
    with_lens = TestClient(create_app(root / "run", lens=tmp_path / "lens"))
    both = with_lens.post("/api/lens", json={"prompt": PROMPT}).json()
    assert both["tuned_available"] and both["tuned_train"]["steps"] == 20
    assert both["logit"] == plain["logit"] and both["tuned"]["mean_kl"] != plain["logit"]["mean_kl"]
    with pytest.raises(CircuitlabError, match="holds no tuned lens"):
        create_app(root / "run", lens=tmp_path / "nothing")
    with pytest.raises(CircuitlabError, match="needs --checkpoint"):
        create_app(None, lens=tmp_path / "lens")


def test_steer_endpoint(client):
    body = {"positive": ["Lily saw a dragon."], "negative": ["Lily saw a cat.", ""], "layer": 1,
            "coefs": [0, 4], "prompt": "Once", "max_tokens": 5}
    found = client.post("/api/steer", json=body).json()
    assert found["hook_name"] == "blocks.1.hook_resid_pre" and found["coefs"] == [0.0, 4.0]
    assert len(found["generations"]) == 2 and found["loss_cost"][0] == 0
    assert found["preference"][1] != found["preference"][0]
    for change, message in [({"layer": 5}, "layer 5 is out of range"), ({"positive": [" "]}, "positive prompt set is empty"),
                            ({"coefs": []}, "coefficients")]:
        r = client.post("/api/steer", json={**body, **change})
        assert r.status_code == 422 and message in r.json()["detail"]


def test_lens_command_trains_refuses_to_overwrite_and_shows(run, tmp_path, capsys):
    root, _, _ = run
    ckpt = str(root / "run")
    train = ["lens", "train", "--checkpoint", ckpt, "--out", str(tmp_path / "lens"), "--steps", "6", "--batches", "2",
             "--batch-size", "4", "--seq-len", "32", "--no-progress"]
    assert main(train) == 0
    out = capsys.readouterr().out
    assert "L0" in out and "tuned lens" in out and TunedLens.exists(tmp_path / "lens")
    assert not (tmp_path / "lens" / "training_state.safetensors").exists()
    saved = TunedLens.load(tmp_path / "lens")
    assert saved.train_info["steps"] == 6 and saved.train_info["batch_size"] == 4
    assert main(train) == 2 and "already holds a tuned lens" in capsys.readouterr().err
    assert main([*train, "--resume"]) == 2 and "nothing to resume" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's one-line refusal: the rule of circuitlab.checks
        main([*train, "--steps", "0", "--overwrite"])
    assert exited.value.code == 2 and "argument --steps: must be a whole number >= 1" in capsys.readouterr().err
    (tmp_path / "text.txt").write_text(stories_text(20, seed=3))
    text = [*train[:5], str(tmp_path / "text_lens"), *train[6:], "--text", str(tmp_path / "text.txt")]
    assert main(text) == 0 and TunedLens.load(tmp_path / "text_lens").train_info["data"].endswith("text.txt")
    (tmp_path / "short.txt").write_text("Lily")
    assert main([*text[:-1], str(tmp_path / "short.txt"), "--overwrite"]) == 2
    assert "one batch needs 128" in capsys.readouterr().err
    assert main(["lens", "show", "--checkpoint", ckpt, "--lens", str(tmp_path / "lens"), "--prompt", PROMPT,
                 "--out", str(tmp_path / "show.html")]) == 0
    out = capsys.readouterr().out
    assert "tuned lens KL" in out and "logit lens | tuned lens" in out
    assert section_ids((tmp_path / "show.html").read_text()) == ["tuned-lens"]
    assert main(["lens", "show", "--checkpoint", ckpt, "--prompt", PROMPT]) == 2  # none at <checkpoint>/tuned_lens
    assert "holds no tuned lens; train one with `circuitlab lens train" in capsys.readouterr().err


def test_inputs_page_script_draws_attribution_lens_and_steering(run, tmp_path):
    """inputs.js run by node against a minimal fake DOM (tests/js/fake_dom.js) with the API's real
    answers: one shaded line per method, the lens table with both lenses, a steering row per coefficient."""
    import shutil
    import subprocess
    from pathlib import Path

    from circuitlab.serve.app import STATIC_DIR

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    root, model, tokenizer = run
    train_tuned_lens(model, story_batches(tokenizer, n_batches=1, batch_size=2, seq_len=16), steps=2).save(tmp_path / "l")
    client = TestClient(create_app(root / "run", lens=tmp_path / "l"))
    answers = {"GET /api/model": client.get("/api/model").json(),
               "GET /api/attribute/form": client.get("/api/attribute/form").json(),
               "POST /api/attribute": client.post("/api/attribute", json={"prompt": PROMPT}).json(),
               "POST /api/lens": client.post("/api/lens", json={"prompt": PROMPT}).json(),
               "POST /api/steer": client.post("/api/steer", json={"positive": ["a dragon"], "negative": ["a cat"],
                                                                 "layer": 1, "coefs": [0, 2], "prompt": "Once"}).json()}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    done = subprocess.run([node, str(Path(__file__).parents[1] / "js" / "inputs_smoke.js"), str(tmp_path / "answers.json"),
                           str(STATIC_DIR)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    drawn = json.loads(done.stdout)
    methods = list(technique_names())
    assert [line[:len(m)] for line, m in zip(drawn["lines"], methods)] == methods
    # the form, drawn from GET /api/attribute/form: every technique, an input per option, the defaults sent
    assert drawn["methods"] == ["all", *methods] and drawn["baselines"] == ["mean", "zeros", "eos", "delete"]
    assert "shap/lime samples" in drawn["options"] and "ig steps" in drawn["options"]
    assert drawn["sent"][0] == {"prompt": PROMPT, "method": "all", "baseline": "mean",
                                **{k: v for k, v in explorer_options()().to_dict().items()}}
    assert "1024 coalitions, mean baseline, surrogate R²" in drawn["lines"][5]
    assert "completeness error" in drawn["lines"][0] and drawn["lines"][0].endswith("Lily·saw·a·cat.·Lily")
    assert len(drawn["lensRows"]) == 3 and drawn["lensRows"][0].startswith("embed") and "KL" in drawn["note"]
    assert len(drawn["steerRows"]) == 2 and drawn["status"] == "" and "2 layers" in drawn["info"]
