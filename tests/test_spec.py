"""The method spec (circuitlab.spec): the command line, check(), the explorer's request model and the JSON schema
generated from one options class accept and refuse the same values; and no option's default is written twice
in the package (a test that scans the source)."""
from __future__ import annotations

import argparse
import ast
import functools
import importlib
import math
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

import circuitlab
from circuitlab.checks import COUNT, SHARE, Number, PerItem
from circuitlab.errors import CircuitlabError, ConfigError, InputError
from circuitlab.spec import Options, Result, add_arguments, option, options_of, schema

PACKAGE = Path(circuitlab.__file__).resolve().parent
SCALE = Number(float, low=0.0, low_open=True, high=1000.0, why="more only overflows")


@dataclass(frozen=True)
class ToyOptions(Options):
    title = "toy method"
    samples: int = option(10, COUNT, help="runs averaged (default {default})", metavar="N")
    scale: float = option(3.0, SCALE, help="noise scale (default {default:g})")
    threshold: float = option(0.8, SHARE, help="share kept")
    kind: str = option("gaussian", choices=("gaussian", "uniform"), help="noise kind")
    subject: str | None = option(None, help="words to corrupt")
    window: int | None = option(None, COUNT, help="layers (default: by depth)")
    words: tuple[str, ...] | None = option(None, help="other subjects", nargs="+", metavar="TEXT")
    target: float = option(2.0, PerItem(Number(float, low=0.0), Number(float, low=0.0)), help="per layer")


# What a user may type (the CLI) or send (Python, the explorer's JSON).
VALUES = [("0", 0), ("1", 1), ("3", 3), ("-2", -2), ("0.5", 0.5), ("1e-3", 1e-3), ("nan", math.nan), ("inf", math.inf),
          ("true", True), ("abc", "abc"), ("2000", 2000), ("gaussian", "gaussian"), ("uniform", "uniform")]


def cli_accepts(argv: list[str]) -> bool:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, ToyOptions)
    try:
        p.parse_args(argv)
        return True
    except (argparse.ArgumentError, SystemExit):
        return False


def check_accepts(**kw) -> bool:
    try:
        ToyOptions(**kw).check()
        return True
    except CircuitlabError:
        return False


def test_command_line_check_request_model_and_schema_agree():
    jsonschema = pytest.importorskip("jsonschema")
    from pydantic import ValidationError

    from circuitlab.serve.requests import request_model

    Request = request_model(ToyOptions)
    validator = jsonschema.Draft202012Validator(schema(ToyOptions))
    for f, _ in options_of(ToyOptions):
        if f.name in ("subject", "words"):
            continue   # text: any string
        for text, value in VALUES:
            cli = cli_accepts(["--" + f.name.replace("_", "-"), text])
            api = check_accepts(**{f.name: value})
            try:
                Request(**{f.name: value})
                explorer = True
            except ValidationError:
                explorer = False
            in_schema = not isinstance(value, float) or math.isfinite(value)   # JSON holds no NaN / inf
            in_schema = in_schema and validator.is_valid({f.name: value})
            assert cli == api == explorer == in_schema, (f.name, text, cli, api, explorer, in_schema)
    assert not check_accepts(words="Bo") and check_accepts(words=["Bo", "Al"]) and not check_accepts(words=[])
    assert Request(words=["Bo"]).options().words == ("Bo",)
    with pytest.raises(ValidationError, match="unexpected|extra"):
        Request(sampels=3)


def test_defaults_flow_to_every_front_end():
    p = argparse.ArgumentParser()
    add_arguments(p, ToyOptions)
    args = p.parse_args([])
    assert ToyOptions.from_args(args) == ToyOptions()
    assert "runs averaged (default 10)" in p.format_help() and "noise scale (default 3)" in p.format_help()
    assert "toy method" in p.format_help()
    props = schema(ToyOptions)["properties"]
    assert props["samples"]["default"] == 10 and props["samples"]["minimum"] == 1
    assert props["scale"]["exclusiveMinimum"] == 0.0 and props["scale"]["maximum"] == 1000.0
    assert props["kind"]["enum"] == ["gaussian", "uniform"] and props["subject"]["default"] is None
    from circuitlab.serve.requests import request_model

    assert request_model(ToyOptions)().options() == ToyOptions()
    doc = request_model(ToyOptions).model_json_schema()["properties"]
    assert doc["samples"]["minimum"] == 1 and doc["samples"]["default"] == 10


