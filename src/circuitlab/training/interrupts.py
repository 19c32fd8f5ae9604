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
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from circuitlab.errors import command_line


@contextlib.contextmanager
def stop_after_step_on_ctrl_c() -> Iterator[threading.Event]:
    """Yields an event the first Ctrl-C sets (a second one raises KeyboardInterrupt at once). Only in the
    main thread, where Python delivers signals; elsewhere the event is never set."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("\nstopping after this step to save a checkpoint (Ctrl-C again to stop at once)", file=sys.stderr)

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
