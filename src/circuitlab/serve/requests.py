"""The explorer's request models generated from a method's options (circuitlab.spec): each field the option's
default, description and JSON-schema fragment, its value checked by the same rule the command line and the
Python API apply (a refused value is a 422 naming the field), unknown keys refused.

    TraceRequest = request_model(CausalTracingOptions, extra={"prompt": (str, Field(...))})
    req.options()     # -> CausalTracingOptions, checked
"""
from __future__ import annotations

from functools import partial
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, create_model

from circuitlab.errors import InputError
from circuitlab.spec import Options, check_value, description, options_of, value_schema


class OptionsRequest(BaseModel):
    """Base of generated request models: options() is the method's checked options dataclass."""

    model_config = ConfigDict(extra="forbid")
    options_class: ClassVar[type[Options]]

    def options(self) -> Options:
        names = {f.name for f, _ in options_of(self.options_class)}
        return self.options_class(**{k: v for k, v in self.model_dump().items() if k in names}).check()


def request_model(cls: type[Options], name: str | None = None, extra: dict[str, Any] | None = None
                  ) -> type[OptionsRequest]:
    """A pydantic model with one field per option of cls (plus `extra` fields, as create_model takes them)."""
    defs: dict[str, Any] = {}
    for f, opt in options_of(cls):
        check = AfterValidator(partial(check_value, f, opt, error=InputError))  # InputError is a ValueError: 422
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        defs[f.name] = (Annotated[Any, check, WithJsonSchema(value_schema(f, opt))],
                        Field(default=default, description=description(f, opt)))
    model = create_model(name or cls.__name__.removesuffix("Options") + "Request", __base__=OptionsRequest,
                         **defs, **(extra or {}))
    model.options_class = cls
    return model