def test_check_names_the_field_and_normalises():
    with pytest.raises(InputError, match=r"^samples must be a whole number >= 1, got 0$"):
        ToyOptions(samples=0).check()
    with pytest.raises(InputError, match=r"^kind must be one of gaussian, uniform, got 'normal'$"):
        ToyOptions(kind="normal").check()
    with pytest.raises(InputError, match=r"scale must be .* \(more only overflows\)"):
        ToyOptions(scale=5000).check()
    checked = ToyOptions(scale=2, words=["a"], target=[1, 2]).check()
    assert isinstance(checked.scale, float) and checked.words == ("a",) and checked.target == [1.0, 2.0]


def test_to_dict_from_dict_round_trip_and_unknown_keys():
    o = ToyOptions(samples=4, words=("a", "b")).check()
    assert o.to_dict()["words"] == ["a", "b"]
    assert ToyOptions.from_dict(o.to_dict()) == o
    with pytest.raises(ConfigError, match="unknown ToyOptions option.*sampels.*did you mean 'samples'"):
        ToyOptions.from_dict({"sampels": 3})
    with pytest.raises(ConfigError, match="samples must be"):
        ToyOptions.from_dict({"samples": -1})


@dataclass(frozen=True)
class RunOptions(Options):
    checkpoint: str | None = option(None, required=True, aliases=("--model",), help="a run folder")
    source: str | None = option(None, required=True, flag="source", help="what to read")
    overwrite: bool = option(False, help="replace an earlier output")
    progress: bool = option(True, flag="--no-progress", help="no progress bar")
    kept: float = option(0.9, SHARE, help="keep 90%% of it")   # argparse reads %% as %
    sets: tuple[str, ...] = option((), repeat=True, flag="--set", metavar="KEY=VALUE", help="one override")


def test_required_options_switches_aliases_and_positionals():
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, RunOptions)
    assert RunOptions.from_args(p.parse_args(["src", "--model", "m"])) == RunOptions("m", "src").check()
    got = RunOptions.from_args(p.parse_args(["--checkpoint", "m", "src", "--overwrite", "--no-progress"]))
    assert got.overwrite is True and got.progress is False
    for argv in (["src"], ["--checkpoint", "m"]):   # each required one missing
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            p.parse_args(argv)
    with pytest.raises(InputError, match=r"^checkpoint is required$"):
        RunOptions(source="s").check()
    with pytest.raises(InputError, match=r"^overwrite must be true or false, got 'yes'$"):
        RunOptions("m", "s", overwrite="yes").check()
    doc = schema(RunOptions)
    assert doc["required"] == ["checkpoint", "source"] and "default" not in doc["properties"]["checkpoint"]
    assert doc["properties"]["progress"] == {"type": "boolean", "description": "no progress bar", "default": True}
    assert doc["properties"]["kept"]["description"] == "keep 90% of it" and "keep 90% of it" in p.format_help()
    sets = RunOptions.from_args(p.parse_args(["s", "--model", "m", "--set", "a=1", "--set", "b=2"])).sets
    assert sets == ("a=1", "b=2") and RunOptions.from_args(p.parse_args(["s", "--model", "m"])).sets == ()
    assert RunOptions.from_args(p.parse_args(["s", "--model", "m"])).sets == ()   # the default list was not grown
    assert RunOptions("m", "s", sets=["x=1"]).check().sets == ("x=1",)
    with pytest.raises(InputError, match=r"^sets must be a list of text, got 'x=1'$"):
        RunOptions("m", "s", sets="x=1").check()
    assert doc["properties"]["sets"]["type"] == "array" and doc["properties"]["sets"]["default"] == []
    with pytest.raises(TypeError, match="repeated"):
        option(None, repeat=True, help="a repeated flag without a tuple default")
    with pytest.raises(TypeError, match="turns it off"):
        option(True, help="a switch with no way to turn it off")
    with pytest.raises(TypeError, match="required"):
        option(3, COUNT, required=True, help="a required option with a default")


@dataclass(frozen=True)
class ReadOptions(Options):
    temperature: float = option(0.8, Number(float, low=0.0), arg=float, help="")
    where: str | None = option(None, help="a file")


