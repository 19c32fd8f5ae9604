"""Metric sinks: TensorBoard event files a reader can load (training and resume), W&B offline through
its API, metrics.jsonl always, one-line errors."""
import json
import sys
import types

import pytest
import yaml

from circuitlab import ConfigError
from circuitlab.analysis.heads.induction import training_probes
from circuitlab.training import RunConfig, read_metrics, train
from circuitlab.training.sinks import flat_scalars, open_sinks

TINY = {
    "name": "tiny",
    "model": {"preset": "attn-only-1l", "d_model": 16, "n_heads": 2},
    "data": {"source": "stories", "n_stories": 60, "tokenizer": "char"},
    "train": {"steps": 12, "batch_size": 4, "seq_len": 16, "warmup_steps": 2, "eval_every": 6,
              "eval_batches": 1, "ckpt_every": 6, "track_every": 6, "log_every": 2},
}


def run_config(tmp_path, **train) -> dict:
    data = json.loads(json.dumps(TINY))
    data["data"]["cache_dir"] = str(tmp_path / "cache")
    data["train"].update(train)
    return data


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_flat_scalars_names_heads_and_nests():
    record = {"step": 5, "loss": 2.5, "induction": [[0.1, 0.9]], "icl": None, "name": "x",
              "eval": {"mse": 0.25, "per_feature": list(range(1000))}, "periods": [0.5, 0.75], "nan": float("nan")}
    assert flat_scalars(record) == {"loss": 2.5, "induction/L0H0": 0.1, "induction/L0H1": 0.9,
                                    "eval/mse": 0.25, "periods/0": 0.5, "periods/1": 0.75}


def test_training_writes_readable_tensorboard_events_and_jsonl_across_a_resume(tmp_path):
    run = RunConfig.from_dict(run_config(tmp_path))
    run = RunConfig.load(_saved(run, tmp_path), overrides=["train.log=tensorboard"])  # as --set does
    out = tmp_path / "tb"
    train(run, out, progress=False, stop_at=6, track=training_probes())  # as `circuitlab train` does
    train(run, out, resume=True, progress=False, track=training_probes())  # TensorBoard keeps one event per step
    records = read_metrics(out)
    events = scalars(out / "tensorboard")
    losses = [(r["step"], r["loss"]) for r in records if "loss" in r]
    assert [s for s, _ in events["loss"]] == [s for s, _ in losses] == [2, 4, 6, 8, 10, 12]
    assert [v for _, v in events["loss"]] == pytest.approx([v for _, v in losses], rel=1e-6)
    # the interpretability metrics tracked during training are there too, by head
    tracked = [r for r in records if "induction" in r]
    assert [s for s, _ in events["induction/L0H1"]] == [r["step"] for r in tracked] == [0, 6, 12]
    assert events["induction/L0H1"][-1][1] == pytest.approx(tracked[-1]["induction"][0][1], abs=1e-6)
    assert {"val_loss", "repeat_loss", "prev_token/L0H0", "lr", "grad_norm"} <= set(events)


def _saved(run: RunConfig, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run.to_dict()))
    return path


def test_wandb_sink_logs_offline_through_its_api(tmp_path, monkeypatch):
    calls = {"log": [], "finished": False}

    class FakeRun:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with open_sinks(tmp_path, "wandb", run_name="r", config={"lr": 1e-3}) as sinks:
        sinks.write({"step": 3, "loss": 1.5, "induction": [[0.25]]})
    assert calls["init"]["mode"] == "offline" and calls["init"]["name"] == "r" and calls["init"]["dir"] == str(tmp_path)
    assert calls["log"] == [(3, {"loss": 1.5, "induction/L0H0": 0.25})] and calls["finished"]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 3, "loss": 1.5, "induction": [[0.25]]}


def test_sink_errors_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown sink 'tensorbored'"):
        RunConfig.from_dict(run_config(tmp_path, log="tensorbored"))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install wandb"):
        open_sinks(tmp_path, "tensorboard,wandb")


def wandb_history(path) -> list[dict]:
    """The logged rows of an offline W&B run, read from its run-*.wandb file: a 7-byte header, then
    LevelDB-log chunks (4-byte checksum, 2-byte length, 1-byte kind) in 32 KiB blocks holding protobuf
    Records. Read here by hand because wandb 0.31 reads its own files only in its Go core."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, parts, rows = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts, pos = parts + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4) and parts:  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


@pytest.mark.slow
def test_training_logs_to_wandb_offline_for_real(tmp_path, monkeypatch):
    """The real wandb package (a dev dependency through sae-lens), offline, no network: a stopped and
    resumed run logs each step once, with the tracked head scores, and the values match metrics.jsonl."""
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is our default
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunConfig.load(_saved(RunConfig.from_dict(run_config(tmp_path)), tmp_path), overrides=["train.log=wandb"])
    out = tmp_path / "wb"
    train(run, out, progress=False, stop_at=6, track=training_probes())
    train(run, out, resume=True, progress=False, track=training_probes())
    records = read_metrics(out)
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2                                     # the first run and its resumption
    rows = [row for path in files for row in wandb_history(path)]
    logged = sorted((r["_step"], round(r["loss"], 5)) for r in rows if "loss" in r)
    assert logged == [(r["step"], round(r["loss"], 5)) for r in records if "loss" in r]  # once each, in order
    tracked = {r["_step"]: r["induction/L0H1"] for r in rows if "induction/L0H1" in r}
    assert sorted(tracked) == [0, 6, 12]
    assert tracked[12] == pytest.approx([r for r in records if "induction" in r][-1]["induction"][0][1], abs=1e-6)
