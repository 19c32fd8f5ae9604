"""User-facing errors: one clear message, printed by the CLI without a traceback."""


class CircuitlabError(Exception):
    """A problem with the user's input (config, file, hook name, shape...).

    The message says what was wrong and what to do; `circuitlab` prints it and exits 2.
    """


class ConfigError(CircuitlabError, ValueError):
    """An invalid model, data or training configuration field."""



def did_you_mean(word: str, options, n: int = 1, cutoff: float = 0.6) -> str:
    """The hint an "unknown name" message ends with: " (did you mean 'x'?)" for the closest option
    (n=1), "; closest: a, b, c" for up to n of them, "" when none is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=n, cutoff=cutoff)
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if n == 1 else f"; closest: {', '.join(close)}"
