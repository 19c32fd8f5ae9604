"""Threads by the size of the work (circuitlab.perf.threads_for): one thread for small steps, torch's count
for large ones, an option or $CIRCUITLAB_THREADS over both; training, dictionary training, the tuned lens and
probes run under it and give torch's count back afterwards. The measurement behind the threshold:
benchmarks/bench_threads.py (numbers in benchmarks/README.md)."""
import json
import math

import pytest
import torch

from circuitlab import ConfigError, ModelConfig
from circuitlab import perf
from circuitlab.perf import SMALL_STEP_FLOPS, THREADS_ENV, threads_for, threads_for_work, transformer_step_flops


@pytest.fixture
def two_threads(monkeypatch):
    """torch at 2 threads during the test (the default on the 2-core machine), restored after."""
    monkeypatch.delenv(THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_steps_get_one_thread_large_ones_torchs_count_on_free_cores(two_threads, monkeypatch):
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(perf, "own_load", lambda: 0.0)  # this process has been idle: the load is others'
    monkeypatch.setattr(perf, "read_cpu_times", lambda: None)  # no /proc/stat: the load average decides
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (0.1, 0.1, 0.1))  # an idle 2-core machine
    assert threads_for(SMALL_STEP_FLOPS / 10) == 1
    assert threads_for(SMALL_STEP_FLOPS * 10) == 2
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (1.2, 1.0, 1.0))  # another process holds a core
    assert threads_for(SMALL_STEP_FLOPS * 10) == 1
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (12.0, 12.0, 12.0))
    assert threads_for(SMALL_STEP_FLOPS * 1e4) == 1
    monkeypatch.delattr(perf.os, "getloadavg")  # no load average (Windows): torch's count
    assert perf.free_cores() is None and threads_for(SMALL_STEP_FLOPS * 10) == 2
    assert threads_for(SMALL_STEP_FLOPS / 10, requested=2) == 2  # an option wins
    monkeypatch.setenv(THREADS_ENV, "2")
    assert threads_for(SMALL_STEP_FLOPS / 10) == 2 and threads_for(SMALL_STEP_FLOPS / 10, requested=1) == 1
    for bad in ("0", "two", "1.5", "nan"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ConfigError, match=THREADS_ENV) as e:
            threads_for(1.0)
        assert "\n" not in str(e.value)


def test_the_load_this_process_made_itself_does_not_take_its_cores(two_threads, monkeypatch):
    """After a stage that kept both cores busy the load average reads ~2 on an otherwise idle machine; the
    next stage must still get both threads, and only other processes' load may take one away."""
    now = {"t": 0.0, "cpu": 0.0}
    own = perf.OwnLoad(clock=lambda: now["t"], cpu=lambda: now["cpu"])
    assert own() == 0.0
    now.update(t=300.0, cpu=600.0)                     # five minutes on both cores
    assert own() == pytest.approx(2 * (1 - math.exp(-5)))
    monkeypatch.setattr(perf, "own_load", own)
    monkeypatch.setattr(perf, "read_cpu_times", lambda: None)
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (2.0, 1.9, 1.2))   # all of it ours
    assert threads_for(SMALL_STEP_FLOPS * 10) == 2
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (3.0, 2.9, 2.2))   # and another process on one core
    assert threads_for(SMALL_STEP_FLOPS * 10) == 1
    now.update(t=600.0, cpu=600.0)                     # then five idle minutes: our share decays as the kernel's
    assert own() == pytest.approx(2 * (1 - math.exp(-5)) * math.exp(-5))
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (1.0, 1.0, 1.0))   # the load left is others'
    assert threads_for(SMALL_STEP_FLOPS * 10) == 1


def test_where_proc_stat_exists_the_cores_idle_now_decide(two_threads, monkeypatch):
    """/proc/stat sampled over a short sleep: what the other processes use now, whatever the load average says
    (it trails by a minute and counts this process too)."""
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(perf.os, "getloadavg", lambda: (3.0, 3.0, 3.0))  # would say: no core free
    own = {"cpu": 0.0}
    monkeypatch.setattr(perf.time, "process_time", lambda: own["cpu"])    # this process: idle unless said
    monkeypatch.setattr(perf.time, "monotonic", lambda: 10.0)
    monkeypatch.setattr(perf.time, "sleep", lambda s: own.update(slept=s))
    samples = iter([(1000, 4000), (1190, 4200)])                         # 190 of 200 ticks idle
    monkeypatch.setattr(perf, "read_cpu_times", lambda: next(samples))
    assert perf.free_cores() == pytest.approx(1.9)
    samples = iter([(1000, 4000), (1190, 4200)])
    assert threads_for(SMALL_STEP_FLOPS * 10) == 2
    samples = iter([(1000, 4000), (1100, 4200)])                         # another process holds one core
    assert threads_for(SMALL_STEP_FLOPS * 10) == 1
    # The same busy core, but it was this process's own threads still spinning: it counts as free.
    cpu = iter([0.0, 0.1])
    monkeypatch.setattr(perf.time, "process_time", lambda: next(cpu))
    clock = iter([0.0, 0.1])
    monkeypatch.setattr(perf.time, "monotonic", lambda: next(clock))
    samples = iter([(1000, 4000), (1100, 4200)])
    assert threads_for(SMALL_STEP_FLOPS * 10) == 2
    monkeypatch.undo()
    real = perf.read_cpu_times()                                          # the real file, where there is one
    assert real is None or 0 <= real[0] <= real[1]


