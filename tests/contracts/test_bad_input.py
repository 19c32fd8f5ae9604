"""One line for every bad input: each CLI case (run in-process through circuitlab.cli.main) exits 2 with one
line on stderr naming the problem and no traceback; each explorer request gets a 4xx JSON answer; each
Python API call raises a CircuitlabError subclass. Tiny models, built once for the module."""
import errno
import json

import pytest
import torch
from fastapi.testclient import TestClient

import circuitlab.atomic as atomic
from circuitlab import ModelConfig, Transformer
from circuitlab.cli import main
from circuitlab.data.tokenizers import ByteTokenizer, CharTokenizer
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.model.sampling import sample_next
from circuitlab.serve import create_app
from circuitlab.training import RunConfig, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "Once upon a time, Lily saw a cat. The cat was happy. Lily said hello to the cat."
N_CTX = 24


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    """Paths the cases refer to as {run}, {bytes}, {notok}, {file}, {tmp}, {prompts}, {config_*}."""
    root = tmp_path_factory.mktemp("bad_input")
    torch.manual_seed(0)
    char = CharTokenizer.from_texts([TEXT])
    save_checkpoint(root / "run" / "checkpoint",
                    Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=char.vocab_size, n_ctx=N_CTX)),
                    char)
    byte = ByteTokenizer()
    save_checkpoint(root / "bytes" / "checkpoint",
                    Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=byte.vocab_size, n_ctx=N_CTX)),
                    byte)
    save_checkpoint(root / "notok" / "checkpoint",  # an imported model without its tokenizer
                    Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_vocab=30, n_ctx=N_CTX)))
    (root / "afile").write_text("not a folder")
    (root / "prompts.txt").write_text("Lily saw\nthe cat\n")
    for name, text in (("train5", "train: 5\n"), ("data_list", "data: [1, 2]\n"), ("model5", "model: 5\n"),
                       ("a_list", "- 1\n")):
        (root / f"{name}.yaml").write_text(text)
    # text that is not UTF-8 (Latin-1 "café" on line 2: byte 15 = len(b"Once upon a\ncaf") is 0xe9) as training
    # data (a file, a folder), a run config and a model config
    (root / "latin1.txt").write_bytes(b"Once upon a\ncaf\xe9 time.\n")
    (root / "latin1_data.yaml").write_text(f"model: {{preset: attn-only-1l, d_model: 16, n_heads: 2}}\n"
                                           f"data: {{source: 'file:{root / 'latin1.txt'}', tokenizer: char}}\n")
    (root / "latin1_config.yaml").write_bytes(b"name: caf\xe9\n")
    (root / "latin1_model.json").write_bytes(b'{"n_layers": 1, "d_model": 16, "n_heads": 2}\n# caf\xe9\n')
    (root / "latin1_folder").mkdir()
    (root / "latin1_folder" / "a.txt").write_bytes(b"Once upon a\ncaf\xe9 time.\n")
    (root / "latin1_folder.yaml").write_text(f"model: {{preset: attn-only-1l, d_model: 16, n_heads: 2}}\n"
                                             f"data: {{source: 'folder:{root / 'latin1_folder'}', tokenizer: char}}\n")
    paths = {"run": root / "run", "bytes": root / "bytes", "notok": root / "notok", "file": root / "afile", "tmp": root,
             "prompts": root / "prompts.txt"}
    paths.update({f"config_{n}": root / f"{n}.yaml" for n in ("train5", "data_list", "model5", "a_list", "latin1_data",
                                                                "latin1_config", "latin1_folder")})
    paths["model_latin1"] = root / "latin1_model.json"
    return {k: str(v) for k, v in paths.items()}


