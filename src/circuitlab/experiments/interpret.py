"""Run named analyses on a checkpoint: the engine behind `circuitlab interpret`.

The experiments are the registry's methods (circuitlab.methods.REGISTRY: one module each).
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from circuitlab.atomic import atomic_dir, json_text, set_aside
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.methods.base import MethodResult
from circuitlab.spec import Options, option

if TYPE_CHECKING:
    from circuitlab.model import Transformer


SHARED = ("prompt", "clean", "corrupt", "lens")   # the inputs the methods share (each Method.inputs names its own)


@dataclass(frozen=True)
class InterpretInputs(Options):
    """What `interpret` reads besides each method's own options: the checkpoint, which experiments, the inputs
    the methods share (SHARED) and where the results go. The command's flags, run_interpret's keywords and
    interpret_estimates read them."""

    checkpoint: str | None = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    experiments: tuple[str, ...] | None = option(None, nargs="+", help="which analyses to run (default: all "
                                                                       "available); see the list in the error for "
                                                                       "names")
    prompt: str | None = option(None, help="text for the logit lens and attribution")
    clean: str | None = option(None, help="clean prompt for patching")
    corrupt: str | None = option(None, help="corrupted prompt for patching (same token length as --clean)")
    lens: str | None = option(None, help="a tuned-lens folder for the tuned_lens experiment (default: "
                                         "<checkpoint>/tuned_lens if saved, else a quick one is trained)")
    out: str | None = option(None, help="output directory (default: <checkpoint>/interpret)")

    def check(self, error: type[Exception] = InputError) -> "InterpretInputs":
        """Each field's rule, then the patching pair: --clean and --corrupt together or not at all."""
        checked = super().check(error)
        if bool(checked.clean) != bool(checked.corrupt):
            raise error("--clean and --corrupt go together: give both or neither")
        return checked

    def shared(self) -> dict[str, Any]:
        """The inputs the methods share, as run_interpret's keywords (Method.inputs_from picks each method's)."""
        return {name: getattr(self, name) for name in SHARED}


def interpret_inputs(checkpoint: str | Path, out: str | Path | None, experiments: list[str] | None,
                     opts: dict[str, Any]) -> InterpretInputs:
    """run_interpret's arguments as InterpretInputs, checked (a folder may be given as a Path)."""
    def text(value: Any) -> Any:
        return str(value) if isinstance(value, PurePath) else value

    given = {name: text(opts.get(name)) for name in SHARED}
    return InterpretInputs(text(checkpoint), tuple(experiments) if experiments else None, out=text(out),
                           **given).check()


@dataclass
class InterpretResult:
    """The experiments run on one checkpoint; results.json is to_dict() (each experiment under its name)."""

    checkpoint: str
    experiments: list[str]
    model: dict[str, Any]                       # the model's config
    results: dict[str, MethodResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)   # experiments left out: name -> why (the architecture)

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "experiments": list(self.experiments), "model": self.model,
                "skipped": dict(self.skipped),
                **{name: found.to_dict() for name, found in self.results.items()}}

    def _repr_html_(self) -> str:
        return "".join(found._repr_html_() for found in self.results.values())


def available_experiments() -> dict[str, Callable[..., Any]]:
    """name -> fn(model, tokenizer, out_dir, opts) for every experiment, in the order they run: the registry's
    methods (circuitlab.methods.REGISTRY), each picking its options and inputs out of opts."""
    from circuitlab.methods import REGISTRY

    return {name: m.run_with for name, m in REGISTRY.items()}


def experiment_needs() -> dict[str, tuple[str, ...]]:
    """Each experiment's architecture assumptions (model.assumptions names; none for most)."""
    from circuitlab.methods import REGISTRY

    return {name: m.needs for name, m in REGISTRY.items()}


def no_text() -> list[str]:
    """The experiments that read only the weights and token ids: they run on a model without a tokenizer."""
    from circuitlab.methods import REGISTRY

    return [name for name, m in REGISTRY.items() if not m.needs_text]


def experiments_for(model_or_cfg, names: list[str] | None = None, by_name: bool = False
                    ) -> tuple[list[str], dict[str, str]]:
    """(the experiments among `names` (default: all) to run on this model, {left out: why}): those whose
    architecture assumptions the model breaks are left out; named by the user (by_name), one is refused in
    one line (ConfigError)."""
    from circuitlab.errors import ConfigError
    from circuitlab.model.assumptions import why_not

    needs = experiment_needs()
    names = list(needs) if names is None else list(names)
    unknown = [n for n in names if n not in needs]
    if unknown:
        raise CircuitlabError(f"unknown experiment(s) {', '.join(unknown)}; available: {', '.join(needs)}")
    left_out = {n: r for n in names if (r := why_not(model_or_cfg, f"the {n} experiment", *needs[n]))}
    if left_out and by_name:
        name, reason = next(iter(left_out.items()))
        raise ConfigError(f"{reason}: leave {name} out of --experiments")
    return [n for n in names if n not in left_out], left_out


