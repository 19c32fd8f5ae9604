"""Stopping a long job (model, dictionary, lens training; graphs, CLTs) so that nothing is lost:

    with stop_after_step_on_ctrl_c() as stop:
        for step in ...:
            ...one step...
            if stop.is_set():
                save(...)
                raise KeyboardInterrupt(interrupted_message(step, saved_step=step, where=ckpt))

The first Ctrl-C lets the step finish (the loop saves and stops); a second stops at once. The message says
the step reached, the step of the last checkpoint and where it is, and the command that continues
(`circuitlab ... --resume`, from circuitlab.errors.command_line) or, with nothing saved, that the same
command starts over.

The termination signal (SIGTERM: what `kill`, a scheduler or `docker stop` sends) does what Ctrl-C does:
`circuitlab` runs every command inside stop_signals_as_ctrl_c(), which hands SIGTERM to whatever SIGINT
handler is in place (a loop's above, or Python's KeyboardInterrupt). A stage with nothing of its own to say
is wrapped in continue_on_interrupt(stage, saved), which says what is kept and the command that continues.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from circuitlab.errors import command_line


_stopped_by: int | None = None   # the last stop signal received (SIGINT or SIGTERM), for the exit status


def stopped_by() -> int:
    """The signal that stopped the command: SIGTERM when the termination signal came, else SIGINT."""
    return _stopped_by or signal.SIGINT


def note_stop(signum: int) -> None:
    """Record the signal that stopped the command, for one that caught it itself (the explorer's server)."""
    global _stopped_by
    _stopped_by = signum


def _signal_name(signum: int) -> str:
    return "the termination signal" if signum == signal.SIGTERM else "Ctrl-C"


@contextlib.contextmanager
def stop_signals_as_ctrl_c() -> Iterator[None]:
    """For the length of a command: SIGTERM runs the SIGINT handler in place at that moment (so every loop that
    saves on Ctrl-C saves on it too; elsewhere it raises KeyboardInterrupt). Main thread only; the previous
    handlers are restored on exit."""
    global _stopped_by
    _stopped_by = None
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        global _stopped_by
        _stopped_by = signum
        current = signal.getsignal(signal.SIGINT)
        if callable(current) and current is not signal.default_int_handler:
            current(signum, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stop_after_step_on_ctrl_c() -> Iterator[threading.Event]:
    """Yields an event the first Ctrl-C sets (a second one raises KeyboardInterrupt at once). Only in the
    main thread, where Python delivers signals; elsewhere the event is never set."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        global _stopped_by
        _stopped_by = signum
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(f"\n{_signal_name(signum)}: stopping after this step to save a checkpoint ({_signal_name(signum)} "
              "again stops at once)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_message(step: int, saved_step: int | None, where: str | Path | None,
                        python_resume: str = "the same call (it resumes from there)") -> str:
    """One line: "stopped at step 37; the last checkpoint (OUT/checkpoint) is at step 30; continue with:
    circuitlab ... --resume". saved_step None: nothing saved yet, the same command starts over. Called from
    Python rather than the command line, it says `python_resume` instead of the command."""
    if saved_step is None or where is None:
        again = command_line(drop=("--resume",))
        return (f"stopped at step {step}, before the first checkpoint; the same command starts over (the folder is "
                f"reused){f': {again}' if again else ''}")
    again = command_line(add="--resume", drop=("--overwrite",))
    head = (f"stopped at step {step} and saved {where}" if saved_step == step
            else f"stopped at step {step}; the last checkpoint ({where}) is at step {saved_step}")
    return f"{head}; continue with{f': {again}' if again else ' ' + python_resume}"


def stage_interrupted(stage: str, saved: str | None, python_resume: str = "the same call with resume=True") -> str:
    """One line for a stop in a stage with nothing of its own to say: "stopped while making the graphs; the model
    and the transcoders in runs/graphs are kept; continue with: circuitlab graph demo ... --resume", or, with
    nothing saved (saved None), that the same command starts over."""
    if saved is None:
        return restart_message(f"stopped while {stage}")
    again = command_line(add="--resume", drop=("--overwrite",))
    return f"stopped while {stage}; {saved} kept; continue with{f': {again}' if again else ' ' + python_resume}"


def restart_message(head: str = "stopped") -> str:
    """What a stop in a command that saves nothing along the way says: the same command starts over."""
    again = command_line()   # as given: with --resume it goes on from what an earlier run saved
    return f"{head} before anything was saved; the same command starts over{f': {again}' if again else ''}"


@contextlib.contextmanager
def continue_on_interrupt(stage: str, saved: str | None, python_resume: str = "the same call with resume=True"
                          ) -> Iterator[None]:
    """A Ctrl-C or termination signal inside `stage` whose code said nothing (a bare KeyboardInterrupt) becomes
    stage_interrupted(stage, saved); a stop that already says how to continue (a training loop's) passes as it is."""
    try:
        yield
    except KeyboardInterrupt as e:
        if str(e):
            raise
        raise KeyboardInterrupt(stage_interrupted(stage, saved, python_resume)) from None