# (command line, a fragment the one-line message must hold). {name} is filled from `where`.
DEMO = "train --config demo --no-progress --out {tmp}/never"
STEER = "steer --checkpoint {run} --positive {prompts} --negative {prompts} --neutral {prompts} --layer 0"
CLI_CASES = [
    # sampling options (one validator: model.sampling.check_sampling, also used by steer and generate())
    ("generate --checkpoint {run} --temperature nan", "--temperature must be a finite number >= 0"),
    ("generate --checkpoint {run} --temperature -1", "--temperature must be a finite number >= 0"),
    ("generate --checkpoint {run} --temperature inf", "--temperature must be a finite number >= 0"),
    ("generate --checkpoint {run} --top-k 0", "--top-k must be a whole number >= 1"),
    ("generate --checkpoint {run} --top-k -3", "--top-k must be a whole number >= 1"),
    ("generate --checkpoint {run} --top-p 0", "--top-p must be in (0, 1]"),
    ("generate --checkpoint {run} --top-p nan", "--top-p must be in (0, 1]"),
    ("generate --checkpoint {run} --num 0", "argument --num: must be a whole number from 1 to 1024"),
    ("generate --checkpoint {run} --num -2", "argument --num: must be a whole number from 1 to 1024"),
    ("generate --checkpoint {run} --max-tokens 0", "argument --max-tokens: must be a whole number >= 1"),
    ("generate --checkpoint {run} --num many", "argument --num: must be a whole number from 1 to 1024"),
    ("generate --checkpoint {run} --prompt " + "x" * 40, "not in the char tokenizer's vocabulary"),
    ("generate --checkpoint {run} --prompt '" + "Lily saw a cat. " * 2 + "'", "the model's context is 24"),
    ("generate --checkpoint {tmp}/nothing", "checkpoint not found"),
    ("generate --prompt hello", "the following arguments are required: --checkpoint"),
    (STEER + " --temperature -0.5", "--temperature must be a finite number >= 0"),
    (STEER + " --samples 0", "argument --samples: must be a whole number from 1 to 1024"),
    (STEER + " --coef 1 nan", "argument --coef: must be a finite number"),
    (STEER + " --layer 7", "layer 7 is out of range"),
    # config sections and fields of the wrong type or out of range
    ("train --config {config_train5} --out {tmp}/never", "train must be a mapping, got int"),
    ("train --config {config_data_list} --out {tmp}/never", "data must be a mapping, got list"),
    ("train --config {config_model5} --out {tmp}/never", "model must be a mapping"),
    ("train --config {config_a_list} --out {tmp}/never", "must hold a mapping with model/data/train sections"),
    (DEMO + " --set data=5", "data must be a mapping, got int"),
    (DEMO + " --set train.lr=nan", "train.lr must be a finite number > 0, got nan"),
    (DEMO + " --set train.lr=0", "train.lr must be a finite number > 0"),
    (DEMO + " --set train.warmup_steps=-1", "train.warmup_steps must be >= 0"),
    (DEMO + " --set train.weight_decay=-0.1", "train.weight_decay must be a finite number >= 0"),
    (DEMO + " --set train.grad_clip=inf", "train.grad_clip must be a finite number >= 0"),
    (DEMO + " --set train.beta2=1", "train.beta2 must be from 0 to below 1"),
    (DEMO + " --set train.min_lr_frac=2", "train.min_lr_frac must be from 0 to 1"),
    (DEMO + " --set train.threads=-1", "train.threads must be >= 0"),
    (DEMO + " --set train.device=tpu", "train.device must be auto, cpu, cuda or cuda:N"),
    (DEMO + " --set train.steps=abc", "train.steps must be int, got 'abc'"),
    (DEMO + " --set name=5", "name must be a string"),
    (DEMO + " --set needs=gpu", "needs must be a list"),
    (DEMO + " --set train.stepz=3", "unknown field(s) in train: stepz (did you mean 'steps'?)"),
    (DEMO + " --set train.steps", "--set expects key=value"),
    # text files that are not UTF-8: the file, the byte offset and the line (circuitlab.textfile)
    ("train --config {config_latin1_data} --no-progress --out {tmp}/latin1_run",
     "latin1.txt is not UTF-8 text: byte 15 (line 2) is 0xe9"),
    ("train --config {config_latin1_folder} --no-progress --out {tmp}/latin1_run2",
     "a.txt is not UTF-8 text: byte 15 (line 2) is 0xe9"),
    ("train --config {config_latin1_config} --out {tmp}/never", "latin1_config.yaml is not UTF-8 text: byte 9 (line 1)"),
    # output paths that cannot be written
    ("train --config demo --no-progress --out {file}", "is a file; give a folder for the run"),
    ("train --config demo --no-progress --out {file}/run", "part of the path is a file, not a folder"),
    ("interpret --checkpoint {run} --experiments heads --out {file}", "is a file; give a folder"),
    ("export --checkpoint {run} --out {file}", "is a file; give a folder for the export"),
    ("attribute --checkpoint {run} --prompt Lily --out {tmp}/a.txt", "give a file name ending in .html"),
    ("attribute --checkpoint {run} --prompt Lily --out {file}/a.json", "part of the path is a file, not a folder"),
    (STEER + " --samples 1 --max-tokens 2 --coef 0 --out {file}", "is a file; give a folder for the steer output"),
    ("forge compare --out {file}", "is a file; give a folder"),
    # other commands' options
    ("attribute --checkpoint {run} --prompt ''", "the prompt is empty"),
    ("attribute --checkpoint {run} --prompt Lily --steps 0", "argument --steps: must be a whole number from 1 to 1024"),
    ("attribute --checkpoint {run} --prompt Lily --pos 9", "pos 9 is outside the sequence"),
    ("attribute --checkpoint {run} --prompt Lily --method occlusion --span 0", "argument --span: must be a whole number >= 1"),
    ("attribute --checkpoint {run} --prompt Lily --method nope", "argument --method: invalid choice"),
    ("attribute --checkpoint {run} --prompt Lily --method shap --samples 0", "argument --samples: must be a whole number from 3"),
    ("attribute --checkpoint {run} --prompt Lily --method lime --kernel-width inf", "argument --kernel-width: must be a finite number > 0"),
    ("attribute --checkpoint {run} --prompt Lily --method shap --baseline token:100000", "the baseline token must be a token id in"),
    ("interpret --checkpoint {run} --experiments nope --out {tmp}/i", "unknown experiment(s) nope"),
    ("interpret --checkpoint {run} --experiments logit_lens --prompt '' --out {tmp}/i", "the prompt is empty"),
    ("interpret --checkpoint {run} --experiments patching --clean Lily --out {tmp}/i", "--clean and --corrupt go"),
    ("interpret --checkpoint {notok} --experiments circuits logit_lens --out {tmp}/i", "so logit_lens cannot encode"),
    ("interpret --checkpoint {run} --experiments causal_tracing --prompt 'Lily saw' --subject cat --out {tmp}/i",
     "subject 'cat' is not in the prompt; the prompt's tokens are: 'L', 'i', 'l', 'y', ' ', 's', 'a', 'w'"),
    ("interpret --checkpoint {run} --experiments causal_tracing --prompt 'Lily saw' --out {tmp}/i", "needs --subject"),
    ("interpret --checkpoint {run} --experiments causal_tracing --prompt 'Lily saw' --subject Lily --window 2 "
     "--out {tmp}/i", "a window of 2 layers is wider than the model (1 layers)"),
    ("interpret --checkpoint {run} --experiments causal_tracing --noise-scale nan",
     "argument --noise-scale: must be a number from above 0 to 1000"),
    ("interpret --checkpoint {run} --experiments causal_tracing --noise-scale inf",
     "argument --noise-scale: must be a number from above 0 to 1000"),
    ("interpret --checkpoint {run} --experiments causal_tracing --noise-scale 0",
     "argument --noise-scale: must be a number from above 0 to 1000"),
    ("interpret --checkpoint {run} --experiments causal_tracing --noise-scale -1",
     "argument --noise-scale: must be a number from above 0 to 1000"),
    ("interpret --checkpoint {run} --experiments causal_tracing --noise-samples 0",
     "argument --noise-samples: must be a whole number >= 1"),
    ("interpret --checkpoint {run} --experiments causal_tracing --subject Lily --replace-with cat --out {tmp}/i",
     "--replace-with goes with --noise replace"),
    ("interpret --checkpoint {run} --experiments causal_tracing --prompt 'Lily saw' --subject Lily --noise replace "
     "--out {tmp}/i", "needs replacements"),
    ("generate --checkpoint {notok}", "has no tokenizer saved with it"),
    ("circuit --checkpoint {run} --task induction --threshold nan --out {tmp}/c", "argument --threshold: must be a finite number >= 0"),
    ("circuit --checkpoint {run} --task induction --edges 0 --out {tmp}/c", "argument --edges: must be a whole number >= 1"),
    ("circuit --checkpoint {run} --task induction --steps 0 --out {tmp}/c", "argument --steps: must be a whole number from 1 to 10000"),
    ("circuit --checkpoint {run} --task induction --metric nope --out {tmp}/c", "unknown metric 'nope'"),
    ("circuit --checkpoint {run}", "give --clean and --corrupt prompt files"),
    ("forge adder --digits 0 --check", "n_digits_a must be an integer from 1 to 40"),
    ("forge adder --a 1", "give both --a and --b"),
    ("forge adder --digits 4 --check --samples 0", "argument --samples: must be a whole number >= 1"),
    ("forge compare --steps 0 --out {tmp}/fc", "steps must be a positive whole number"),
    ("forge", "choose a forge command"),
    ("serve --checkpoint {run} --port 0", "--port must be from 1 to 65535"),
    ("serve --checkpoint {run} --max-tokens 0", "max_tokens must be a positive whole number"),
    ("serve --checkpoint {run} --device tpu", "unknown device 'tpu'"),
    ("serve --checkpoint {run} --device cuda:99", "is not available"),
    ("demo --steps 0 --out {tmp}/d", "argument --steps: must be a whole number >= 1"),
    ("demo --steps-1l -5 --out {tmp}/d", "argument --steps-1l: must be a whole number >= 1"),
    ("sae eval --dictionary {tmp}/d --checkpoint {run} --batches 0", "argument --batches: must be a whole number"),
    ("sae dashboards --dictionary {tmp}/d --checkpoint {run} --tokens 0", "argument --tokens: must be a whole"),
    ("sae demo --model-steps 0 --out {tmp}/f", "argument --model-steps: must be a whole number >= 1"),
    ("sae train --config {tmp}/none.yaml", "not found"),
    ("info --preset nope", "unknown model preset 'nope'"),
    ("import {tmp}/nothing --out {tmp}/m", "checkpoint folder not found"),
    ("import {run} --out {tmp}/m", "has no config.json"),
    ("import gpt2 --n-ctx 0 --out {tmp}/m", "argument --n-ctx: must be a whole number >= 1"),
    ("nosuchcommand", "invalid choice: 'nosuchcommand'"),
]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's errors
        return e.code