def test_an_option_may_read_the_command_line_its_own_way_and_text_takes_a_path(tmp_path):
    """arg=float: the command line reads any float (the method's check says why one is refused, in its own
    words); a path given for text is kept as its str (JSON-able)."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, ReadOptions)
    args = p.parse_args(["--temperature", "-1", "--where", "x"])
    assert args.temperature == -1.0 and args.where == "x"
    with pytest.raises(InputError, match=r"^temperature must be a finite number >= 0, got -1.0$"):
        ReadOptions.from_args(args)
    with pytest.raises(argparse.ArgumentError, match="invalid float value: 'abc'"):
        p.parse_args(["--temperature", "abc"])
    checked = ReadOptions(where=tmp_path / "a.txt").check()
    assert checked.where == str(tmp_path / "a.txt") and ReadOptions.from_dict(checked.to_dict()) == checked
    with pytest.raises(InputError, match=r"^where must be text, got 3$"):
        ReadOptions(where=3).check()
    assert schema(ReadOptions)["properties"]["temperature"]["minimum"] == 0.0


@dataclass(frozen=True)
class OptionalValueOptions(Options):
    refine: str | None = option(None, nargs="?", const="batched", metavar="batched|acdc", help="refine it")
    size: int | None = option(None, COUNT, nargs="?", const=4, help="a size, 4 when the flag is alone")


def test_an_optional_value_is_one_value_and_the_flag_alone_means_its_const():
    """nargs="?" with a const: absent -> the default, the flag alone -> const, a value -> that value; one value,
    never a list (check, schema), still held to its rule."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, OptionalValueOptions)
    parsed = [OptionalValueOptions.from_args(p.parse_args(argv)) for argv in ([], ["--refine", "--size"],
                                                                               ["--refine", "acdc", "--size", "2"])]
    assert [(o.refine, o.size) for o in parsed] == [(None, None), ("batched", 4), ("acdc", 2)]
    assert OptionalValueOptions.from_dict(parsed[2].to_dict()) == parsed[2]
    with pytest.raises(argparse.ArgumentError, match="must be a whole number >= 1"):
        p.parse_args(["--size", "0"])
    with pytest.raises(InputError, match=r"^size must be a whole number >= 1, got 0$"):
        OptionalValueOptions(size=0).check()
    props = schema(OptionalValueOptions)["properties"]
    assert props["refine"]["anyOf"][0] == {"type": "string"} and props["size"]["anyOf"][0]["type"] == "integer"


@dataclass
class ToyPart(Result):
    values: list[float]


@dataclass
class ToyResult(Result):
    summary: list[str]
    part: ToyPart

    @classmethod
    def from_dict(cls, d):
        return cls(d["summary"], ToyPart.from_dict(d["part"]))


def test_result_round_trip_and_display():
    r = ToyResult(["one"], ToyPart([1.0, 2.0]))
    assert r.to_dict() == {"summary": ["one"], "part": {"values": [1.0, 2.0]}}
    assert ToyResult.from_dict(r.to_dict()) == r
    assert "ToyResult" in r._repr_html_()


# ---------------------------------------------------------------------------- a default written once


def _is(value, default) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return value == default
    return type(value) is type(default) and value == default


def _const(node) -> tuple[bool, object]:
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return True, -node.operand.value
    return False, None


def _mentions(node, name: str) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(node))


def _has_default(node, default) -> bool:
    return any(_const(n)[0] and _is(_const(n)[1], default) for n in ast.walk(node))


@functools.lru_cache(maxsize=None)
def _nodes(tree: ast.AST) -> tuple[ast.AST, ...]:
    """The nodes of a parsed file that can write a default (the kinds default_written looks at), walked once: the
    scan asks each file about every option."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.AnnAssign, ast.Assign, ast.Call, ast.Dict,
             ast.IfExp, ast.BoolOp)
    return tuple(n for n in ast.walk(tree) if isinstance(n, kinds))


def default_written(tree: ast.AST, name: str, flag: str, default) -> list[int]:
    """Lines of `tree` that write `default` again for the option `name` (flag `--name`): a keyword default
    (def f(name=0.8)), a class field (name: float = 0.8, name = Field(0.8)), a keyword argument (f(name=0.8)),
    an argparse default (add_argument("--name", default=0.8)), a dict entry ({"name": 0.8}), or a fallback
    (opts.get("name", 0.8), opts.get("name") or 0.8, 0.8 if opts.get("name") is None else ...)."""
    lines = []
    for node in _nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            lines += [d.lineno for arg, d in pairs if d is not None and arg.arg == name and _has_default(d, default)
                      and _const(d)[0]]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                and node.value is not None:
            v = node.value
            if (_const(v)[0] and _is(_const(v)[1], default)) or (isinstance(v, ast.Call) and (
                    any(_const(x)[0] and _is(_const(x)[1], default) for x in v.args[:1]) or
                    any(k.arg == "default" and _const(k.value)[0] and _is(_const(k.value)[1], default)
                        for k in v.keywords))):
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and _const(node.value)[0] and _is(_const(node.value)[1], default):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            lines += [k.value.lineno for k in node.keywords if k.arg == name and _const(k.value)[0]
                      and _is(_const(k.value)[1], default)]
            flags = [x.value for x in node.args if isinstance(x, ast.Constant) and isinstance(x.value, str)]
            if flag in flags and any(k.arg == "default" and _const(k.value)[0] and _is(_const(k.value)[1], default)
                                     for k in node.keywords):
                lines.append(node.lineno)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2 \
                    and _const(node.args[0]) == (True, name) and _const(node.args[1])[0] \
                    and _is(_const(node.args[1])[1], default):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            lines += [v.lineno for k, v in zip(node.keys, node.values) if k is not None and _const(k) == (True, name)
                      and _const(v)[0] and _is(_const(v)[1], default)]
        elif isinstance(node, ast.IfExp) and _mentions(node.test, name):
            lines += [b.lineno for b in (node.body, node.orelse) if _const(b)[0] and _is(_const(b)[1], default)]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(_mentions(v, name) for v in node.values):
            lines += [v.lineno for v in node.values if _const(v)[0] and _is(_const(v)[1], default)]
    return lines


def options_classes() -> list[tuple[type, Path]]:
    """Every Options subclass declared in the package (found in the source, then imported)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", None)) == "Options"
                                                      for b in node.bases):
                module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
                found.append((getattr(importlib.import_module(module), node.name), path))
    return found


