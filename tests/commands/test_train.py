"""Training: exact resume, DDP equivalence, accumulation, NaN stop, checkpoints, CLI.

(Split out of the flat test_training module, issue 38.)"""
import yaml

from circuitlab.cli import main

from training.test_trainer import TINY, tiny  # noqa: F401 (shared with it)


def test_cli_train_generate_and_bad_input(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny(tmp_path, steps=4).to_dict()))
    out = str(tmp_path / "cli")
    assert main(["train", "--config", str(path), "--out", out, "--no-progress", "--set", "train.lr=1e-3"]) == 0
    assert main(["generate", "--checkpoint", out, "--prompt", "Once", "--max-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("Once")
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert main(["train", "--config", str(path), "--set", "train.steps=abc"]) == 2
    assert main(["train", "--config", str(path), "--set", "data.tokenizer=klingon", "--out", str(tmp_path / "k")]) == 2
    assert main(["generate", "--checkpoint", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    assert main(["generate", "--checkpoint", out, "--prompt", "x" * 40]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 5