def _assert_one_line_error(code, err: str, fragment: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("circuitlab") and ": error: " in lines[0], err
    assert fragment in lines[0], err


@pytest.mark.parametrize("command, fragment", CLI_CASES, ids=[c for c, _ in CLI_CASES])
def test_bad_command_line_is_one_line_and_exit_2(where, command, fragment, capsys):
    import shlex

    argv = [part.format(**where) for part in shlex.split(command)]
    code = _run(argv)
    _assert_one_line_error(code, capsys.readouterr().err, fragment)


def test_a_model_config_file_that_is_not_utf8_is_one_line(where):
    with pytest.raises(InputError, match=r"model config file .*latin1_model.json is not UTF-8 text: byte 50 \(line 2\) "
                                         r"is 0xe9") as e:
        ModelConfig.load(where["model_latin1"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("err, fragment", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device"),
    (PermissionError(errno.EACCES, "Permission denied", "/somewhere/a.json"), "/somewhere/a.json: permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/a.json"), "the file system is read-only"),
])
def test_a_full_disk_or_unwritable_output_is_one_line_and_leaves_no_file(where, err, fragment, monkeypatch, capsys,
                                                                          tmp_path):
    def fail(*_):
        raise err

    monkeypatch.setattr(atomic.os, "fsync", fail)  # every atomic write fsyncs before its rename
    out = tmp_path / "a.json"
    code = _run(["attribute", "--checkpoint", where["run"], "--prompt", "Lily", "--out", str(out)])
    _assert_one_line_error(code, capsys.readouterr().err, fragment)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temp


def test_silent_changes_of_meaning_are_said(where):
    """An empty prompt, a generation past the context and an over-long prompt still run, but say so (a
    warning, which the CLI prints as one line)."""
    with pytest.warns(UserWarning, match="no prompt"):
        assert _run(["generate", "--checkpoint", where["run"], "--prompt", "", "--max-tokens", "3"]) == 0
    with pytest.warns(UserWarning, match="exceed the model's context of 24"):
        assert _run(["generate", "--checkpoint", where["run"], "--prompt", "Lily", "--max-tokens", "30"]) == 0
    with pytest.warns(UserWarning, match="only its last 24 tokens are analysed"):
        assert _run(["interpret", "--checkpoint", where["run"], "--experiments", "logit_lens",
                     "--prompt", "Lily saw a cat. " * 3, "--out", where["tmp"] + "/lens"]) == 0


def test_weights_only_analyses_run_on_a_model_without_a_tokenizer(where, capsys):
    """`interpret circuits heads` need no text: they run on token ids (heatmaps labelled <id>)."""
    out = where["tmp"] + "/weights_only"
    assert _run(["interpret", "--checkpoint", where["notok"], "--experiments", "circuits", "heads", "--out", out]) == 0
    results = json.loads(open(out + "/results.json").read())
    assert results["experiments"] == ["circuits", "heads"] and results["circuits"]["figures"]
    assert "direct_path.png" in results["circuits"]["figures"] and results["circuits"]["direct_path_top_pairs"]


# ---------------------------------------------------------------------------- the explorer


EXPLORER_CASES = [  # (run, method, url, raw JSON body, status, fragment of "detail")
    ("bytes", "post", "/api/analyse", '{"prompt": "\\ud800abc"}', 422, "not valid Unicode"),
    ("bytes", "post", "/api/analyse", '{"prompt": "Lily", "target": "\\udc80"}', 422, "not valid Unicode"),
    ("run", "post", "/api/analyse", '{"prompt": "\\ud800abc"}', 422, "not valid Unicode"),
    ("run", "post", "/api/analyse", '{"prompt": 5}', 422, "prompt: Input should be a valid string"),
    ("run", "post", "/api/analyse", '{"prompt": ["Lily"]}', 422, "prompt: Input should be a valid string"),
    ("run", "post", "/api/analyse", '{"prompt": null}', 422, "prompt"),
    ("run", "post", "/api/analyse", '["Lily"]', 422, "the request needs a JSON object body"),
    ("run", "post", "/api/analyse", '"Lily"', 422, "the request needs a JSON object body"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "figures": "yes"}', 422, "figures"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "target": 1.5}', 422, "target"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "target": -1}', 422, "outside the vocabulary"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "position": 99}', 422, "position 99 is outside"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "extra": 1}', 422, "extra"),
    ("run", "post", "/api/analyse", '{"prompt": "   "}', 422, "the prompt is empty"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily", "prompt": 3}', 422, "prompt"),
    ("run", "post", "/api/analyse", '{"prompt": "Lily"', 422, "not valid JSON"),
    ("run", "post", "/api/adder", '{"a": "\\ud800", "b": 3}', 422, "a must be a whole number"),
    ("run", "post", "/api/adder", '{"a": 1e400, "b": 3}', 422, "a: should be"),
    ("run", "post", "/api/adder", '{"a": 1, "b": 3, "digits": "x"}', 422, "digits"),
    ("run", "post", "/api/adder", '{"a": 1, "b": 3, "design": 5}', 422, "design"),
    ("bytes", "post", "/api/steer", '{"positive": ["ab"], "negative": ["cd"], "layer": 0, "coefs": [NaN]}', 422,
     "coefs[0] must be a finite number"),
    # no looser than the CLI: a string or a boolean is not a coefficient
    ("bytes", "post", "/api/steer", '{"positive": ["ab"], "negative": ["cd"], "layer": 0, "coefs": ["2"]}', 422,
     "coefs"),
    ("bytes", "post", "/api/steer", '{"positive": ["ab"], "negative": ["cd"], "layer": 0, "coefs": [true]}', 422,
     "coefs"),
    ("bytes", "post", "/api/steer", '{"positive": ["\\ud800"], "negative": ["cd"], "layer": 0}', 422,
     "not valid Unicode"),
    ("bytes", "post", "/api/attribute", '{"prompt": "ab", "target": "\\ud800"}', 422, "not valid Unicode"),
    ("bytes", "post", "/api/lens", '{"prompt": "\\udfff"}', 422, "not valid Unicode"),
    ("bytes", "post", "/api/circuits/run", '{"task": null, "clean": ["\\ud800"], "corrupt": ["ab"]}', 422,
     "not valid Unicode"),
    ("run", "get", "/api/adder?a=1", None, 422, "b: Field required"),
    ("run", "get", "/api/features?dictionary=x", None, 409, "no dictionary loaded"),
    ("run", "post", "/api/features/prompt", '{"dictionary": 5, "prompt": "x"}', 422, "dictionary"),
]


