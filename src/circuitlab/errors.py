"""User-facing errors: one clear message, printed by the CLI without a traceback."""


class CircuitlabError(Exception):
    """A problem with the user's input (config, file, hook name, shape...).

    The message says what was wrong and what to do; `circuitlab` prints it and exits 2.
    """


class ConfigError(CircuitlabError, ValueError):
    """An invalid model, data or training configuration field."""


class InputError(CircuitlabError, ValueError):
    """An invalid argument value: token ids outside the vocabulary, a sampling option out of range,
    text that is not valid Unicode, a count that must be positive."""


def did_you_mean(word: str, options, n: int = 1, cutoff: float = 0.6) -> str:
    """The hint an "unknown name" message ends with: " (did you mean 'x'?)" for the closest option
    (n=1), "; closest: a, b, c" for up to n of them, "" when none is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=n, cutoff=cutoff)
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if n == 1 else f"; closest: {', '.join(close)}"


# errno name -> what to say (after the path) and what to do, for the OSErrors a user's environment causes
# (full disk, permissions, a file where a folder should be). Others are bugs and keep their traceback.
_OS_ERRORS = {
    "ENOSPC": "no space left on the device; free some space or write elsewhere (e.g. another --out)",
    "EDQUOT": "the disk quota is used up; free some space or write elsewhere (e.g. another --out)",
    "EACCES": "permission denied; choose a path you can write to (e.g. another --out) or fix its permissions",
    "EPERM": "operation not permitted; choose a path you can write to (e.g. another --out) or fix its permissions",
    "EROFS": "the file system is read-only; choose a writable path (e.g. another --out)",
    "ENOTDIR": "part of the path is a file, not a folder; choose another path",
    "EEXIST": "exists and is not a folder; choose another path",
    "EISDIR": "is a folder where a file was expected; give a file name",
    "ENAMETOOLONG": "the path is too long; choose a shorter one",
}


def os_error_message(e: OSError) -> str | None:
    """One line for an OSError the user's environment caused (ENOSPC, EACCES, EROFS, ENOTDIR, ...),
    naming the path and what to do; None for any other OSError."""
    import errno

    name = errno.errorcode.get(e.errno or -1)
    if name not in _OS_ERRORS:
        return None
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{_OS_ERRORS[name]}"


def refuse_unknown(given, known, what: str, list_known: bool = False) -> None:
    """A ConfigError naming every name in `given` that is not in `known`, each with its did-you-mean hint:
    what="ModelConfig field(s)" -> "unknown ModelConfig field(s): n_layer (did you mean 'n_layers'?)".
    list_known: end with the valid names (for short lists)."""
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if unknown:
        hint = "".join(did_you_mean(u, known) for u in unknown)
        valid = f"; valid: {', '.join(map(str, known))}" if list_known else ""
        raise ConfigError(f"unknown {what}: {', '.join(map(str, unknown))}{hint}{valid}")


# The command line being run (set by circuitlab.cli.main), so that a message can say what to run next
# ("continue with: circuitlab sae train ... --resume"). None when called from Python.
_COMMAND_LINE: list[str] | None = None


def set_command_line(argv: list[str] | None) -> None:
    global _COMMAND_LINE
    _COMMAND_LINE = list(argv) if argv is not None else None


def command_line(add: str | None = None, drop: tuple[str, ...] = ()) -> str | None:
    """The running `circuitlab ...` command line, shell-quoted, with `add` appended when missing and the
    `drop` flags removed (e.g. add="--resume", drop=("--overwrite",)); None outside the CLI."""
    import shlex

    if _COMMAND_LINE is None:
        return None
    argv = [a for a in _COMMAND_LINE if a not in drop]
    if add and add not in argv:
        argv.append(add)
    return " ".join(shlex.quote(a) for a in ["circuitlab", *argv])


def out_of_memory_message(e: BaseException) -> str | None:
    """One line for an allocation the machine refused (MemoryError, torch's out-of-memory error, the CPU
    allocator's "can't allocate memory" under a memory limit), saying how much was asked; None for any other
    error. The last resort: options that set sizes are refused before any work, naming the limit."""
    import re

    text = str(e)
    if not (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or (isinstance(e, RuntimeError) and "can't allocate memory" in text)):
        return None
    asked = re.search(r"tried to allocate (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)", text, re.I)
    size = ""
    if asked:
        n, unit = float(asked.group(1)), asked.group(2)
        n *= {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]
        size = f" (it asked for {n / 2**30:,.1f} GiB at once)"
    return f"out of memory{size}: the machine refused the allocation; give smaller sizes (batch, tokens, model)"
