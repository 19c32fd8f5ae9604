"""What every method module declares (its Method record) and shares (the result base, the prompt's tokens).

A method module holds, in one place: its options (a circuitlab.spec.Options dataclass), its run function, its
typed result (a MethodResult: to_dict is its results.json entry, from_dict reads it back), its report section
and its view. The registry (circuitlab.methods.REGISTRY) lists the Method records; `interpret`, its command line
and the report iterate over it.
"""
from __future__ import annotations

import html
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch

import circuitlab.memory as memory
from circuitlab.data.stories import DEFAULT_PROMPT
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.spec import Options, Result, options_of
from circuitlab.viz.fragments import Section

if TYPE_CHECKING:
    from circuitlab.model import Transformer


@dataclass
class MethodResult(Result):
    """A method's findings: summary (one sentence per finding, every number from data) and figures (PNG file
    names in the output folder), then the method's own fields. to_dict() writes the method's fields first and
    summary, figures last (the results.json layout); a field whose default is None is left out while None (a
    finding that was not made)."""

    name: ClassVar[str] = ""
    summary: list[str]
    figures: list[str]

    def to_dict(self) -> dict[str, Any]:
        absent = {f.name for f in fields(self) if f.default is None and getattr(self, f.name) is None}
        own = {k: v for k, v in super().to_dict().items() if k not in ("summary", "figures") and k not in absent}
        return {**own, "summary": list(self.summary), "figures": list(self.figures)}

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.summary)
        return f"<b>{html.escape(self.name)}</b><ul>{items}</ul>"


@dataclass(frozen=True)
class NoOptions(Options):
    """The options of a method that has none of its own (it reads only the shared inputs)."""


@dataclass(frozen=True)
class Method:
    """One method in the registry.

    name: `interpret --experiments NAME` and its key in results.json. options / result: its classes (options_spec:
    the options class, or a function making it where a registry declares the options: input attribution's
    techniques; options is the class either way). inputs: the
    inputs `interpret` shares between methods that it reads (prompt; clean, corrupt; lens; progress).
    run(model, tokenizer, out_dir, options, **inputs) -> result. section(result) -> its report Section (None: the
    report draws it from the run's model, reading the result: circuits, heads). needs: the model.assumptions it
    requires. needs_text: False when it reads only weights and token ids (it runs without a tokenizer). check(model, tokenizer, options, **inputs): refuse bad input in one
    line before any work (methods sharing a check run it once). missing(options, **inputs): (the refusal when the
    method is asked for, the warning when it is left out of the default set) when the inputs cannot run it.
    estimate(model, tokenizer, options, **inputs): what it would hold and take (a memory.Estimate).
    """

    name: str
    options_spec: type[Options] | Callable[[], type[Options]]
    result: type[MethodResult]
    run: Callable[..., MethodResult]
    section: Callable[[Any], Section] | None
    inputs: tuple[str, ...] = ("prompt",)
    needs: tuple[str, ...] = ()
    needs_text: bool = True
    check: Callable[..., None] | None = None
    missing: Callable[..., tuple[str, str] | None] | None = None
    estimate: Callable[..., Any] | None = None

    @property
    def options(self) -> type[Options]:
        """The options class (made now from its registry where options_spec is a function)."""
        spec: Any = self.options_spec
        return spec if isinstance(spec, type) and issubclass(spec, Options) else spec()

    def options_from(self, given: Mapping[str, Any]) -> Options:
        """This method's options among `given` (keyword arguments of several methods; None = the default),
        checked: a bad value is one InputError naming the option."""
        names = {f.name for f, _ in options_of(self.options)}
        return self.options.from_dict({k: v for k, v in given.items() if k in names and v is not None}, InputError)

    def inputs_from(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The shared inputs this method reads, from interpret's keyword arguments (absent ones left out)."""
        return {k: given[k] for k in self.inputs if k in given}

    def run_with(self, model: Transformer, tokenizer: Any, out_dir: Any, given: Mapping[str, Any]) -> MethodResult:
        """run() on interpret's keyword arguments: this method's options and inputs picked out of them."""
        return self.run(model, tokenizer, out_dir, self.options_from(given), **self.inputs_from(given))

    def report_section(self, found: Mapping[str, Any]) -> Section:
        """The report section of a results.json entry, read back as the typed result."""
        if self.section is None:
            raise TypeError(f"{self.name}'s section is drawn from the run's model (report/sections.py)")
        return self.section(self.result.from_dict(dict(found)))


def check_prompt(model: "Transformer", tokenizer: Any, options: Options, prompt: str | None = None, **_: Any) -> None:
    """The check of a method that encodes the prompt: not empty (a long prompt warns once, when it runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompt_tokens(model, tokenizer, prompt)


def prompt_tokens(model: "Transformer", tokenizer: Any, prompt: str | None) -> torch.Tensor:
    """The prompt's tokens [pos] (None: the default story prompt), keeping the last n_ctx (with a warning
    when the prompt was the user's)."""
    ids = tokenizer.encode(DEFAULT_PROMPT if prompt is None else prompt)
    if not ids:
        raise CircuitlabError("the prompt is empty (or encodes to no tokens); give some text with --prompt, "
                              "or leave --prompt out for the default story")
    if len(ids) > model.cfg.n_ctx and prompt is not None:  # the user's prompt is not silently cut
        warnings.warn(f"the prompt is {len(ids)} tokens, longer than the model's context of {model.cfg.n_ctx}: "
                      f"only its last {model.cfg.n_ctx} tokens are analysed", stacklevel=2)
    return torch.tensor(ids[-model.cfg.n_ctx:], dtype=torch.long)


FIGURE_SECONDS = 2.0   # one PNG figure drawn by matplotlib (SmolLM2's circuits figures: ~2.4 s each under load)


def figures_estimate(model: "Transformer", n: int) -> memory.Estimate:
    """n figures saved as PNG: not arithmetic, counted as FIGURE_SECONDS each at the 150 GFLOP/s reference."""
    return memory.Estimate(f"{n} figures", {}, held=memory.tensor_bytes(model), flops=n * FIGURE_SECONDS * 150e9)


def one_prompt_estimate(name: str) -> Callable[..., memory.Estimate]:
    """The estimate of a method that reads one prompt (or, without a tokenizer, the weights and 16 tokens): the
    prompt's cache at every hook (`interpret --estimate`)."""
    def estimate(model: Transformer, tokenizer: Any, options: Any, prompt: str | None = None, **_: Any
                 ) -> memory.Estimate:
        from circuitlab.model.transformer import cache_estimate

        n = len(prompt_tokens(model, tokenizer, prompt)) if tokenizer is not None else min(16, model.cfg.n_ctx)
        est = cache_estimate(model, 1, n)
        est.what = f"{name} (the prompt's {n} tokens cached)"
        return est
    return estimate