@pytest.fixture(scope="module")
def clients(where):
    return {name: TestClient(create_app(where[name], max_tokens=N_CTX), raise_server_exceptions=False)
            for name in ("run", "bytes")}


@pytest.mark.parametrize("run, method, url, body, status, fragment", EXPLORER_CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in EXPLORER_CASES])
def test_bad_explorer_request_is_a_4xx_json_line(clients, run, method, url, body, status, fragment):
    r = clients[run].request(method.upper(), url, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert fragment in detail and "\n" not in detail, detail


# ---------------------------------------------------------------------------- the Python API


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8))


ok = torch.tensor([[1, 2, 3]])
API_CASES = [  # (what, call(model), error fragment)
    ("id >= d_vocab", lambda m: m(torch.tensor([[1, 20]])), "id 20, outside the vocabulary [0, 20)"),
    ("negative id", lambda m: m(torch.tensor([[1, -1]])), "id -1, outside the vocabulary"),
    ("float ids", lambda m: m(torch.tensor([[1.0, 2.0]])), "must be integer token ids"),
    ("bool ids", lambda m: m(torch.tensor([[True]])), "must be integer token ids"),
    ("3-d ids", lambda m: m(torch.zeros(1, 2, 3, dtype=torch.long)), "shaped [batch, pos] or [pos]"),
    ("0-d ids", lambda m: m(torch.tensor(3)), "shaped [batch, pos] or [pos]"),
    ("past n_ctx", lambda m: m(torch.zeros(1, 9, dtype=torch.long)), "exceeds the model's context n_ctx=8"),
    ("run_with_cache", lambda m: m.run_with_cache(torch.tensor([[25]])), "outside the vocabulary"),
    ("run_with_hooks", lambda m: m.run_with_hooks(torch.tensor([[25]])), "outside the vocabulary"),
    ("loss target id", lambda m: m.loss(torch.tensor([[1, 2, 25]])), "target tokens hold id 25"),
    ("loss of one token", lambda m: m.loss(torch.tensor([[1]])), "at least 2 tokens per row"),
    ("temperature nan", lambda m: m.generate(ok, 2, temperature=float("nan")), "temperature must be a finite"),
    ("temperature < 0", lambda m: m.generate(ok, 2, temperature=-1.0), "temperature must be a finite number >= 0"),
    ("top_k 0", lambda m: m.generate(ok, 2, top_k=0), "top_k must be a whole number >= 1"),
    ("top_k float", lambda m: m.generate(ok, 2, top_k=2.5), "top_k must be a whole number >= 1"),
    ("top_p 2", lambda m: m.generate(ok, 2, top_p=2.0), "top_p must be in (0, 1]"),
    ("max_new_tokens < 0", lambda m: m.generate(ok, -1), "max_new_tokens must be a whole number >= 0"),
    ("empty prompt", lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long), 2), "at least one token"),
    ("prompt id", lambda m: m.generate(torch.tensor([[30]]), 2), "outside the vocabulary"),
    ("sample_next on NaN logits", lambda m: sample_next(torch.full((1, 20), float("nan"))), "not finite"),
    ("text with a lone surrogate", lambda m: ByteTokenizer().encode("a\ud800"), "not valid Unicode"),
    ("text not a string", lambda m: ByteTokenizer().encode(b"abc"), "must be a string"),
    ("config section", lambda m: RunConfig.from_dict({"train": 5}), "train must be a mapping, got int"),
    ("config lr", lambda m: RunConfig.from_dict({"train": {"lr": float("nan")}}), "train.lr must be a finite"),
    ("model config", lambda m: ModelConfig(d_model=0), "ModelConfig.d_model must be positive"),
]


