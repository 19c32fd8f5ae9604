"""Tests you can find (issue 38): the tests mirror the package.

Every module of src/circuitlab with 100 lines or more has a test file of its own at the mirrored path,
tests/<package>/test_<module>.py (a package's __init__.py: tests/<parent>/test_<package>.py; more than one
file may share the module's name as test_<module>_<what>.py), or a reason stated in REASONS below. Every test
file sits at such a mirrored path, or in tests/contracts/ with the rules that cut across the package (bounded
work, bad input, agreement, crash safety, docs, ...). A reason "tested through tests/x/test_y.py" must be true:
each file it names imports the module (or a name the module defines), or, for a command, runs it by name."""
import ast
import importlib
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "circuitlab"
TESTS = ROOT / "tests"
LINES = 100

REASONS = {  # module (under src/circuitlab) -> why it has no tests/<package>/test_<module>.py
    "analysis/edges/faithfulness.py": "tested through tests/analysis/edges/test_circuit.py",  # generated: it imports the module
    "analysis/input_attribution/base.py": "tested through tests/analysis/test_input_attribution_shap.py, tests/analysis/test_input_attribution.py",  # generated: it imports the module
    "analysis/input_attribution/gradients.py": "tested through tests/analysis/test_input_attribution.py, tests/pretrained/test_families_analyses.py, tests/contracts/test_bounded.py",  # generated: it imports the module
    "analysis/input_attribution/perturbation.py": "tested through tests/analysis/test_input_attribution_shap.py, tests/analysis/test_input_attribution.py, tests/serve/test_inputs.py",  # generated: it imports the module
    "analysis/lens/__init__.py": "tested through tests/analysis/test_logit_attribution.py, tests/pretrained/test_importer_analysis.py, tests/report/test_build.py",  # generated: it imports the module
    "analysis/patching/noise.py": "tested through tests/analysis/patching/test_causal_tracing.py, tests/contracts/test_agreement.py",  # generated: it imports the module
    "analysis/surrogate.py": "tested through tests/analysis/test_input_attribution_shap.py via circuitlab.analysis.input_attribution.perturbation (KernelSHAP and LIME against Captum)",
    "atomic.py": "tested through tests/contracts/test_json_strict.py, tests/contracts/test_crash_safety.py, tests/contracts/test_bad_input.py",  # generated: it imports the module
    "checks.py": "tested through tests/test_spec.py, tests/contracts/test_ground_rules.py",  # generated: it imports the module
    "commands/attribute.py": "tested through tests/analysis/test_input_attribution.py, tests/contracts/test_bad_input.py (they run `circuitlab attribute`)",
    "dictionaries/arch/base.py": "tested through tests/dictionaries/test_arch.py, tests/dictionaries/test_sparse_ops.py",  # generated: it imports the module
    "dictionaries/clt_config.py": "tested through tests/dictionaries/test_arch.py, tests/dictionaries/test_clt.py, tests/dictionaries/test_clt_planted.py",  # generated: it imports the module
    "dictionaries/clt_formats.py": "tested through tests/dictionaries/test_clt.py via circuitlab.dictionaries.clt (every folder layout, bit for bit)",
    "dictionaries/feature_logits.py": "tested through tests/dictionaries/test_features.py",  # generated: it imports the module
    "dictionaries/mapped.py": "memory-mapped weights, read through dictionaries/module.py: tests/model/test_storage.py::test_mapped_dictionaries_are_the_saved_ones_read_from_disk loads transcoders with mmap=True and checks the pages are the file's",
    "dictionaries/metrics.py": "tested through tests/dictionaries/test_train.py",  # generated: it imports the module
    "dictionaries/module.py": "tested through tests/dictionaries/test_sae.py, tests/dictionaries/test_clt.py via circuitlab.dictionaries.sae (the shared dictionary module of SAEs and CLTs)",
    "dictionaries/objectives.py": "tested through tests/dictionaries/test_sparse_ops.py",  # generated: it imports the module
    "dictionaries/planted.py": "tested through tests/dictionaries/test_target_l0.py, tests/dictionaries/test_train.py, tests/dictionaries/test_arch.py",  # generated: it imports the module
    "dictionaries/published/circuit_tracer.py": "tested through tests/graphs/test_transcoders.py, tests/dictionaries/test_arch.py, tests/dictionaries/test_published.py",  # generated: it imports the module
    "dictionaries/published/scope.py": "tested through tests/dictionaries/test_published.py, tests/dictionaries/test_arch.py",  # generated: it imports the module
    "dictionaries/resample.py": "tested through tests/dictionaries/test_clt_train.py, tests/dictionaries/test_train.py",  # generated: it imports the module
    "dictionaries/store.py": "tested through tests/dictionaries/test_parallel.py, tests/dictionaries/test_train.py, tests/dictionaries/test_target_l0.py",  # generated: it imports the module
    "dictionaries/train_config.py": "tested through tests/dictionaries/test_target_l0.py, tests/dictionaries/test_train.py, tests/dictionaries/test_clt_planted.py",  # generated: it imports the module
    "dictionaries/train_state.py": "tested through tests/dictionaries/test_train.py, tests/contracts/test_long_jobs.py via circuitlab.dictionaries.train (its checkpoints, resumes and refused setting changes)",
    "errors.py": "tested through tests/analysis/test_patching.py, tests/dictionaries/test_clt.py, tests/analysis/patching/test_causal_tracing.py",  # generated: it imports the module
    "experiments/demo_budget.py": "tested through tests/experiments/test_features_demo.py, tests/contracts/test_output_policy.py",  # generated: it imports the module
    "experiments/forge_findings.py": "tested through tests/experiments/test_forge_compare.py",  # generated: it imports the module
    "forge/adder_base.py": "tested through tests/forge/test_adder.py",  # generated: it imports the module
    "forge/carry_adder.py": "tested through tests/forge/test_adder.py, tests/forge/test_compare.py, tests/experiments/test_forge_compare.py",  # generated: it imports the module
    "forge/facts.py": "tested through tests/analysis/patching/test_causal_tracing.py",  # generated: it imports the module
    "graphs/columns.py": "tested through tests/test_memory.py",  # generated: it imports the module
    "graphs/export.py": "tested through tests/viz/test_graph_view.py, tests/viz/test_graph_view_e2e.py, tests/graphs/test_attribution_graph.py",  # generated: it imports the module
    "graphs/loadings.py": "tested through tests/graphs/test_heads.py via circuitlab.graphs.heads",
    "graphs/plan.py": "tested through tests/test_memory.py",  # generated: it imports the module
    "graphs/planted.py": "tested through tests/graphs/test_replacement.py, tests/graphs/test_attribution.py, tests/methods/test_graph.py",  # generated: it imports the module
    "graphs/qk.py": "tested through tests/graphs/test_heads.py",  # generated: it imports the module
    "graphs/rowstore.py": "tested through tests/test_memory.py::test_capped_rows_offloaded_to_disk_give_the_same_graph via circuitlab.graphs.attribution (the capped graph's rows in a file give the same graph)",
    "methods/ablation.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "methods/base.py": "tested through tests/test_methods.py",  # generated: it imports the module
    "methods/causal_tracing.py": "tested through tests/analysis/patching/test_causal_tracing.py",  # generated: it imports the module
    "methods/circuits.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "methods/heads.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "methods/input_attribution.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "methods/patching.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "methods/tuned_lens.py": "tested through tests/test_methods.py via circuitlab.methods (the registry: each method's options, run and typed result read back from results.json)",
    "model/loading.py": "tested through tests/pretrained/test_importer.py",  # generated: it imports the module
    "model/weights.py": "tested through tests/model/test_transformer.py via circuitlab.model.transformer (the weight views)",
    "pretrained/source.py": "tested through tests/pretrained/test_importer.py via circuitlab.pretrained.importer (local folders, the hub cache, offline)",
    "report/markdown.py": "tested through tests/experiments/test_demo.py",  # generated: it imports the module
    "report/results.py": "tested through tests/contracts/test_report_keys.py",  # generated: it imports the module
    "report/sections.py": "tested through tests/report/test_build.py",  # generated: it imports the module
    "serve/prompt.py": "tested through tests/serve/test_app.py",  # generated: it imports the module
    "training/interrupts.py": "tested through tests/contracts/test_stop_signals.py via circuitlab.cli (SIGTERM and Ctrl-C from outside a running command)",
    "training/outputs.py": "tested through tests/contracts/test_ground_rules.py, tests/contracts/test_output_policy.py",  # generated: it imports the module
    "viz/edges.py": "tested through tests/viz/test_figure.py",  # generated: it imports the module
    "viz/features.py": "tested through tests/viz/test_figure.py",  # generated: it imports the module
    "viz/fragments.py": "tested through tests/report/test_build.py via circuitlab.report.html",
    "viz/parts.py": "tested through tests/viz/test_figure.py",  # generated: it imports the module
    "viz/patching.py": "tested through tests/report/test_build.py via circuitlab.viz.interactive",
    "viz/plotly_render.py": "tested through tests/viz/test_figure.py via circuitlab.viz.figure",
    "viz/png.py": "tested through tests/viz/test_figure.py",  # generated: it imports the module
}  # end of REASONS