def run_interpret(checkpoint: str | Path, out: str | Path, experiments: list[str] | None = None,
                  **opts: Any) -> InterpretResult:
    """Run experiments (default: all) on a checkpoint; writes out/results.json, out/report.md and
    out/report.html (interactive, self-contained). opts: the inputs the methods share (InterpretInputs: prompt;
    clean and corrupt (patching); lens, a tuned-lens folder, default <checkpoint>/tuned_lens, trained quickly when
    there is none) and each registered method's options (circuitlab.methods; None = the default)."""
    from circuitlab.report import write_interpret_report
    from circuitlab.report.markdown import interpret_markdown
    from circuitlab.training import load_checkpoint

    from circuitlab.methods import REGISTRY

    inputs = interpret_inputs(checkpoint, out, experiments, opts)
    table = available_experiments()
    names = experiments or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise CircuitlabError(f"unknown experiment(s) {', '.join(unknown)}; available: {', '.join(table)}")
    for name, m in REGISTRY.items():   # a method the inputs cannot run: refused when asked for, else left out
        why = m.missing(m.options_from(opts), **m.inputs_from(opts)) if name in names and m.missing else None
        if why is not None:
            if experiments is not None:
                raise CircuitlabError(why[0])
            names.remove(name)
            warnings.warn(why[1], stacklevel=2)
    from circuitlab.analysis.lens.tuned import TunedLens, default_lens_dir

    if inputs.lens is not None and not TunedLens.exists(inputs.lens):
        raise CircuitlabError(f"--lens {inputs.lens} holds no tuned lens; train one with `circuitlab lens train`")
    opts["lens"] = opts.get("lens") or default_lens_dir(checkpoint)
    model, tokenizer, meta = load_checkpoint(checkpoint)
    weights_only = no_text()
    if tokenizer is None:  # the weights-only analyses run on token ids; the others need text
        if experiments is None:
            names = list(weights_only)
            warnings.warn(f"{checkpoint} has no tokenizer: running only the analyses that need no text "
                          f"({', '.join(weights_only)})", stacklevel=2)
        needs_text = [n for n in names if n not in weights_only]
        if needs_text:
            raise CircuitlabError(f"{checkpoint} has no tokenizer saved with it, so {', '.join(needs_text)} cannot "
                                  f"encode text; run --experiments {' '.join(weights_only)} (weights and token ids "
                                  "only), or import the model with its tokenizer")
    names, left_out = experiments_for(model, names, by_name=experiments is not None)
    for name, reason in left_out.items():
        warnings.warn(f"{name} skipped: {reason}", stacklevel=2)
    check_options(model, tokenizer, names, opts)   # every argument, before anything on disk changes
    # A previous interpret output is kept renamed, anything else refused: never two runs' files in one folder.
    kept = set_aside(Path(out), _is_interpret_output, "interpret results")
    if kept is not None:
        print(f"moved the previous results to {kept}")
    result = InterpretResult(str(checkpoint), names, model.cfg.to_dict(), skipped=left_out)
    with atomic_dir(Path(out)) as tmp:  # the folder appears complete, or not at all
        for i, name in enumerate(names):
            print(f"running {name} ({i + 1} of {len(names)})")   # progress between the analyses
            result.results[name] = table[name](model, tokenizer, tmp, opts)
        results = result.to_dict()
        (tmp / "results.json").write_text(json_text(results, indent=2, default=str))
        (tmp / "report.md").write_text(interpret_markdown(results))
        write_interpret_report(tmp, results, model, tokenizer)  # report.html
    return result


def check_options(model: Transformer, tokenizer, names: list[str], opts: dict[str, Any]) -> None:
    """Refuse now, in one line, what the chosen experiments would refuse later: each method's own check (the
    prompt, the clean and corrupted pair, a saved lens that does not fit the model, causal tracing's noise, window
    and subject). Cheap (tokenizing, a few forward passes at most): run before the earlier output is set aside."""
    from circuitlab.methods import REGISTRY

    if tokenizer is None:
        return   # the weights-only analyses take no text options
    done = set()
    for name, m in REGISTRY.items():   # each method's own check (one shared by several runs once)
        if name in names and m.check is not None and m.check not in done:
            m.check(model, tokenizer, m.options_from(opts), **m.inputs_from(opts))
            done.add(m.check)


def _is_interpret_output(folder: Path) -> bool:
    try:
        found = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and "experiments" in found and "checkpoint" in found