@pytest.mark.parametrize("what, call, fragment", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_python_input_raises_a_circuitlab_error(model, what, call, fragment):
    with pytest.raises(CircuitlabError) as info:
        call(model)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_input_errors_are_value_errors_too(model):
    """Code that catches ValueError (as it would have for torch's own errors) keeps working."""
    with pytest.raises(ValueError):
        model(torch.tensor([[99]]))
    assert issubclass(InputError, CircuitlabError)


def test_the_explorer_and_the_json_it_returns_survive_the_table(clients):
    r = clients["run"].post("/api/analyse", json={"prompt": "Lily"})
    assert r.status_code == 200 and json.loads(r.text)["tokens"]


@pytest.mark.parametrize("raised,said", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 8000000000000 bytes. Error code 12 (Cannot allocate memory)"), "it asked for 7,450.6 GiB"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "it asked for 20.0 GiB"),
    (MemoryError(), "out of memory")])
def test_an_allocation_the_machine_refuses_is_one_line(monkeypatch, capsys, raised, said):
    """The last resort behind the size checks: whatever a command was asked, an allocation the machine refuses
    (a memory limit, a full GPU) is one line and exit 2; any other RuntimeError still shows its traceback."""
    import circuitlab.commands.info as info

    def refuse(args):
        raise raised

    monkeypatch.setattr(info, "run", refuse)
    assert main(["info"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("circuitlab info: error: out of memory") and said in err, err
    monkeypatch.setattr(info, "run", lambda args: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["info"])
