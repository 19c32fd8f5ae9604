"""The explorer's request models generated from a method's options (circuitlab.spec): each field the option's
default, description and JSON-schema fragment, its value checked by the same rule the command line and the
Python API apply (a refused value is a 422 naming the field), unknown keys refused.

    TraceRequest = request_model(CausalTracingOptions, extra={"prompt": (str, Field(...))})
    req.options()     # -> CausalTracingOptions, checked
    request_model(CircuitOptions, only=("method", "steps"), limits={"steps": SERVER_STEPS})   # part, held tighter

limits: a field's rule where the explorer is stricter than the command line (it answers while you wait); its
schema and its refusals say the explorer's bound. choices: a field's choices where the explorer offers fewer.
strict: a value of the wrong kind is refused by its JSON type first (a whole number, a number, true/false, one
of the choices, text; "steps: Input should be a valid integer"), and a rule's refusal is its own line ("steps
must be a whole number from 1 to 256, got 0"), as the explorer's hand-written models answered.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import partial
from typing import Annotated, Any, ClassVar

from typing import Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      WithJsonSchema, create_model)
from pydantic_core import PydanticCustomError

from circuitlab.errors import InputError
from circuitlab.checks import Number, PerItem
from circuitlab.spec import Option, Options, check_value, description, options_of, value_schema

RULE_ERROR = "option_rule"   # the error type of a rule's refusal in a strict model (serve/app.py: its own line)


class OptionsRequest(BaseModel):
    """Base of generated request models: options() is the method's checked options dataclass."""

    model_config = ConfigDict(extra="forbid")
    options_class: ClassVar[type[Options]]

    def options(self) -> Options:
        names = {f.name for f, _ in options_of(self.options_class)}
        return self.options_class(**{k: v for k, v in self.model_dump().items() if k in names}).check()


def _json_type(f: dataclasses.Field, opt: Option) -> Any:
    """The JSON type of one option's value in a strict model (Any where a rule takes more than one kind)."""
    one: Any = (StrictBool if opt.switch else
                (StrictInt if opt.rule.kind is int else StrictInt | StrictFloat) if isinstance(opt.rule, Number) else
                Any if isinstance(opt.rule, PerItem) else
                Literal.__getitem__(tuple(opt.choices)) if opt.choices is not None else
                StrictStr)
    if opt.many and one is not Any:
        one = list[one]
    return one | None if f.default is None and one is not Any else one


def _rule_check(f: dataclasses.Field, opt: Option, value: Any) -> Any:
    try:
        return check_value(f, opt, value, InputError)
    except InputError as e:
        raise PydanticCustomError(RULE_ERROR, "{message}", {"message": str(e)}) from None


def request_model(cls: type[Options], name: str | None = None, extra: dict[str, Any] | None = None,
                  limits: Mapping[str, Number | PerItem] | None = None,
                  choices: Mapping[str, tuple[Any, ...]] | None = None, only: tuple[str, ...] | None = None,
                  strict: bool = False) -> type[OptionsRequest]:
    """A pydantic model with one field per option of cls (only: those named; plus `extra` fields, as create_model
    takes them), each held to its rule, or to limits' / choices' where the explorer is stricter."""
    defs: dict[str, Any] = {}
    limits, choices = limits or {}, choices or {}
    for f, opt in options_of(cls):
        if only is not None and f.name not in only:
            continue
        if f.name in limits:
            opt = dataclasses.replace(opt, rule=limits[f.name])
        if f.name in choices:
            opt = dataclasses.replace(opt, choices=tuple(choices[f.name]))
        check = AfterValidator(partial(_rule_check, f, opt) if strict else
                               partial(check_value, f, opt, error=InputError))  # InputError is a ValueError: 422
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        defs[f.name] = (Annotated[_json_type(f, opt) if strict else Any, check, WithJsonSchema(value_schema(f, opt))],
                        Field(default=default, description=description(f, opt)))
    model = create_model(name or cls.__name__.removesuffix("Options") + "Request", __base__=OptionsRequest,
                         **defs, **(extra or {}))
    model.options_class = cls
    return model