def modules() -> dict[str, Path]:
    """dotted name -> file, for every module (a package by its __init__.py)."""
    out = {}
    for f in sorted(SRC.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        parts = f.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def all_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def owner(test: Path, mods: dict[str, Path]) -> str | None:
    """The module a test file mirrors: the longest module name its own name begins with, in its folder."""
    folder = test.parent.relative_to(TESTS).parts
    package = ".".join(("circuitlab",) + folder)
    if package not in mods or mods[package].name != "__init__.py":
        return None
    stem = test.stem[len("test_"):]
    best = None
    for d in mods:
        if d.rsplit(".", 1)[0] == package and d != package:
            name = d.rsplit(".", 1)[1]
            if (stem == name or stem.startswith(name + "_")) and (best is None or len(name) > len(best[1])):
                best = (d, name)
    return best and best[0]


def long_modules(mods: dict[str, Path]) -> dict[str, Path]:
    return {d: f for d, f in mods.items() if d != "circuitlab" and len(f.read_text().splitlines()) >= LINES}


def key(f: Path) -> str:
    return str(f.relative_to(SRC))


def test_every_test_file_sits_at_a_mirrored_path_or_in_contracts():
    mods = modules()
    stray = [str(t.relative_to(ROOT)) for t in all_test_files()
             if t.parent.relative_to(TESTS).parts[:1] != ("contracts",) and owner(t, mods) is None]
    assert not stray, f"test files at no mirrored path (tests/<package>/test_<module>.py) nor in tests/contracts/: {stray}"


def test_every_module_of_100_lines_has_its_own_test_file_or_a_stated_reason():
    mods = modules()
    owned = {owner(t, mods) for t in all_test_files()}
    missing = [key(f) for d, f in long_modules(mods).items() if d not in owned and not REASONS.get(key(f), "").strip()]
    assert not missing, (f"modules of {LINES}+ lines with no tests/<package>/test_<module>.py and no reason in "
                         f"{Path(__file__).name}'s REASONS: {missing}")


def references(test: Path, dotted: str) -> bool:
    """Does this test file import the module, or a name the module defines (through a package's re-export),
    or, for a command, run it by name?"""
    tree = ast.parse(test.read_text())
    parent, _, last = dotted.rpartition(".")
    for n in ast.walk(tree):
        if isinstance(n, ast.Import) and any(a.name == dotted or a.name.startswith(dotted + ".") for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and n.module:
            if n.module == dotted or n.module.startswith(dotted + "."):
                return True
            if n.module == parent and any(a.name == last for a in n.names):
                return True
            if n.module.startswith("circuitlab"):
                try:
                    package = importlib.import_module(n.module)
                except ImportError:  # a test may import what this environment lacks, and skip
                    continue
                for a in n.names:
                    obj = getattr(package, a.name, None)
                    if getattr(obj, "__module__", None) == dotted:
                        return True
    said = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if any(re.search(rf"(import|from) {re.escape(dotted)}\b", s) for s in said):  # code a test runs in a subprocess
        return True
    if dotted.startswith("circuitlab.commands."):
        command = last.replace("_", "-")
        return command in said and ("circuitlab" in said or "circuitlab.cli" in test.read_text())
    return False


def imported_by(dotted: str, mods: dict[str, Path]) -> set[str]:
    """The circuitlab modules this module imports (relative imports resolved, lazy ones included)."""
    f = mods[dotted]
    package = dotted if f.name == "__init__.py" else dotted.rpartition(".")[0]
    out = set()
    for n in ast.walk(ast.parse(f.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package.split(".")[:len(package.split(".")) - (n.level - 1)]
                base = ".".join(up + ([n.module] if n.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in n.names}
    return out


def test_reasons_are_current_and_true():
    mods = modules()
    by_key = {key(f): d for d, f in long_modules(mods).items()}
    owned = {owner(t, mods) for t in all_test_files()}
    wrong = []
    for name, reason in REASONS.items():
        if name not in by_key:
            wrong.append(f"{name}: no such module of {LINES}+ lines (renamed, split or shortened?): drop the row")
            continue
        if by_key[name] in owned:
            wrong.append(f"{name}: has a test file of its own now: drop the row")
            continue
        for t, test in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", reason):
            if not (ROOT / t).is_file():
                wrong.append(f"{name}: {t} does not exist")
            elif test and not re.search(rf"^def {test}\(", (ROOT / t).read_text(), flags=re.M):
                wrong.append(f"{name}: {t} has no test {test}")
        if reason.startswith("tested through"):
            module = by_key[name]
            via = re.search(r" via (circuitlab[\w.]*)", reason)
            if via:
                if via.group(1) not in mods:
                    wrong.append(f"{name}: no module {via.group(1)}")
                    continue
                if module not in imported_by(via.group(1), mods):
                    wrong.append(f"{name}: {via.group(1)} does not import {module}")
                module = via.group(1)
            named = re.findall(r"tests/[\w/]+\.py", reason.split(" via ")[0])
            if not named:
                wrong.append(f"{name}: 'tested through' names no tests/....py file")
            for t in named:
                if (ROOT / t).is_file() and not references(ROOT / t, module):
                    wrong.append(f"{name}: {t} neither imports {module} nor runs it")
    assert not wrong, "REASONS rows that are out of date or untrue:\n" + "\n".join(wrong)


def test_each_test_folder_is_a_package_so_two_folders_may_hold_the_same_basename():
    """tests/ itself has no __init__.py (site-packages holds a stray `tests` package; `import helpers` works)."""
    folders = sorted({t.parent for t in all_test_files()} - {TESTS})
    assert not [str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()]
    assert not (TESTS / "__init__.py").exists()
