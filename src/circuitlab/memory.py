"""The memory budget: how much memory a piece of work may hold, from the machine or from `--memory`.

    budget_bytes()                      # SAFETY x MemAvailable now (or the limit set below)
    floats(GRAPH_SHARE)                 # float32 values a part of the work may hold: a share of the budget
    with memory_limit("8G"): ...        # what `--memory 8G` does for one command (restored after)
    describe(GRAPH_SHARE)               # "2.6 GiB (half the memory budget: 70 % of 18.8 GiB available; --memory sets it)"

Every bound on memory (the graph's dense matrices and its rows per backward pass, the noise runs of causal
tracing, the patches per forward pass, a training step's activations) is a share of one budget, so a
bigger machine runs bigger work and `--memory` (or $CIRCUITLAB_MEMORY) moves them all at once. The budget
is read when a bound is checked, so it counts what this process already holds (the model, its
dictionaries) as used: it is what is left.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping

from circuitlab.errors import ConfigError

SAFETY = 0.7             # of the memory available now: the allocator's slack, other processes' growth
FALLBACK = 4 * 2 ** 30   # where the machine's memory cannot be read (no /proc/meminfo): 4 GiB
MEMORY_ENV = "CIRCUITLAB_MEMORY"   # a limit like --memory, for the Python API and every command

# The shares of the budget each bound may use (they are not all held at once: a graph holds its dense
# matrices and one backward pass's rows together, 0.5 + 0.25).
GRAPH_SHARE = 0.5        # an attribution graph's dense matrices (adjacency, rows, influence's copies)
PASS_SHARE = 0.25        # one backward pass's batched gradients and rows
RUNS_SHARE = 0.25        # causal tracing's corrupted runs, all in one batch
STEP_SHARE = 0.25        # a training step's activations (model, dictionaries, tuned lens)

_limit: int | None = None          # bytes, set by memory_limit / set_limit


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({"MemTotal": ..., "MemAvailable": ...}); {} where it cannot be read."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[name] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        return {}
    return out


def machine_bytes() -> int | None:
    """The machine's memory (MemTotal, else the physical pages), or None where neither can be read."""
    total = meminfo().get("MemTotal")
    if total:
        return total
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int | None:
    """What this process may still map under its address-space limit (ulimit -v), or None without one."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, limit - size)
    except (ImportError, OSError, ValueError, IndexError, AttributeError):
        return None


def _cgroup_left() -> int | None:
    """What this process's cgroup (a container's memory limit) has left, or None without a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        return None


def available_bytes() -> int | None:
    """Memory available now: the machine's MemAvailable, or less where a container's limit (cgroup) or this
    process's address-space limit (ulimit -v) leaves less; None where none of them can be read."""
    found = [n for n in (meminfo().get("MemAvailable"), _cgroup_left(), _address_space_left()) if n is not None]
    return min(found) if found else None


def gib(n: float) -> str:
    """Bytes in words: "1.5 GiB", "300 MiB"."""
    if n >= 2 ** 30:
        return f"{n / 2**30:,.1f} GiB"
    return f"{n / 2**20:,.0f} MiB" if n >= 10 * 2 ** 20 else f"{n / 2**20:.1f} MiB"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.I)


def parse_size(text: str | int | float, name: str = "--memory") -> int:
    """Bytes from "12G", "800M", "1.5GiB", "2e9" or a number of bytes; refused in one line (ConfigError) when it
    is not a size or is more than the machine has (MemTotal): a limit the machine cannot keep is a mistake."""
    if isinstance(text, bool):
        raise ConfigError(f"{name} must be a size such as 12G or 800M, got {text!r}")
    if isinstance(text, (int, float)):
        n = float(text)
    else:
        m = _SIZE.match(str(text))
        if m is None:
            try:
                n = float(str(text))
            except ValueError:
                raise ConfigError(f"{name} must be a size such as 12G or 800M, got {text!r}") from None
        else:
            n = float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower())
    if not n >= 2 ** 20 or n != n or n == float("inf"):
        raise ConfigError(f"{name} must be a size of at least 1M, got {text!r}")
    total = machine_bytes()
    if total is not None and n > total:
        raise ConfigError(f"{name} {text} is more than this machine's memory ({gib(total)}); give at most "
                          f"{total // 2**30}G")
    return int(n)


def set_limit(size: str | int | float | None) -> None:
    """Set (or, with None, clear) the budget for this process: `--memory`. Checked by parse_size."""
    global _limit
    _limit = None if size is None else parse_size(size)


@contextlib.contextmanager
def memory_limit(size: str | int | float | None) -> Iterator[int]:
    """The budget is `size` inside the block (None: the machine's); the previous limit is restored on exit.
    Yields the budget in bytes."""
    global _limit
    before = _limit
    set_limit(size)
    try:
        yield budget_bytes()
    finally:
        _limit = before


def _env_limit() -> int | None:
    text = os.environ.get(MEMORY_ENV, "").strip()
    return parse_size(text, MEMORY_ENV) if text else None


def budget_bytes() -> int:
    """The memory budget now: the limit set by --memory / memory_limit / $CIRCUITLAB_MEMORY, else SAFETY of the
    memory available (FALLBACK where that cannot be read)."""
    if _limit is not None:
        return _limit
    env = _env_limit()
    if env is not None:
        return env
    avail = available_bytes()
    return int(SAFETY * avail) if avail else FALLBACK


