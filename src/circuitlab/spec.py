"""A method's options, declared once: one dataclass whose fields carry their default, their rule, their help
and their command-line details. The command line, the config schema, the explorer's request model
(serve/requests.py) and the Python keywords are all generated from it, so they cannot disagree.

    @dataclass(frozen=True)
    class TracingOptions(Options):
        noise_samples: int = option(10, COUNT, help="corrupted runs averaged (default {default})", metavar="N")
        noise: str = option("gaussian", choices=("gaussian", "uniform", "replace"), help="...")
        subject: str | None = option(None, help="the words to corrupt")        # text; None: not given

    add_arguments(parser, TracingOptions)       # --noise-samples N (type=COUNT.arg), --noise {...}, --subject
    TracingOptions.from_args(args)              # the parsed namespace -> checked options
    TracingOptions(noise_samples=0).check()     # InputError: noise_samples must be a whole number >= 1, got 0
    TracingOptions.from_dict(d)                 # a config / JSON: unknown keys refused, every rule applied
    schema(TracingOptions)                      # JSON schema: types, bounds, enums, defaults, descriptions

A field's kind: its rule's (checks.Number / PerItem), str with choices, a switch (a bool default: --flag sets
True; a True default needs a flag that turns it off, e.g. progress: flag="--no-progress"), or plain text;
nargs="+" makes it a tuple of those (a list in JSON). A default of None means "not given" (then None is
accepted), unless required=True (the command line requires it; check() refuses None). aliases: more spellings of
the flag (--checkpoint, --model); a flag without "--" is positional; nargs="?" with a const: the flag alone
means const (--refine: "batched"), its value one item, not a list. Text takes a path too (os.PathLike, kept as
its str). arg: the command line's reading when it is not the rule's (e.g. float: the method's check says why a
value is refused, in its own words, after parsing). repeat=True: a flag given once per value (--set A --set B),
a tuple of them (default ()). Only the ground floor is imported here: every layer may
declare options.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from circuitlab.checks import Number, PerItem
from circuitlab.display import Displayed
from circuitlab.errors import ConfigError, InputError, refuse_unknown

T = TypeVar("T", bound="Options")
R = TypeVar("R", bound="Result")
KEY = "circuitlab.option"   # the field metadata key


@dataclass(frozen=True)
class Option:
    """What one field declares beyond its default: rule (a Number or PerItem) or choices (else text), help
    (may say "{default}"), the flag (default --field-name) and its aliases, metavar, nargs ("+": one or more;
    "?": the value is optional, the flag alone means const), required (None refused), switch (a bool: the flag
    sets the opposite of the default), arg (the command line's type= instead of the rule's), repeat (the flag
    may be given again: each time adds one value to the tuple)."""

    rule: Number | PerItem | None = None
    choices: tuple[Any, ...] | None = None
    help: str = ""
    flag: str | None = None
    metavar: str | None = None
    nargs: str | None = None
    required: bool = False
    switch: bool = False
    aliases: tuple[str, ...] = ()
    arg: Callable[[str], Any] | None = None
    const: Any = None
    repeat: bool = False

    @property
    def many(self) -> bool:
        """A list of values (nargs "+" or "*", or a repeated flag), not one ("?" is one value or none)."""
        return self.repeat or self.nargs not in (None, "?")

    def problem(self, value: Any) -> str | None:
        """Why one value (one item when nargs) breaks this option's rule (the text after "must be"), or None."""
        if self.switch:
            return None if isinstance(value, bool) else "true or false"
        if self.rule is not None:
            return self.rule.problem(value)
        if self.choices is not None:
            return None if value in self.choices else f"one of {', '.join(map(str, self.choices))}"
        return None if isinstance(value, (str, os.PathLike)) else "text"

    def check_one(self, value: Any, name: str, error: type[Exception]) -> Any:
        if self.rule is not None and not self.switch:
            return self.rule.check(value, name, error)
        why = self.problem(value)
        if why is not None:
            raise error(f"{name} must be {why}, got {value!r}")
        return os.fspath(value) if isinstance(value, os.PathLike) else value


def option(default: Any, rule: Number | PerItem | None = None, *, help: str, choices: tuple[Any, ...] | None = None,
           flag: str | None = None, metavar: str | None = None, nargs: str | None = None, required: bool = False,
           aliases: tuple[str, ...] = (), arg: Callable[[str], Any] | None = None, const: Any = None,
           repeat: bool = False) -> Any:
    """A dataclass field declaring one option (see the module docstring); its default is written here only."""
    if isinstance(default, list):
        default = tuple(default)   # frozen and shared safely
    if required and default is not None:
        raise TypeError("a required option has no default (None)")
    switch = isinstance(default, bool)
    if default is True and flag is None:
        raise TypeError("a switch that defaults to True needs the flag that turns it off (flag='--no-...')")
    if repeat and (nargs is not None or not isinstance(default, tuple)):
        raise TypeError("a repeated flag takes one value each time and defaults to a tuple (usually ())")
    meta = Option(rule, tuple(choices) if choices is not None else None, help, flag, metavar, nargs, required,
                  switch, tuple(aliases), arg, const, repeat)
    return dataclasses.field(default=default, metadata={KEY: meta})


def options_of(cls: Any) -> list[tuple[dataclasses.Field, Option]]:
    """The declared options of an options class (or instance), in order."""
    return [(f, f.metadata[KEY]) for f in fields(cls) if KEY in f.metadata]


