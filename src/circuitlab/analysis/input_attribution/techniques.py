"""The technique registry of input attribution: each technique (ig, saliency, ..., lime) is one registered
Technique record, beside its run function; every front end reads the registry instead of naming techniques.

    from circuitlab.analysis.input_attribution import Technique, register_technique, unregister_technique

    @dataclass(frozen=True)
    class ShiftOptions(Options):
        shift: int = option(1, COUNT, help="toy: positions shifted")

    register_technique(Technique("shifted", run_shifted, ShiftOptions, label="shifted saliency"))
    # then: `circuitlab attribute --method shifted --shift 2`, the explorer's /api/attribute and its form,
    # `circuitlab interpret --shift 2` (input_attribution runs every registered technique)

What is generated from it: `circuitlab attribute`'s options class (attribution_options: AttributeInputs' fields,
--method's choices the registered names, each technique's options between --pos and --out), the union of the
techniques' options (technique_options: interpret's input-attribution flags, the explorer's request model), and
the keywords each technique's run takes (Technique.keywords), and what a technique will hold and take
(attribution_estimate). Options two techniques both declare (shap's and
lime's samples and seed, the baseline) must be declared alike and become one flag; value options come before
switches. The built-ins are registered by the package's __init__, in the order results list them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import circuitlab.memory as memory
from circuitlab.analysis.input_attribution.base import Baseline, InputAttribution, rows_per_chunk
from circuitlab.analysis.input_attribution.options import DEFAULT_METHOD, OUT_SUFFIXES, AttributeInputs
from circuitlab.errors import CircuitlabError, ConfigError, InputError
from circuitlab.spec import KEY, Options, options_of

if TYPE_CHECKING:
    from circuitlab.model import Transformer

# Technique options the caller resolves itself (the baseline: a name, a token id or a prompt, read with the
# tokenizer), so they are not passed on as they are declared.
RESOLVED = ("baseline",)


def _one_row(values: Mapping[str, Any], n_pos: int) -> int:
    return 1


@dataclass(frozen=True)
class Technique:
    """One input-attribution technique.

    name: `--method NAME`, its key in results. run(model, tokens [pos], **keywords) -> InputAttribution.
    options: its own options class (None: it has none); its fields are run's keywords of the same names.
    label: how the explorer's form names it. baseline: the baseline it starts from by default (None: it takes
    none). removes: it removes tokens (the baseline is what a removed token becomes; 'delete' is allowed and
    start_token runs for the empty coalition). replacement: it takes the token it puts in (the tokenizer's EOS).
    progress: it takes progress=. no_target: why it explains no target (None: it explains one; run takes
    target= and foil=). keeps_positions: why 'delete' is refused (a technique that takes a baseline but removes
    none). rows(option values, n_pos): rows its batched passes run; backward: they take gradients; surrogate:
    it fits a linear surrogate to [samples, pos] coalitions (what attribution_estimate counts). check(option
    values, n_pos): refuse in one line what its run would refuse for a prompt of n_pos tokens (before any work).
    """

    name: str
    run: Callable[..., InputAttribution]
    options: type[Options] | None = None
    label: str = ""
    baseline: str | None = None
    removes: bool = False
    replacement: bool = False
    progress: bool = False
    no_target: str | None = None
    keeps_positions: str = "its positions stay where they are"
    rows: Callable[[Mapping[str, Any], int], int] = _one_row
    backward: bool = False
    surrogate: bool = False
    check: Callable[[Mapping[str, Any], int], None] | None = None

    def option_values(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Its options' values among `given` (absent or None: the declared default), the resolved ones left out."""
        given = given or {}
        if self.options is None:
            return {}
        return {f.name: f.default if given.get(f.name) is None else given[f.name]
                for f, _ in options_of(self.options) if f.name not in RESOLVED}

    def keywords(self, given: Mapping[str, Any] | None = None, *, target: int | None = None, foil: int | None = None,
                 baseline: Any = None, eos: int | None = None, progress: bool = True, tokenizer: Any = None
                 ) -> dict[str, Any]:
        """The keywords of run(): its option values (from `given`), and those of the shared inputs it takes: target
        and foil, the baseline (None: its own default), the start token and replacement token (eos), progress."""
        kw: dict[str, Any] = {"tokenizer": tokenizer, **self.option_values(given)}
        if self.no_target is None:
            kw.update(target=target, foil=foil)
        if self.baseline is not None:
            kw["baseline"] = self.baseline if baseline is None else baseline
        if self.removes and eos is not None:
            kw["start_token"] = eos
        if self.replacement:
            kw["replacement"] = eos
        if self.progress:
            kw["progress"] = progress
        return kw


_REGISTRY: dict[str, Technique] = {}


def technique_names() -> tuple[str, ...]:
    """The registered techniques' names, in the order they were registered (results list them so)."""
    return tuple(_REGISTRY)


def techniques() -> tuple[Technique, ...]:
    return tuple(_REGISTRY.values())


def get_technique(name: str) -> Technique:
    """The technique registered under `name`, or a one-line error naming the choices."""
    if name not in _REGISTRY:
        raise CircuitlabError(f"unknown attribution method {name!r}; choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def register_technique(technique: Technique) -> Technique:
    """Add a technique (refused: a name taken, an option that is a shared input's name, or one declared unlike
    another technique's option of the same name). Returns it."""
    if not technique.name or technique.name in _REGISTRY or technique.name == "all":
        raise ConfigError(f"technique name {technique.name!r} is empty, 'all' or already registered")
    shared = {f.name for f, _ in options_of(AttributeInputs)}
    declared = {name: field for name, (_, field) in _merged(techniques()).items()}
    for f, _ in options_of(technique.options) if technique.options is not None else ():
        if f.name in shared:
            raise ConfigError(f"technique {technique.name!r}: option {f.name!r} is a shared input of every technique")
        if f.name in declared and not _alike(declared[f.name], f):
            raise ConfigError(f"technique {technique.name!r}: option {f.name!r} is declared otherwise by another "
                              "technique; declare it alike (or name it differently)")
    _REGISTRY[technique.name] = technique
    return technique


def unregister_technique(name: str) -> None:
    """Remove a technique (a test's own, registered for the test)."""
    _REGISTRY.pop(name, None)


def _alike(a: dataclasses.Field, b: dataclasses.Field) -> bool:
    return a.default == b.default and a.metadata.get(KEY) == b.metadata.get(KEY) and a.type == b.type


def _merged(found: tuple[Technique, ...], left_out: tuple[str, ...] = ()) -> dict[str, tuple[Any, dataclasses.Field]]:
    """Every technique's options, each name once (the first declaration), value options before switches: name ->
    (type, field)."""
    values: dict[str, tuple[Any, dataclasses.Field]] = {}
    switches: dict[str, tuple[Any, dataclasses.Field]] = {}
    for t in found:
        for f, opt in options_of(t.options) if t.options is not None else ():
            if f.name not in values and f.name not in switches and f.name not in left_out:
                (switches if opt.switch else values)[f.name] = (f.type, f)
    return {**values, **switches}


def _copy(f: dataclasses.Field, metadata: Mapping[str, Any] | None = None) -> dataclasses.Field:
    return dataclasses.field(default=f.default, metadata=metadata if metadata is not None else f.metadata)


_CLASSES: dict[Any, type[Options]] = {}


def technique_options(name: str = "TechniqueOptions", left_out: tuple[str, ...] = (), title: str | None = None
                      ) -> type[Options]:
    """One options class holding every registered technique's options (as _merged orders them), left_out left
    out: interpret's input-attribution options, the explorer's request model. Made again when the registry
    changes (the same class while it does not)."""
    key = (name, left_out, title, tuple((t.name, t.options) for t in techniques()))
    if key not in _CLASSES:
        cls: Any = dataclasses.make_dataclass(name, [(n, typ, _copy(f)) for n, (typ, f) in _merged(techniques(),
                                                                                              left_out).items()],
                                         bases=(Options,), frozen=True)
        cls.title = title
        cls.__module__ = __name__
        _CLASSES[key] = cls
    return _CLASSES[key]


@dataclass(frozen=True)
class AttributionChecks(Options):
    """What `circuitlab attribute`'s options class (attribution_options) adds to each field's rule (it has no
    fields of its own): the checks between fields, and the keywords its technique's run takes."""

    def check(self, error: type[Exception] = InputError) -> Any:
        """Each field's rule, then what holds between fields: an output file .html or .json, no target or foil for
        a technique that explains none (context mixing reads attention), the 'delete' baseline only where tokens
        may leave (shap, lime)."""
        checked: Any = super().check(error)
        technique = get_technique(checked.method)
        if checked.out and PurePath(checked.out).suffix not in OUT_SUFFIXES:
            raise error(f"--out {checked.out}: give a file name ending in .html (tokens shaded) or .json")
        if technique.no_target is not None and (checked.target is not None or checked.foil is not None):
            raise error(f"{technique.no_target}: drop --target/--foil")
        if technique.baseline is not None and not technique.removes and getattr(checked, "baseline", None) == "delete":
            removing = [t.name for t in techniques() if t.removes]
            raise error(f"--baseline delete is for {' and '.join(removing)} ({technique.keeps_positions}): give "
                        "zeros, mean, eos, token:N or a prompt")
        return checked

    def method_keywords(self) -> dict[str, Any]:
        """The keywords of attribute_inputs(..., self.method) these options set, beside the tokens' own (target,
        foil, baseline, start_token, replacement: the command reads them with its tokenizer)."""
        technique = get_technique(getattr(self, "method"))
        return {"pos": getattr(self, "pos"), **technique.option_values(self.to_dict())}


def attribution_options() -> type[Options]:
    """`circuitlab attribute`'s options class, from the registry: AttributeInputs' fields with --method's choices
    the registered techniques, each technique's options between --pos and --out. The same class while the
    registry does not change (AttributionOptions is the built-ins')."""
    key = ("AttributionOptions", tuple((t.name, t.options) for t in techniques()))
    if key not in _CLASSES:
        shared = [(f.name, f.type, f) for f, _ in options_of(AttributeInputs)]
        method = next(f for n, _, f in shared if n == "method")
        choices = {**method.metadata, KEY: dataclasses.replace(method.metadata[KEY], choices=technique_names())}
        own = [(n, typ, _copy(f)) for n, (typ, f) in _merged(techniques()).items()]
        head = [(n, typ, _copy(f, choices if n == "method" else None)) for n, typ, f in shared if n != "out"]
        tail = [(n, typ, _copy(f)) for n, typ, f in shared if n == "out"]
        cls: Any = dataclasses.make_dataclass("AttributionOptions", head + own + tail, bases=(AttributionChecks,),
                                         frozen=True)
        cls.__doc__ = ("`circuitlab attribute`: what is explained (checkpoint, prompt, target, foil, pos), by which "
                       "technique and how (each registered technique's options), and where the result goes (out).")
        cls.__module__ = __name__
        _CLASSES[key] = cls
    return _CLASSES[key]


def attribution_estimate(model: Transformer, n_pos: int, method: str = DEFAULT_METHOD, steps: int | None = None,
                         samples: int | None = None, batch_size: int | None = None,
                         baseline: Baseline | None = None, **values: Any) -> memory.Estimate:
    """What attribute_inputs(model, tokens [n_pos], method) holds at its peak and computes: one chunk of rows
    (the technique's rows: path points for ig, occluded copies, coalitions for shap and lime), each a forward pass
    of the prompt (and a backward pass for the gradient methods), and the regression's [samples, pos] for shap and
    lime; or, where larger, the mean baseline's embedding of every token (made, then freed, before the rows;
    baseline None: the method's default, mean for shap and lime). context-mixing and the single-gradient methods
    are one pass. steps, samples, values: the technique's option values (None: its defaults)."""
    from circuitlab.model import model_dtype
    from circuitlab.perf import transformer_step_flops

    technique = get_technique(method)
    given = technique.option_values({"steps": steps, "samples": samples, **values})
    cfg = model.cfg
    size = model_dtype(model).itemsize
    rows = technique.rows(given, n_pos)
    backward = technique.backward
    chunk = min(rows, batch_size or rows_per_chunk(model, n_pos, backward))
    # What a row holds (measured on GPT-2 small's shape with a peak-memory script: ~12-15 [pos, d_model] per
    # layer with gradients, ~15 [pos, d_model] in all without; rows_per_chunk's own sizing is more cautious).
    mlp = (3 if cfg.mlp in ("swiglu", "geglu") else 2) * (0 if cfg.attn_only else cfg.mlp_dim)
    per_pos = 10 * cfg.d_model + mlp + cfg.n_heads * n_pos
    held = n_pos * (per_pos * max(cfg.n_layers, 1) if backward else 7 * cfg.d_model + 1.25 * mlp) + 2 * cfg.d_vocab
    parts = {f"a chunk of {chunk} rows": chunk * held * size}
    mean = baseline == "mean" or (baseline is None and technique.baseline == "mean")
    if mean and cfg.d_vocab * cfg.d_model * size > parts[f"a chunk of {chunk} rows"]:
        parts = {"the mean baseline's embedding of every token": cfg.d_vocab * cfg.d_model * size}
    if technique.surrogate:
        # the design, its weights, a copy (float64)
        parts["the regression's coalitions"] = 3 * given["samples"] * n_pos * 8
    # the blocks over every position, the read-out at the explained one
    flops = (transformer_step_flops(cfg, rows * n_pos, n_pos, backward=backward)
             - rows * (n_pos - 1) * 2 * cfg.d_model * cfg.d_vocab * (3 if backward else 1))
    return memory.Estimate(f"input attribution ({method}, {rows:,} row{'s' if rows != 1 else ''} of {n_pos} tokens in "
                           f"chunks of {chunk})", parts, held=memory.tensor_bytes(model), flops=flops, efficiency=1.0)