def written_twice(classes: list[tuple[type, Path]], files: list[Path]) -> list[str]:
    """'file:line writes <option>'s default <value> again' for every option default found outside its class."""
    found = []
    for path in files:
        text = path.read_text()
        tree = ast.parse(text)
        own = {id(n) for cls, p in classes if p == path for c in ast.walk(tree)
               if isinstance(c, ast.ClassDef) and c.name == cls.__name__ for n in ast.walk(c)}
        for cls, _ in classes:
            for f, opt in options_of(cls):
                if f.default is None or opt.switch:   # a switch's default is the flag's absence
                    continue
                flag = opt.flag or "--" + f.name.replace("_", "-")
                if f.name not in text and flag not in text:   # every form the scan finds spells one of them
                    continue
                for line in default_written(tree, f.name, flag, f.default):
                    hits = [n for n in ast.walk(tree) if getattr(n, "lineno", None) == line and id(n) not in own]
                    if hits:
                        found.append(f"{path.name}:{line} writes {cls.__name__}.{f.name}'s default {f.default!r} again")
    return sorted(set(found))


def test_the_scanner_catches_a_default_written_again(tmp_path):
    """Planted: each way of writing node_threshold's 0.8 (or the toy's 10 samples) again is found; the class
    that declares it, other names and other values are not."""
    @dataclass(frozen=True)
    class GraphOptions(Options):
        node_threshold: float = option(0.8, SHARE, help="share of influence kept")

    home = tmp_path / "home.py"
    home.write_text("class GraphOptions(Options):\n    node_threshold: float = option(0.8, SHARE, help='x')\n")
    twice = {
        "field.py": "class C:\n    node_threshold: float = 0.8\n",
        "keyword.py": "def graph(model, node_threshold=0.8):\n    pass\n",
        "kwonly.py": "def graph(model, *, node_threshold: float = 0.8):\n    pass\n",
        "call.py": "graph(model, node_threshold=0.8)\n",
        "argparse.py": "p.add_argument('--node-threshold', type=float, default=0.8)\n",
        "pydantic.py": "class R(BaseModel):\n    node_threshold: float = Field(default=0.8, ge=0)\n",
        "fallback.py": "t = opts.get('node_threshold') or 0.8\nu = opts.get('node_threshold', 0.8)\n",
        "ifexp.py": "t = 0.8 if opts.get('node_threshold') is None else opts['node_threshold']\n",
        "dict.py": "d = {'node_threshold': 0.8}\n",
        "samples.py": "n = 10 if opts.get('samples') is None else opts['samples']\n",
    }
    fine = "def graph(model, edge_threshold=0.8, node_threshold=0.5, node_threshold_x=0.8):\n    x = 0.8\n"
    for name, text in {**twice, "fine.py": fine}.items():
        (tmp_path / name).write_text(text)
    files = [tmp_path / n for n in [*twice, "fine.py", "home.py"]]
    found = written_twice([(GraphOptions, home), (ToyOptions, home)], files)
    assert {line.split(":")[0] for line in found} == set(twice), found


def test_no_option_default_is_written_twice_in_the_package():
    """Every option's default lives in its options class only: the CLI, the explorer, the config and the Python
    keywords read it from there."""
    classes = options_classes()
    found = written_twice(classes, sorted(PACKAGE.rglob("*.py")))
    assert not found, "\n".join(found)