def check_value(f: dataclasses.Field, opt: Option, value: Any, error: type[Exception] = InputError) -> Any:
    """One option's value checked (an int for a float rule comes back a float; a list as a tuple), or a one-line
    error naming the field."""
    if value is None and f.default is None:
        if opt.required:
            raise error(f"{f.name} is required")
        return None
    if not opt.many:
        return opt.check_one(value, f.name, error)
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or (opt.nargs == "+" and not value):
        raise error(f"{f.name} must be a list of {opt.problem(object()) or 'values'}, got {value!r}")
    return tuple(opt.check_one(v, f"{f.name}[{i}]", error) for i, v in enumerate(value))


class Options:
    """Base of options dataclasses (decorate the subclass with @dataclass(frozen=True)). title: the heading of
    its command-line group (None: no group)."""

    title: ClassVar[str | None] = None

    def check(self: T, error: type[Exception] = InputError) -> T:
        """These options with every field's rule applied (values normalised), or a one-line error."""
        checked = {f.name: check_value(f, opt, getattr(self, f.name), error) for f, opt in options_of(self)}
        return dataclasses.replace(self, **checked)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any], error: type[Exception] = ConfigError) -> T:
        """Options from a config or JSON object: unknown keys refused (with a did-you-mean), every rule applied."""
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        try:
            refuse_unknown(list(d), known, f"{cls.__name__} option(s)", list_known=True)
        except ConfigError as e:
            raise error(str(e)) from None
        return cls(**d).check(error)

    @classmethod
    def from_args(cls: type[T], args: argparse.Namespace) -> T:
        """The options a parsed command line holds (add_arguments made its flags)."""
        return cls(**{f.name: getattr(args, f.name) for f, _ in options_of(cls)}).check()


def same(cls: type[Options], name: str) -> Any:
    """A dataclass field declared as cls declares its option `name` (the same default, rule and help): a class
    that holds another's option in its own order (CircuitOptions holds DiscoveryOptions' metric, ...)."""
    f = next((f for f, _ in options_of(cls) if f.name == name), None)
    if f is None:
        raise KeyError(f"{cls.__name__} has no option {name}")
    return dataclasses.field(default=f.default, metadata=f.metadata)


def only(cls: type[Options], names: tuple[str, ...], name: str) -> type[Options]:
    """An options class `name` with only the fields `names` of cls, declared as cls declares them (the same
    defaults, rules and help): a front end that offers part of a method's options."""
    kept = [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
            for f, _ in options_of(cls) if f.name in names]
    missing = set(names) - {k[0] for k in kept}
    if missing:
        raise KeyError(f"{cls.__name__} has no option(s) {', '.join(sorted(missing))}")
    return dataclasses.make_dataclass(name, kept, bases=(Options,), frozen=True)


def help_text(f: dataclasses.Field, opt: Option) -> str:
    """The option's help for argparse (which reads "%%" as "%")."""
    default = f.default
    return opt.help.format(default=default) if "{default" in opt.help else opt.help


def description(f: dataclasses.Field, opt: Option) -> str:
    """The option's help as a reader sees it (a schema's description, the explorer's form)."""
    return help_text(f, opt).replace("%%", "%")


def add_arguments(parser: Any, cls: type[Options]) -> Any:
    """One argparse argument per option of cls (in a group titled cls.title, if any): type= the rule's .arg, so
    the command line refuses what check() refuses; default= the field's default. Returns the group."""
    group = parser.add_argument_group(cls.title) if cls.title else parser
    for f, opt in options_of(cls):
        flag = opt.flag or "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {"help": help_text(f, opt)}
        if flag.startswith("-"):
            kw["dest"] = f.name
        if opt.required and flag.startswith("-"):
            kw["required"] = True
        elif not opt.required:
            kw["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        if opt.switch:
            group.add_argument(flag, *opt.aliases, action="store_false" if f.default else "store_true", **kw)
            continue
        if opt.arg is not None:
            kw["type"] = opt.arg
        elif opt.rule is not None:
            kw["type"] = opt.rule.arg
        if opt.choices is not None:
            kw["choices"] = opt.choices
        if opt.repeat:
            kw["action"] = "append"   # argparse appends to a copy of the default list
        for key in ("metavar", "nargs", "const"):
            if getattr(opt, key) is not None:
                kw[key] = getattr(opt, key)
        group.add_argument(flag, *opt.aliases, **kw)
    return group


def value_schema(f: dataclasses.Field, opt: Option) -> dict[str, Any]:
    """One option as a JSON-schema fragment: type and bounds (or enum), array for nargs, null when optional."""
    one: dict[str, Any] = ({"type": "boolean"} if opt.switch else
                           opt.rule.schema() if isinstance(opt.rule, Number) else
                           {"anyOf": [opt.rule.one.schema(), {"type": "array", "items": opt.rule.each.schema(),
                                                              "minItems": 1}]} if isinstance(opt.rule, PerItem) else
                           {"enum": list(opt.choices)} if opt.choices is not None else {"type": "string"})
    if opt.many:
        one = {"type": "array", "items": one, **({"minItems": 1} if opt.nargs == "+" else {})}
    if f.default is None and not opt.required:
        one = {"anyOf": [one, {"type": "null"}]}
    return one


def schema(cls: type[Options]) -> dict[str, Any]:
    """The options as a JSON schema (a config file's, the explorer's OpenAPI document)."""
    props, required = {}, []
    for f, opt in options_of(cls):
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        props[f.name] = {**value_schema(f, opt), "description": description(f, opt)}
        if opt.required:
            required.append(f.name)
        else:
            props[f.name]["default"] = default
    return {"title": cls.__name__, "type": "object", "properties": props, "additionalProperties": False,
            **({"required": required} if required else {})}


class Result(Displayed):
    """Base of typed results (decorate the subclass with @dataclass): to_dict() is the JSON form (a field with
    its own to_dict is written by it), from_dict(d) reads it back (override where a field is itself typed);
    displays in Jupyter by the renderer viz registered (circuitlab.display)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any]) -> R:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
