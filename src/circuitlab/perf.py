"""This machine's speed, so that wall times can be compared across machines, and how many CPU threads a
piece of work should use.

    gflops = matmul_gflops()                      # fp32 matmul GFLOP/s in this process, now
    scaled_seconds(wall, gflops)                  # what `wall` would be on a 150 GFLOP/s machine
    with threads_for_work(step_flops):            # 1 thread for small steps, else torch's count (restored after)
        ...

The demo's time budget and `make bench` are stated for a reference machine doing 150 GFLOP/s of fp32
matmul (about two cores of a 2020s laptop or cloud VM). Measure in the same process, right before and
after the timed work, so that other load on the machine shows in both.
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator

import torch

from circuitlab.checks import COUNT
from circuitlab.errors import ConfigError

REFERENCE_GFLOPS = 150.0

# Below this many flops per step one thread is faster: torch's intra-op threads split each small matmul and
# then wait for each other. Above it, torch's threads pay only on cores nobody else is using: a thread that
# shares its core with another process stalls every step at the next barrier. Measured with
# benchmarks/bench_threads.py on the 2-core machine (numbers in benchmarks/README.md): with the other core busy,
# 2 threads were 7-126x slower than 1 for steps of 3e6-1e7 flops (tiny dictionary and model steps) and still
# 1.8-4x slower at 5e9-1e10; the earlier measurement on a quieter machine put the crossover near 1e8.
SMALL_STEP_FLOPS = 1e8
THREADS_ENV = "CIRCUITLAB_THREADS"  # a thread count that overrides the choice by work size (like an option)


class OwnLoad:
    """This process's own part of the 1-minute load average, estimated from its CPU time.

    The kernel's load average counts this process's threads too: after a stage that kept both cores busy it
    reads ~2, and a later stage would then take one thread on an otherwise idle machine. The load average is an
    exponential average with a 60 s time constant; the same average of this process's CPU time per second
    (cores in use), updated whenever it is asked, is its share. CPU time undercounts threads waiting for a core,
    so the estimate errs towards fewer free cores, never more."""

    def __init__(self, clock=time.monotonic, cpu=time.process_time) -> None:
        self.clock, self.cpu = clock, cpu
        self.t, self.c, self.value = clock(), cpu(), 0.0

    def __call__(self) -> float:
        t, c = self.clock(), self.cpu()
        if t > self.t:
            keep = math.exp(-(t - self.t) / 60.0)
            self.value = keep * self.value + (1 - keep) * (c - self.c) / (t - self.t)
            self.t, self.c = t, c
        return self.value


own_load = OwnLoad()  # from the moment circuitlab.perf is imported


def read_cpu_times() -> tuple[int, int] | None:
    """(idle, total) CPU ticks of the whole machine since boot, from /proc/stat (Linux; None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    return (ticks[3] + ticks[4], sum(ticks)) if len(ticks) >= 5 else None


def free_between(before: tuple[int, int], after: tuple[int, int], own_cpu: float, wall: float) -> float | None:
    """Cores other processes left free between two /proc/stat readings (idle, total ticks): the idle ones plus
    what this process itself used (`own_cpu` CPU seconds over `wall` seconds), at most the CPU count; None when
    no tick passed. This process's own part counts as free: torch's threads can still be spinning after their
    last parallel step (right after a matmul benchmark a sample read one core busy and the demo's training took
    one thread), and only other processes should take a core away."""
    if after[1] <= before[1] or wall <= 0:
        return None
    cores = os.cpu_count() or 1
    idle = cores * (after[0] - before[0]) / (after[1] - before[1])
    return min(float(cores), idle + max(0.0, own_cpu) / wall)


def idle_cores(seconds: float = 0.1) -> float | None:
    """Cores that other processes leave free right now (free_between over `seconds` while this thread sleeps;
    None without /proc/stat). Unlike the load average, which trails by a minute, it sees only the present."""
    before, cpu0, t0 = read_cpu_times(), time.process_time(), time.monotonic()
    if before is None:
        return None
    time.sleep(seconds)
    after, cpu1, t1 = read_cpu_times(), time.process_time(), time.monotonic()
    if after is None:
        return None
    return free_between(before, after, cpu1 - cpu0, max(t1 - t0, 1e-9))


def free_cores() -> float | None:
    """Cores not used by other processes: idle_cores() where /proc/stat exists; else the CPU count minus the
    1-minute load average less this process's own part of it (own_load); None with neither."""
    idle = idle_cores()
    if idle is not None:
        return idle
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    return (os.cpu_count() or 1) - max(0.0, load - own_load())


def fixed_threads(step_flops: float, requested: int | None = None) -> int | None:
    """The thread count that does not depend on the machine's load: `requested` if given, else
    $CIRCUITLAB_THREADS if set, else 1 below SMALL_STEP_FLOPS; None when the free cores decide."""
    if requested:
        return COUNT.check(requested, "threads", ConfigError)
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        return int(COUNT.parse(env, THREADS_ENV, ConfigError))
    return 1 if step_flops < SMALL_STEP_FLOPS else None


def threads_for(step_flops: float, requested: int | None = None) -> int:
    """The torch CPU threads for work whose steps each cost `step_flops`: `requested` (an option such as
    train.threads) if given, else $CIRCUITLAB_THREADS if set, else 1 below SMALL_STEP_FLOPS, and otherwise
    torch's current count (a count the user set with torch.set_num_threads stands) capped at the cores other
    processes leave free (at least 1)."""
    fixed = fixed_threads(step_flops, requested)
    if fixed is not None:
        return fixed
    free = free_cores()
    n = torch.get_num_threads()
    return n if free is None else max(1, min(n, int(free + 0.5)))


@contextlib.contextmanager
def threads_for_work(step_flops: float, requested: int | None = None) -> Iterator[int]:
    """torch on threads_for(step_flops, requested) threads inside the block (yields the count); the
    previous count is restored on exit, even on error."""
    before = torch.get_num_threads()
    n = threads_for(step_flops, requested)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


class ThreadGovernor:
    """torch's thread count for a long loop of steps, decided like threads_for at the start and again between
    steps (`step()`, at most every `every` seconds) from what the other processes used since the last decision.

    One choice at the start goes stale: a graph's backward passes ran 6-38 s from run to run at similar load,
    because torch kept two threads while another process took a core (each step then waits at a barrier for
    the thread that lost its core; 2 threads took 136 s where 1 took 16 s at load ~11). The re-decision reads
    /proc/stat's busy ticks and this process's own CPU time over the interval just past, so it sleeps for
    nothing; without /proc/stat (or with a requested count, $CIRCUITLAB_THREADS or a small step) the count
    is fixed. The count never exceeds torch's count at the start; the start count is restored on exit."""

    def __init__(self, step_flops: float, requested: int | None = None, every: float = 1.0,
                 cpu_times=None, own_cpu=time.process_time, clock=time.monotonic) -> None:
        self.step_flops, self.requested, self.every = step_flops, requested, every
        self.cpu_times = cpu_times or read_cpu_times
        self.own_cpu, self.clock = own_cpu, clock
        self.adaptive = fixed_threads(step_flops, requested) is None
        self.changes = 0

    def __enter__(self) -> "ThreadGovernor":
        return self.start()

    def start(self) -> "ThreadGovernor":
        """The first decision (threads_for); __exit__ restores the count found here."""
        self.before = torch.get_num_threads()
        self.n = threads_for(self.step_flops, self.requested)
        torch.set_num_threads(self.n)
        self._mark()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.before)

    def _mark(self) -> None:
        self.t, self.c, self.ticks = self.clock(), self.own_cpu(), self.cpu_times()

    def step(self) -> int:
        """Between two steps: re-decide the count if `every` seconds have passed; returns the count in use."""
        if not self.adaptive or self.clock() - self.t < self.every:
            return self.n
        t, c, ticks = self.clock(), self.own_cpu(), self.cpu_times()
        free = None if ticks is None or self.ticks is None else free_between(self.ticks, ticks, c - self.c, t - self.t)
        if free is None:
            self._mark()
            return self.n
        # A core counts as free when at most a quarter of it was used by others: a thread sharing a core costs
        # far more (every step waits for it) than a thread left out (at most 2x on two cores).
        n = max(1, min(self.before, int(free + 0.25)))
        if n != self.n:
            torch.set_num_threads(n)
            self.n, self.changes = n, self.changes + 1
        self._mark()
        return self.n