def floats(share: float) -> int:
    """float32 values `share` of the budget holds (at least 2**20, so that tiny work always runs)."""
    return max(2 ** 20, int(share * budget_bytes()) // 4)


def source() -> str:
    """Where the budget comes from, in words."""
    if _limit is not None:
        return "set by --memory"
    if os.environ.get(MEMORY_ENV, "").strip():
        return f"set by ${MEMORY_ENV}"
    avail = available_bytes()
    if avail:
        return f"{SAFETY:.0%} of the {gib(avail)} available now; --memory sets it"
    return "this machine's memory cannot be read; --memory sets it"


def describe(share: float) -> str:
    """A share of the budget in words, for a refusal: "2.6 GiB, 1/2 of the memory budget (70 % of ...)"."""
    frac = {0.5: "half", 0.25: "a quarter"}.get(share, f"{share:.0%}")
    return f"{gib(floats(share) * 4)}, {frac} of the memory budget of {gib(budget_bytes())} ({source()})"


class Estimate:
    """What a piece of work will hold at its peak and roughly how long it will take, said before it starts.

    parts: {what: bytes} held together at the peak, beyond what the process holds already (`held`: the model
    and its dictionaries); flops: the arithmetic, turned into seconds at `gflops` (the machine's measured
    matmul speed, perf.matmul_gflops) times `efficiency` (the share of it this kind of work reaches)."""

    def __init__(self, what: str, parts: Mapping[str, float], held: float = 0.0, flops: float | None = None,
                 efficiency: float = 1.0) -> None:
        self.what, self.parts, self.held = what, {k: float(v) for k, v in parts.items()}, float(held)
        self.flops, self.efficiency = flops, efficiency
        self.gflops: float | None = None
        self.disk: tuple[float, str] | None = None      # (bytes, folder) streamed to disk instead of memory

    @property
    def peak_bytes(self) -> float:
        return sum(self.parts.values())

    def seconds(self, gflops: float | None = None) -> float | None:
        """Seconds at `gflops` (default: the speed measured by `timed`), or None without a speed or flops."""
        g = gflops or self.gflops
        return None if self.flops is None or not g else self.flops / (g * 1e9 * self.efficiency)

    def timed(self, gflops: float | None = None) -> "Estimate":
        """With the machine's matmul speed measured now (or `gflops`): seconds() then says how long."""
        if gflops is None and self.flops is not None:
            from circuitlab.perf import matmul_gflops

            gflops = matmul_gflops(seconds=0.2)
        self.gflops = gflops
        return self

    def line(self) -> str:
        """"estimate: attribution graph holds ~1.2 GiB (adjacency 300 MiB, ...) beyond the 2.3 GiB loaded; ~3 min at
        90 GFLOP/s"."""
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])
        parts = ", ".join(f"{k} {gib(v)}" for k, v in top if v >= 0.01 * self.peak_bytes)
        text = f"estimate: {self.what} holds ~{gib(self.peak_bytes)} at its peak ({parts})"
        if self.held:
            text += f" beyond the {gib(self.held)} loaded"
        if self.disk:
            text += f", and {gib(self.disk[0])} offloaded to {self.disk[1]}"
        s = self.seconds()
        if s is not None:
            text += f"; ~{duration(s)} at {self.gflops:.0f} GFLOP/s"
        budget = budget_bytes()
        if self.peak_bytes > budget:
            text += f" (more than the memory budget of {gib(budget)}: {source()})"
        return text

    def to_dict(self) -> dict[str, object]:
        return {"what": self.what, "peak_bytes": self.peak_bytes, "parts": self.parts, "held_bytes": self.held,
                "flops": self.flops, "gflops": self.gflops, "seconds": self.seconds(),
                "disk_bytes": self.disk[0] if self.disk else 0}

    def __repr__(self) -> str:
        return self.line()

    @classmethod
    def one_after_another(cls, what: str, estimates: "list[Estimate]") -> "Estimate":
        """Pieces of work run one after another: the peak of the largest (its parts), the sum of the flops
        (each at its own efficiency), the loaded weights once."""
        top = max(estimates, key=lambda e: e.peak_bytes)
        timed = [e for e in estimates if e.flops is not None]
        # one efficiency for the sum: the flops-weighted harmonic mean keeps the total seconds
        flops = sum(e.flops or 0.0 for e in timed)
        slow = sum((e.flops or 0.0) / e.efficiency for e in timed)
        out = cls(what, top.parts, held=max(e.held for e in estimates), flops=flops if timed else None,
                  efficiency=flops / slow if slow else 1.0)
        out.disk = top.disk
        return out


def duration(seconds: float) -> str:
    """"40 s", "3 min", "1.5 h"."""
    if seconds < 90:
        return f"{max(seconds, 0.1):.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def tensor_bytes(*modules: object) -> int:
    """Bytes of the parameters and buffers of torch modules (what a loaded model or dictionary holds)."""
    total = 0
    for m in modules:
        for t in list(getattr(m, "parameters", lambda: [])()) + list(getattr(m, "buffers", lambda: [])()):
            total += t.numel() * t.element_size()
    return total
