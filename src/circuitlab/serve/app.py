"""The explorer web app: `create_app(run_dir)` returns a FastAPI app (run it with uvicorn, or test it
with fastapi.testclient.TestClient).

Pages (static files from circuitlab/serve/static, by fixed names only):
    /            the explorer: tokens, every head's attention, logit lens, direct logit attribution
    /adder       the hand-built adder, layer by layer
    /features    the feature browser of the dictionaries loaded with --dictionary (serve/features.py)
    /inputs      input attribution, logit lens vs tuned lens, steering (serve/inputs.py)
    /circuits    circuits saved by `circuitlab circuit` (--circuit) and discovery on the model (serve/circuits.py)
    /graphs      attribution graphs under the runs folder (--graphs) in the interactive viewer; interventions
                 and new graphs with --transcoders (serve/graphs.py)
JSON API:
    GET  /api/model      the loaded model's config, limits and head labels ({"loaded": false} without one)
    POST /api/analyse    {"prompt": str, "target"?: str | int, "position"?: int, "figures"?: bool}
    GET  /api/adder      ?a=17&b=25[&design=post|carry&digits=2]   (POST takes the same fields as JSON)
                         (the three: prompt.py)
    GET  /api/dictionaries, GET /api/features, GET /api/feature, POST /api/features/prompt   (features.py)
    POST /api/attribute, POST /api/lens, POST /api/steer                                     (inputs.py)
    GET  /api/circuits, GET /api/circuit, GET /api/circuit.svg, POST /api/circuits/run        (circuits.py)
    GET  /api/graphs, GET /api/graphs/graph, GET /api/graphs/feature, POST /api/graphs/qparams,
    POST /api/graphs/intervene, POST /api/graphs/compute                                       (graphs.py)

The app is assembled here from route groups of one job each: pages and static files, error handlers (here),
the prompt API (prompt.py), features, inputs, circuits, graphs, and the ASGI guard (guard.py).

Every error is JSON {"detail": "<one line>"} with a 4xx status: 422 for bad input, 409 when the explorer
has no model, 413 for an oversized body, 404 for unknown paths. An unexpected exception is answered
with a JSON 500 (and logged), never an HTML page or a stack trace.
"""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from circuitlab.atomic import json_text
from circuitlab.errors import CircuitlabError
import circuitlab.serve.prompt as prompt_page
from circuitlab.serve.guard import Guard

if TYPE_CHECKING:
    from circuitlab.model import Transformer

log = logging.getLogger("circuitlab.serve")

STATIC_DIR = Path(__file__).parent / "static"
# The only files served: name in the URL -> (file in STATIC_DIR, media type). Nothing else is looked up.
STATIC_FILES = {
    "common.js": "text/javascript; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "adder.js": "text/javascript; charset=utf-8",
    "features.js": "text/javascript; charset=utf-8",
    "inputs.js": "text/javascript; charset=utf-8",
    "circuits.js": "text/javascript; charset=utf-8",
    "graphs.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
PAGES = {"/": "index.html", "/adder": "adder.html"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

DEFAULT_MAX_PROMPT_CHARS = 2000
DEFAULT_MAX_TOKENS = 128
DEFAULT_MAX_BODY_BYTES = 64 * 1024


# ---------------------------------------------------------------------------- the app


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ())]
    if err.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    if loc[:1] == ["body"] and len(loc) == 1:
        return "the request needs a JSON object body" if err.get("type") != "missing" else \
            "the request needs a JSON body"
    where = loc[1] if len(loc) > 1 and loc[0] in ("body", "query", "path") else ".".join(loc)
    # A union (e.g. int | str) fails once per member: name them all in one line.
    members = [e for e in errors if [str(x) for x in e.get("loc", ())][:2] == loc[:2]]
    if len(loc) == 3 and len(members) > 1:
        wanted = " or ".join(str(e.get("msg", "")).removeprefix("Input should be ") for e in members)
        return f"{where}: should be {wanted}"
    return f"{where}: {err.get('msg', 'invalid value')}"


@functools.lru_cache(maxsize=1)
def _plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


@dataclass
class Loaded:
    """What the explorer serves, loaded (and checked) before any server starts. model and tokenizer are None
    without a run folder; meta: the checkpoint's metadata; checkpoint_name: its last two path parts."""

    model: Any = None
    tokenizer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    checkpoint_name: str | None = None
    tuned: Any = None             # TunedLens for /inputs
    browser: Any = None           # FeatureBrowser for /features
    circuit_browser: Any = None   # CircuitBrowser for /circuits
    graph_browser: Any = None     # GraphBrowser for /graphs


