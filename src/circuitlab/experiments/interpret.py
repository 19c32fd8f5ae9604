"""Run named analyses on a checkpoint: the engine behind `circuitlab interpret`.

The experiments are the registry's methods (circuitlab.methods.REGISTRY: one module each).
"""
from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from circuitlab.atomic import atomic_write_json, atomic_write_text, check_set_aside, json_text, set_aside
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
    resume: bool = option(False, help="keep the experiments an earlier run into --out finished with the same "
                                      "options (OUT/finished/) and run the rest")

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
                     opts: dict[str, Any], resume: bool = False) -> InterpretInputs:
    """run_interpret's arguments as InterpretInputs, checked (a folder may be given as a Path)."""
    def text(value: Any) -> Any:
        return str(value) if isinstance(value, PurePath) else value

    given = {name: text(opts.get(name)) for name in SHARED}
    return InterpretInputs(text(checkpoint), tuple(experiments) if experiments else None, out=text(out),
                           resume=resume, **given).check()


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
                  resume: bool = False, **opts: Any) -> InterpretResult:
    """Run experiments (default: all) on a checkpoint; writes out/results.json, out/report.md and
    out/report.html (interactive, self-contained). opts: the inputs the methods share (InterpretInputs: prompt;
    clean and corrupt (patching); lens, a tuned-lens folder, default <checkpoint>/tuned_lens, trained quickly when
    there is none) and each registered method's options (circuitlab.methods; None = the default).

    Each experiment is saved as it finishes (out/finished/NAME.json and its figures); results.json and the
    reports are written from them at the end. A Ctrl-C keeps the finished ones (and writes results.json and the
    reports of those) and raises KeyboardInterrupt saying how to go on; resume=True keeps every finished
    experiment whose options and inputs are the same and runs the rest (without it, an earlier output is moved
    aside whole)."""
    from circuitlab.training import load_checkpoint

    from circuitlab.methods import REGISTRY

    inputs = interpret_inputs(checkpoint, out, experiments, opts, resume)
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
    out = Path(out)
    if resume:   # the finished experiments stay; anything that is not an interpret output is refused
        check_set_aside(out, _is_interpret_output, "interpret results")
    else:        # a previous interpret output is kept renamed, anything else refused: never two runs' files mixed
        kept = set_aside(out, _is_interpret_output, "interpret results")
        if kept is not None:
            print(f"moved the previous results to {kept}")
    result = InterpretResult(str(checkpoint), names, model.cfg.to_dict(), skipped=left_out)
    entries: dict[str, dict[str, Any]] = {}   # name -> its results.json entry, as saved in finished/NAME.json
    for i, name in enumerate(names):
        m = REGISTRY[name]
        ran_with = experiment_settings(m, opts)
        earlier = finished_entry(out, name, ran_with) if resume else None
        if earlier is not None:
            try:
                result.results[name] = m.result.from_dict(earlier)
            except (KeyError, TypeError, ValueError):   # an entry of an older layout: run it again
                earlier = None
        if earlier is not None:
            print(f"{name} ({i + 1} of {len(names)}): finished earlier, kept ({out / FINISHED / (name + '.json')})")
            entries[name] = earlier
            continue
        print(f"running {name} ({i + 1} of {len(names)})")   # progress between the analyses
        try:
            found, entries[name] = run_one(out, name, ran_with, lambda tmp: table[name](model, tokenizer, tmp, opts))
        except KeyboardInterrupt:
            done = [n for n in names if n in entries]
            if done:   # what is finished reads as a report now; --resume runs the rest
                write_combined(out, result, entries, model, tokenizer, unfinished=[n for n in names if n not in done],
                               html=False)
            raise KeyboardInterrupt(stopped_message(out, done, names)) from None
        result.results[name] = found
    write_combined(out, result, entries, model, tokenizer)
    return result


FINISHED = "finished"   # OUT/finished/NAME.json: each experiment's entry, written as it finishes


def experiment_settings(m: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """What one experiment's result depends on besides the model: its options and the shared inputs it reads
    (JSON-plain), compared by --resume before a finished experiment is kept."""
    inputs = {k: v for k, v in m.inputs_from(opts).items() if k != "progress"}
    return json.loads(json_text({"options": m.options_from(opts).to_dict(), "inputs": inputs}, default=str))


def finished_entry(out: Path, name: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The results.json entry `name` left in out/finished by an earlier run with the same settings, else None
    (absent, unreadable, or run with other options: then it runs again)."""
    try:
        saved = json.loads((out / FINISHED / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("settings") != settings or not isinstance(saved.get("result"), dict):
        if isinstance(saved, dict) and "settings" in saved:
            print(f"{name}: finished earlier with other options; running it again")
        return None
    return saved["result"]


def run_one(out: Path, name: str, settings: dict[str, Any], run: Callable[[Path], MethodResult]
            ) -> tuple[MethodResult, dict[str, Any]]:
    """Run one experiment in a scratch folder inside out, move its files (figures) into out, then save its
    entry as out/finished/NAME.json (atomically, last: a file there means the experiment is complete).
    Returns (the result, its entry as read back from JSON, as results.json holds it)."""
    import shutil
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".running-{name}-", dir=out))
    try:
        found = run(tmp)
        entry = json.loads(json_text(found.to_dict(), default=str))
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                target = out / f.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, target)
        (out / FINISHED).mkdir(exist_ok=True)
        atomic_write_json(out / FINISHED / f"{name}.json", {"settings": settings, "result": entry}, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return found, entry


def write_combined(out: Path, result: InterpretResult, entries: dict[str, dict[str, Any]], model: Transformer,
                   tokenizer: Any, unfinished: list[str] | None = None, html: bool = True) -> None:
    """out/results.json (today's layout: each experiment's entry under its name), report.md and (html) report.html
    from the finished entries; after a stop, `experiments` lists the finished ones and `unfinished` the rest (and
    no report.html: it draws attention and circuits from the model, too slow to wait for after a Ctrl-C)."""
    from circuitlab.report import write_interpret_report
    from circuitlab.report.markdown import interpret_markdown

    done = [n for n in result.experiments if n in entries]
    results = {"checkpoint": result.checkpoint, "experiments": done, "model": result.model,
               "skipped": dict(result.skipped), **({"unfinished": unfinished} if unfinished else {}),
               **{n: entries[n] for n in done}}
    atomic_write_text(out / "results.json", json_text(results, indent=2, default=str))
    atomic_write_text(out / "report.md", interpret_markdown(results))
    if html:
        write_interpret_report(out, results, model, tokenizer)  # report.html


def stopped_message(out: Path, done: list[str], names: list[str]) -> str:
    """What a stop says: what is kept where, and the command (or call) that runs the rest."""
    from circuitlab.errors import command_line

    if not done:
        return f"stopped before any experiment finished; nothing was kept in {out}"
    again = command_line(add="--resume")
    rest = [n for n in names if n not in done]
    return (f"stopped; {len(done)} of {len(names)} experiments finished and kept in {out} ({', '.join(done)}); "
            f"run the rest ({', '.join(rest)}) with: {again or 'run_interpret(..., resume=True)'}")


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
    if any((folder / FINISHED).glob("*.json")):   # a run stopped before it wrote results.json
        return True
    try:
        found = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and "experiments" in found and "checkpoint" in found
