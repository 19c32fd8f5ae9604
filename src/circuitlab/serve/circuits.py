"""The circuit browser behind `circuitlab serve --circuit DIR`: circuits saved by `circuitlab circuit`
(results.json + circuit.svg) and discovery run on the loaded model, as plain JSON-able dicts;
add_circuit_routes puts them on the app.

    browser = CircuitBrowser.load(model, tokenizer, ["runs/demo/2l/circuit"])
    browser.list_circuits()                                   # GET  /api/circuits
    browser.circuit("circuit")                                # GET  /api/circuit?name=...
    browser.svg("circuit")                                    # GET  /api/circuit.svg?name=...  (image/svg+xml)
    browser.run(task="induction", method="eap-ig")            # POST /api/circuits/run  (a new entry)

The drawing is served as an image (never inlined into the page), so a saved SVG cannot run script.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastapi.responses import Response  # at module level: the OpenAPI schema resolves route annotations here
from pydantic import Field

from circuitlab.analysis.edges.discovery import DEFAULT_METRIC, INDUCTION_CORRUPTIONS, METRICS
from circuitlab.analysis.edges.options import DiscoveryOptions
from circuitlab.analysis.edges.scoring import DEFAULT_METHOD, DEFAULT_STEPS, METHODS
from circuitlab.checks import COUNT, Number
from circuitlab.errors import CircuitlabError
from circuitlab.serve.page import JS, Page, Served
from circuitlab.serve.requests import request_model

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MAX_EXACT_EDGES = 2000  # exact patching runs one copy of the batch per edge: keep the server responsive
MAX_RUNS = 5            # discovery runs kept in memory (oldest dropped)
MAX_ROWS = 32           # prompt pairs in one run
SERVER_STEPS = Number(int, low=1, high=50, why="the explorer answers while you wait; `circuitlab circuit` takes more")


@dataclass
class _Entry:
    name: str
    results: dict[str, Any]  # results.json of `circuitlab circuit` (CircuitResult.to_dict())
    svg: str
    source: str


def _read_folder(folder: Path) -> tuple[dict[str, Any], str]:
    results, svg = folder / "results.json", folder / "circuit.svg"
    if not results.is_file() or not svg.is_file():
        raise CircuitlabError(f"{folder} is not a `circuitlab circuit` output folder (it needs results.json and "
                              "circuit.svg)")
    try:
        data = json.loads(results.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CircuitlabError(f"{results} is not valid JSON ({e}); run `circuitlab circuit` again") from None
    if not isinstance(data, dict) or not {"summary", "circuit", "faithfulness", "scores"} <= set(data):
        raise CircuitlabError(f"{results} is not the results of `circuitlab circuit` (summary, circuit, "
                              "faithfulness, scores)")
    return data, svg.read_text()


class CircuitBrowser:
    def __init__(self, model: Transformer | None, tokenizer, entries: list[_Entry]) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.entries = {e.name: e for e in entries}
        self.runs = 0

    @classmethod
    def load(cls, model: Transformer | None, tokenizer, folders: Sequence[str | Path]) -> "CircuitBrowser":
        """Each folder written by `circuitlab circuit`; model (may be None): the one discovery runs on."""
        entries: list[_Entry] = []
        for folder in folders:
            folder = Path(folder)
            results, svg = _read_folder(folder)
            name, n = folder.name or "circuit", 2
            while name in {e.name for e in entries}:
                name, n = f"{folder.name}-{n}", n + 1
            entries.append(_Entry(name, results, svg, str(folder)))
        return cls(model, tokenizer, entries)

    def _entry(self, name: str) -> _Entry:
        if name not in self.entries:
            known = ", ".join(self.entries) or "none (start the server with --circuit DIR, or run discovery)"
            raise CircuitlabError(f"unknown circuit {name!r}; loaded: {known}")
        return self.entries[name]

    def list_circuits(self) -> list[dict[str, Any]]:
        return [{"name": e.name, "source": e.source, "n_edges": e.results["circuit"]["n_edges"],
                 "of": e.results["circuit"]["of"], "summary": e.results["summary"]} for e in self.entries.values()]

    def circuit(self, name: str, top: int = 20) -> dict[str, Any]:
        """Summary lines, the circuit's edges, the faithfulness curve and the top edges by |score|."""
        e = self._entry(name)
        r = e.results
        edges = r["scores"].get("edges", [])
        best = sorted(edges, key=lambda x: -abs(x[2]))[:top]
        return {"name": name, "source": e.source, "data": r.get("data", ""), "summary": r["summary"],
                "method": r["scores"].get("method"), "circuit": r["circuit"], "faithfulness": r["faithfulness"],
                "circuit_faithfulness": r.get("circuit_faithfulness"), "top_edges": best}

    def svg(self, name: str) -> str:
        return self._entry(name).svg

    def run(self, task: str | None = "induction", corruption: str = "no-repeat", method: str = DEFAULT_METHOD,
            metric: str = DEFAULT_METRIC, edges: int | None = None, clean: list[str] | None = None,
            corrupt: list[str] | None = None, steps: int = DEFAULT_STEPS) -> dict[str, Any]:
        """Discovery on the loaded model: the built-in task or prompt pairs (clean[i], corrupt[i]); a new
        entry named after it. Returns circuit(name)."""
        from circuitlab.analysis.edges import EdgeGraph
        from circuitlab.analysis.edges.discovery import find_circuit, induction_rows, rows_from_texts
        from circuitlab.viz.edges import circuit_svg

        model = self.model
        assert model is not None  # the route answers 409 before discovery without a model
        if method == "exact" and EdgeGraph.of(model).n_edges > MAX_EXACT_EDGES:
            raise CircuitlabError(f"exact patching of this model's {EdgeGraph.of(model).n_edges} edges is too slow "
                                  f"for the server (limit {MAX_EXACT_EDGES}); use eap-ig, or `circuitlab circuit`")
        SERVER_STEPS.check(steps, "steps")
        if edges is not None:
            COUNT.check(edges, "edges")
        if clean is not None or corrupt is not None:
            if not clean or not corrupt:
                raise CircuitlabError("give both clean and corrupt prompts (one per row), or a task")
            if len(clean) > MAX_ROWS:
                raise CircuitlabError(f"{len(clean)} prompt pairs; the server's limit is {MAX_ROWS}")
            data = rows_from_texts(self.tokenizer, clean, corrupt)
            what = f"{len(clean)} prompt pair{'' if len(clean) == 1 else 's'}"
        elif task == "induction":
            data = induction_rows(model.cfg.d_vocab, half=min(10, model.cfg.n_ctx // 2), corruption=corruption)
            what = f"induction ({corruption})"
        else:
            raise CircuitlabError(f"unknown task {task!r}; choose induction, or give clean and corrupt prompts")
        result = find_circuit(model, data, metric, method, edges=edges, steps=steps, progress=False)
        self.runs += 1
        name = f"run {self.runs}: {what}, {method}"
        self.entries[name] = _Entry(name, result.to_dict(), circuit_svg(result.circuit), "run on the loaded model")
        runs = [n for n, e in self.entries.items() if e.source == "run on the loaded model"]
        for old in runs[:-MAX_RUNS]:
            del self.entries[old]
        return self.circuit(name)


# POST /api/circuits/run: the rows (the built-in task by default, or prompt pairs: the explorer's own, since the
# command reads files), and discovery's options as DiscoveryOptions declares them (steps held to SERVER_STEPS).
RunRequest = request_model(DiscoveryOptions, "RunRequest", only=("method", "metric", "edges", "steps"),
                           choices={"method": METHODS, "metric": METRICS}, limits={"steps": SERVER_STEPS}, strict=True,
                           extra={
    "task": (Literal["induction"] | None, Field(default="induction", description="built-in task (or give prompts)")),
    "corruption": (Literal.__getitem__(INDUCTION_CORRUPTIONS), Field(
        default=INDUCTION_CORRUPTIONS[0], description="the induction task's corrupted rows")),
    "clean": (list[str] | None, Field(default=None, description="clean prompts, one per row (instead of a task)")),
    "corrupt": (list[str] | None, Field(default=None, description="corrupted prompts, same token length per row"))})


def add_circuit_routes(app, browser: CircuitBrowser, lock: threading.Lock, encode) -> None:
    """GET /api/circuits, GET /api/circuit, GET /api/circuit.svg,
    POST /api/circuits/run (409 without a model). encode(prompt) -> ids checks the server's prompt limits."""
    from starlette.exceptions import HTTPException

    @app.get("/api/circuits")
    def circuits() -> dict[str, Any]:
        """The saved and discovered circuits, and whether discovery can run here."""
        return {"circuits": browser.list_circuits(), "can_run": browser.model is not None}

    @app.get("/api/circuit")
    def circuit(name: str) -> dict[str, Any]:
        """One circuit: summary, edges, faithfulness curve, top edges by |score|."""
        return browser.circuit(name)

    @app.get("/api/circuit.svg")
    def circuit_svg(name: str) -> Response:
        """The circuit's drawing."""
        return Response(browser.svg(name), media_type="image/svg+xml", headers={"cache-control": "no-cache"})

    def run(req: Any) -> dict[str, Any]:
        """Discovery on the loaded model (built-in induction task or prompt pairs); the result becomes a circuit."""
        if browser.model is None:
            raise HTTPException(409, "no model loaded: start the server with `circuitlab serve --checkpoint RUN` "
                                     "to run discovery")
        for prompt in (req.clean or []) + (req.corrupt or []):
            encode(prompt)  # the server's length limits
        with lock:
            return browser.run(req.task, req.corruption, req.method, req.metric, req.edges, req.clean, req.corrupt,
                               req.steps)

    run.__annotations__["req"] = RunRequest   # a generated model: the annotation is the class itself
    app.post("/api/circuits/run")(run)




def _load(served: Served, given: Mapping[str, Any]) -> CircuitBrowser:
    """The circuit browser of create_app's circuits (`circuitlab circuit` output folders; none: an empty one)."""
    return CircuitBrowser.load(served.model, served.tokenizer, given.get("circuits") or [])


PAGE = Page("circuits", "/circuits", "circuits.html", static={"circuits.js": JS}, load=_load, keywords=("circuits",),
            routes=lambda app, s: add_circuit_routes(app, s.parts["circuits"], s.lock, s.encode),
            banner=lambda given: "circuits: /circuits")

__all__ = ["CircuitBrowser", "add_circuit_routes"]
