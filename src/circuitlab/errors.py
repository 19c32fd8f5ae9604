"""User-facing errors: one clear message, printed by the CLI without a traceback."""


class CircuitlabError(Exception):
    """A problem with the user's input (config, file, hook name, shape...).

    The message says what was wrong and what to do; `circuitlab` prints it and exits 2.
    """


class ConfigError(CircuitlabError, ValueError):
    """An invalid model, data or training configuration field."""