def create_app(run_dir: Path | str | None, *, max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
               max_tokens: int = DEFAULT_MAX_TOKENS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               allowed_hosts: list[str] | None = None, device: str = "cpu",
               dictionaries: list[str | Path] | None = None, lens: str | Path | None = None,
               circuits: list[str | Path] | None = None, graphs: str | Path | None = None,
               transcoders: str | Path | None = None, graph_runner: Any = None,
               transcoder_set: str | None = None) -> FastAPI:
    """The explorer app for the run (or checkpoint) folder run_dir; None serves the adder page alone.
    dictionaries: dictionary folders for the feature browser (/features); they need run_dir's model.
    lens: a tuned-lens folder for /inputs (default: run_dir/tuned_lens when one is saved there).
    circuits: `circuitlab circuit` output folders for /circuits (shown with or without a model).
    graphs: the runs folder whose `circuitlab graph` outputs /graphs lists (and where it writes new ones).
    transcoders: the model's transcoders (a `sae train` run or circuit-tracer's layout), for interventions,
    feature cards and new graphs on /graphs; transcoder_set: which set of a run holding several (Transcoders.load's
    set_name). graph_runner: what writes a new graph folder
    (experiments.graph_experiment.graph_experiment; `circuitlab serve` passes it, this layer cannot import it).

    The model is loaded here, so a missing or corrupt checkpoint is a CircuitlabError before any
    server starts. max_tokens is capped by the model's context. allowed_hosts: Host header names
    accepted (None: any; `circuitlab serve` passes the loopback names when bound to loopback).
    """
    for name, value in (("max_prompt_chars", max_prompt_chars), ("max_tokens", max_tokens),
                        ("max_body_bytes", max_body_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CircuitlabError(f"{name} must be a positive whole number, got {value!r}")
    loaded = _load_model(run_dir, device)
    if loaded.model is not None:
        max_tokens = prompt_page.token_limit(loaded.model, max_tokens)
    loaded.tuned = _load_tuned_lens(run_dir, lens, loaded.model, device)
    _load_browsers(loaded, dictionaries, circuits, graphs, transcoders, transcoder_set, graph_runner)
    lock = threading.Lock()  # one analysis at a time: the machine's cores are better used by torch

    def encode_prompt(prompt: str) -> list[int]:
        if len(prompt) > max_prompt_chars:
            raise CircuitlabError(f"the prompt is {len(prompt)} characters; the limit is {max_prompt_chars}")
        return prompt_page.encode_prompt(loaded.tokenizer, prompt, max_tokens)

    app = FastAPI(title="circuitlab explorer", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")
    limits = {"max_prompt_chars": max_prompt_chars, "max_tokens": max_tokens, "max_body_bytes": max_body_bytes,
              "adder_max_digits": prompt_page.ADDER_MAX_DIGITS}
    _add_error_handlers(app)
    _add_page_routes(app)
    prompt_page.add_prompt_routes(app, loaded.model, loaded.tokenizer, loaded.meta, loaded.checkpoint_name, limits,
                                  lock, encode_prompt)
    _add_method_routes(app, loaded, lock, encode_prompt)
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    return app


def _load_model(run_dir: Path | str | None, device: str) -> Loaded:
    """The run folder's model, tokenizer and metadata (all None / empty without one)."""
    if run_dir is None:
        return Loaded()
    from circuitlab.training import load_checkpoint

    model, tokenizer, meta = load_checkpoint(run_dir, device=device)
    if tokenizer is None:
        raise CircuitlabError(f"{run_dir} has no tokenizer saved with it, so prompts cannot be encoded; "
                              "serve a run written by `circuitlab train` or `circuitlab import`")
    checkpoint_name = "/".join(Path(run_dir).resolve().parts[-2:])  # e.g. "demo/2l": no full path shown
    return Loaded(model, tokenizer, meta, checkpoint_name)


def _load_tuned_lens(run_dir: Path | str | None, lens: str | Path | None, model: Transformer | None, device: str) -> Any:
    """The tuned lens of /inputs: the --lens folder, else the run's saved one; None without either."""
    from circuitlab.analysis.lens.tuned import TunedLens, default_lens_dir

    folder: str | Path
    if lens is None:
        if run_dir is None:
            return None
        folder = default_lens_dir(run_dir)
    else:
        if model is None:
            raise CircuitlabError("--lens needs --checkpoint: the model the tuned lens was trained on")
        if not TunedLens.exists(lens):
            raise CircuitlabError(f"--lens {lens} holds no tuned lens; train one with `circuitlab lens train`")
        folder = lens
    return TunedLens.load(folder, model).to(device) if TunedLens.exists(folder) else None


def _load_browsers(loaded: Loaded, dictionaries: list[str | Path] | None, circuits: list[str | Path] | None,
                   graphs: str | Path | None, transcoders: str | Path | None, transcoder_set: str | None,
                   graph_runner: Any) -> None:
    """The feature, circuit and graph browsers into loaded, each option checked against the model."""
    model, tokenizer = loaded.model, loaded.tokenizer
    if dictionaries:
        if model is None:
            raise CircuitlabError("--dictionary needs --checkpoint: the model the dictionaries were trained on")
        from circuitlab.serve.features import FeatureBrowser

        loaded.browser = FeatureBrowser.load(model, tokenizer, dictionaries)
    from circuitlab.serve.circuits import CircuitBrowser

    loaded.circuit_browser = CircuitBrowser.load(model, tokenizer, circuits or [])
    tc = None
    if transcoders is not None:
        if model is None:
            raise CircuitlabError("--transcoders needs --checkpoint: the model the transcoders were trained on")
        from circuitlab.graphs import Transcoders

        tc = Transcoders.load(model, transcoders, set_name=transcoder_set)
    if graphs is not None and not Path(graphs).is_dir():
        raise CircuitlabError(f"--graphs {graphs} is not a folder (give the runs folder holding `circuitlab graph` "
                              "outputs)")
    from circuitlab.serve.graphs import GraphBrowser

    from circuitlab.viz.graph_view import saved_dashboards

    loaded.graph_browser = GraphBrowser(Path(graphs) if graphs is not None else None, model, tokenizer, tc,
                                        runner=graph_runner, saved=saved_dashboards(transcoders))


def _add_error_handlers(app: FastAPI) -> None:
    """Every error a one-line JSON {"detail": ...}: 422 for a CircuitlabError or a bad request, the HTTP
    status of an HTTP error, 500 (logged) for anything unexpected."""

    @app.exception_handler(CircuitlabError)
    async def _user_error(request: Request, exc: CircuitlabError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc), "errors": _plain_errors(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else json_text(exc.detail)
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server log has the details"},
                            status_code=500)


def page_response(name: str) -> FileResponse:
    """A static HTML page of STATIC_DIR, never cached (the explorer changes with the package)."""
    return FileResponse(STATIC_DIR / name, media_type="text/html; charset=utf-8", headers={"cache-control": "no-cache"})


def _add_page_routes(app: FastAPI) -> None:
    """GET / and /adder (the pages), /static/... (a fixed list of files, plotly.js and the graph viewer's
    assets), /favicon.ico."""

    @app.get("/", include_in_schema=False)
    def explorer_page() -> FileResponse:
        return page_response(PAGES["/"])

    @app.get("/adder", include_in_schema=False)
    def adder_page() -> FileResponse:
        return page_response(PAGES["/adder"])

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return Response(_plotly_js(), media_type="text/javascript; charset=utf-8",
                        headers={"cache-control": "max-age=86400"})

    @app.get("/static/graph_view.js", include_in_schema=False)
    def graph_view_js() -> Response:
        from circuitlab.viz.graph_view import asset

        return Response(asset("graph_view.js"), media_type=STATIC_FILES["graphs.js"],
                        headers={"cache-control": "no-cache"})

    @app.get("/static/graph_view.css", include_in_schema=False)
    def graph_view_css() -> Response:
        from circuitlab.viz.graph_view import asset

        return Response(asset("graph_view.css"), media_type=STATIC_FILES["style.css"],
                        headers={"cache-control": "no-cache"})

    @app.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> FileResponse:
        if name not in STATIC_FILES:  # a fixed list: no path from the URL ever reaches the file system
            raise StarletteHTTPException(404, f"no static file {name!r}")
        return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name], headers={"cache-control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)


def _add_method_routes(app: FastAPI, loaded: Loaded, lock: threading.Lock, encode_prompt: Any) -> None:
    """The pages and APIs of /features, /inputs, /circuits and /graphs, each from its own module."""
    from circuitlab.serve.circuits import add_circuit_routes
    from circuitlab.serve.features import add_feature_routes
    from circuitlab.serve.graphs import add_graph_routes
    from circuitlab.serve.inputs import add_input_routes

    add_feature_routes(app, loaded.browser, lock, encode_prompt, page_response)
    add_input_routes(app, loaded.model, loaded.tokenizer, loaded.tuned, lock, encode_prompt, page_response)
    add_circuit_routes(app, loaded.circuit_browser, lock, encode_prompt, page_response)
    add_graph_routes(app, loaded.graph_browser, lock, encode_prompt, page_response)


def _plain_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()[:10]]