def block_weights(cfg) -> int:
    """Matrix weights of one block from the config: Q and O, K and V (fewer with grouped-query attention), and
    the MLP's two or three matrices (gated)."""
    attn = 2 * cfg.d_model * cfg.n_heads * cfg.head_dim + 2 * cfg.d_model * cfg.kv_heads * cfg.head_dim
    mlp = (3 if cfg.mlp in ("swiglu", "geglu") else 2) * cfg.d_model * cfg.mlp_dim if cfg.has_mlp else 0
    return attn + mlp


def transformer_step_flops(cfg, tokens: int, seq_len: int, backward: bool = True) -> float:
    """Approximate flops of one step of a Transformer with config `cfg` on `tokens` tokens in rows of
    `seq_len`: 2 flops per weight per token in the matmuls (attention, MLP, unembedding), plus the
    attention scores and mixing (4 · seq_len · n_heads · d_head per layer per token); x3 with backward."""
    per_token = 2 * (cfg.n_layers * block_weights(cfg) + cfg.d_model * cfg.d_vocab)
    per_token += cfg.n_layers * 4 * seq_len * cfg.n_heads * cfg.head_dim
    return float(per_token * tokens * (3 if backward else 1))


def transformer_params(cfg) -> int:
    """Approximate parameter count of a Transformer with config `cfg`, from the config alone (nothing is
    allocated): attention and MLP weights per layer, the embedding and unembedding, learned positions."""
    embed = cfg.d_vocab * cfg.d_model * (1 if cfg.tied_embeddings else 2)
    pos = cfg.n_ctx * cfg.d_model if cfg.positional == "learned" else 0
    return cfg.n_layers * block_weights(cfg) + embed + pos


def transformer_step_floats(cfg, rows: int, seq_len: int) -> int:
    """Approximate floats of activations one training step on rows x seq_len tokens holds for its backward
    pass: per layer the residual stream, norms, q/k/v, attention pattern and MLP hidden, then the logits."""
    gated = 2 if cfg.mlp in ("swiglu", "geglu") else 1
    per_layer = 12 * cfg.d_model + (2 * gated * cfg.mlp_dim if cfg.has_mlp else 0) + 2 * cfg.n_heads * seq_len
    return rows * seq_len * (cfg.n_layers * per_layer + 3 * cfg.d_vocab)


def matmul_gflops(n: int = 512, seconds: float = 0.5, threads: int | None = None) -> float:
    """fp32 GFLOP/s of [n, n] @ [n, n] matmuls on the CPU with torch's current thread count (or
    `threads`): the median over repeated products (2 n^3 flops each) for about `seconds`, after one
    warm-up. The median, not the best, so that it reflects the speed the machine gives right now."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        out = torch.empty(n, n)
        torch.mm(a, b, out=out)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 5 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def scaled_seconds(seconds: float, gflops: float, reference: float = REFERENCE_GFLOPS) -> float:
    """A wall time measured at `gflops` expressed on a machine doing `reference` GFLOP/s (compute-bound
    work scales with the matmul speed)."""
    return seconds * gflops / reference