def test_threads_for_work_restores_the_count_even_on_error(two_threads):
    with pytest.raises(RuntimeError):
        with threads_for_work(1.0) as n:
            assert n == 1 and torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_step_flops_count_the_matmuls():
    """2 flops per weight per token (+ attention scores and mixing), x3 with backward: by hand for a tiny config."""
    cfg = ModelConfig(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=4, d_mlp=16)
    per_token = 2 * (4 * 8 * 8 + 2 * 8 * 16 + 8 * 10) + 4 * 4 * 8
    assert transformer_step_flops(cfg, tokens=12, seq_len=4, backward=False) == per_token * 12
    assert transformer_step_flops(cfg, tokens=12, seq_len=4) == 3 * per_token * 12


def test_training_runs_a_tiny_model_on_one_thread_and_gives_the_count_back(tmp_path, two_threads):
    from circuitlab.training import RunConfig, read_metrics, train

    run = RunConfig.from_dict({
        "name": "tiny", "model": {"preset": "attn-only-1l", "d_model": 16, "n_heads": 2},
        "data": {"source": "stories", "n_stories": 50, "tokenizer": "char", "cache_dir": str(tmp_path / "cache")},
        "train": {"steps": 2, "batch_size": 4, "seq_len": 16, "eval_every": 2, "eval_batches": 1, "ckpt_every": 2,
                  "track_every": 2, "log_every": 1}})
    threads = lambda model, data: {"threads": torch.get_num_threads()}  # noqa: E731 - a probe the trainer runs
    train(run, tmp_path / "auto", progress=False, track=[threads])
    assert {r["threads"] for r in read_metrics(tmp_path / "auto") if "threads" in r} == {1}
    assert torch.get_num_threads() == 2
    run.train.threads = 2  # the option wins over the size
    train(run, tmp_path / "two", progress=False, track=[threads])
    assert {r["threads"] for r in read_metrics(tmp_path / "two") if "threads" in r} == {2}
    assert torch.get_num_threads() == 2


def test_dictionary_training_picks_by_its_step(tmp_path, two_threads, monkeypatch):
    from circuitlab.dictionaries import DictionaryConfig
    from circuitlab.dictionaries.planted import PlantedFeatures
    from circuitlab.dictionaries.store import ActivationStore
    from circuitlab.dictionaries.train import DictionaryTrainer, DictTrainConfig

    planted = PlantedFeatures(d=8, n_features=16)
    trainer = DictionaryTrainer([DictionaryConfig("relu", d_in=8, d_sae=16, hook_name=planted.hook_name)],
                                DictTrainConfig(steps=3, batch_size=32), ActivationStore(planted, 32))
    assert trainer.step_flops() == 6 * 32 * (8 * 16 * 2)
    seen = []
    step = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", lambda batch: seen.append(torch.get_num_threads()) or step(batch))
    trainer.fit(progress=False)
    assert seen == [1, 1, 1] and torch.get_num_threads() == 2


class FakeMachine:
    """A 2-core machine's /proc/stat (idle, total ticks), this process's CPU time and a clock, advanced by hand:
    `run(seconds, ours, others)` — this process kept `ours` cores busy and other processes `others`."""

    def __init__(self) -> None:
        self.t = self.cpu = 0.0
        self.idle = self.total = 0

    def run(self, seconds: float, ours: float, others: float) -> None:
        ticks = int(200 * seconds)                       # 100 ticks per second per core, 2 cores
        self.total += ticks
        self.idle += int(ticks * max(0.0, 2 - ours - others) / 2)
        self.t += seconds
        self.cpu += ours * seconds

    def governor(self, step_flops: float, **kw) -> perf.ThreadGovernor:
        return perf.ThreadGovernor(step_flops, cpu_times=lambda: (self.idle, self.total), own_cpu=lambda: self.cpu,
                                   clock=lambda: self.t, **kw)


def test_a_long_loop_gives_a_core_back_when_another_process_takes_it_and_takes_it_again_after(two_threads,
                                                                                              monkeypatch):
    """The cause of a graph's 6-38 s spread: two threads kept while another process held a core. The governor
    re-decides between steps from the interval just past (no sleep), never above the starting count."""
    m = FakeMachine()
    monkeypatch.setattr(perf, "free_cores", lambda: 2.0)                 # idle when the loop starts
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    with m.governor(SMALL_STEP_FLOPS * 100) as gov:
        assert torch.get_num_threads() == 2
        m.run(0.5, ours=2, others=0)
        assert gov.step() == 2                                           # under a second: not re-decided
        m.run(1.0, ours=1.3, others=0.7)                                 # another process arrives
        assert gov.step() == 1 and torch.get_num_threads() == 1
        m.run(2.0, ours=1.0, others=1.0)                                 # it stays: one thread stays
        assert gov.step() == 1
        m.run(2.0, ours=1.0, others=0.0)                                 # it left: both cores again
        assert gov.step() == 2 and torch.get_num_threads() == 2
        m.run(2.0, ours=0.4, others=1.6)                                 # a crowd: still at least one
        assert gov.step() == 1
        torch.set_num_threads(1)
    assert gov.changes == 3 and torch.get_num_threads() == 2             # the count before the loop, restored


def test_a_requested_count_or_a_small_step_is_never_changed(two_threads, monkeypatch):
    m = FakeMachine()
    monkeypatch.setattr(perf, "free_cores", lambda: 2.0)
    monkeypatch.setattr(perf.os, "cpu_count", lambda: 2)
    for kw, flops, want in [({"requested": 2}, SMALL_STEP_FLOPS * 100, 2), ({}, SMALL_STEP_FLOPS / 10, 1)]:
        with m.governor(flops, **kw) as gov:
            m.run(5.0, ours=1.0, others=1.0)
            assert gov.step() == want and gov.changes == 0
    monkeypatch.setenv(THREADS_ENV, "2")
    with m.governor(SMALL_STEP_FLOPS * 100) as gov:
        m.run(5.0, ours=1.0, others=1.0)
        assert gov.step() == 2
