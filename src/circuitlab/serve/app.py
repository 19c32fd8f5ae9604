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
    GET  /api/dictionaries, GET /api/features, GET /api/feature, POST /api/features/prompt   (features.py)
    POST /api/attribute, POST /api/lens, POST /api/steer                                     (inputs.py)
    GET  /api/circuits, GET /api/circuit, GET /api/circuit.svg, POST /api/circuits/run        (circuits.py)
    GET  /api/graphs, GET /api/graphs/graph, GET /api/graphs/feature, POST /api/graphs/qparams,
    POST /api/graphs/intervene, POST /api/graphs/compute                                       (graphs.py)

Every error is JSON {"detail": "<one line>"} with a 4xx status: 422 for bad input, 409 when the explorer
has no model, 413 for an oversized body, 404 for unknown paths. An unexpected exception is answered
with a JSON 500 (and logged), never an HTML page or a stack trace.
"""
from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from circuitlab.atomic import json_text
from circuitlab.errors import CircuitlabError
import circuitlab.serve.prompt as prompt_page

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

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    # Scripts and data from this server only; plotly sets inline styles and draws to data:/blob: images.
    (b"content-security-policy",
     b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
     b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'"),
]


# ---------------------------------------------------------------------------- request bodies


class AnalyseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="the text to analyse")
    target: StrictInt | str | None = Field(
        default=None, description="token for direct logit attribution: a token id, or text that is one token; "
                                  "default the model's top prediction")
    position: StrictInt | None = Field(default=None, description="position for DLA (default: the last token)")
    figures: StrictBool = Field(default=False, description="also return plotly figure JSON of the three views")


class AdderRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: StrictInt | str = Field(description="first number")
    b: StrictInt | str = Field(description="second number")
    design: Literal["post", "carry"] = Field(
        default="post", description="post: the reference post's 2-digit adder; carry: the exact adder")
    digits: int = Field(default=2, ge=1, le=prompt_page.ADDER_MAX_DIGITS, description="digits of a and of b")


# ---------------------------------------------------------------------------- ASGI guard


def _json_bytes(status: int, detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json_text({"detail": detail}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


class Guard:
    """Pure ASGI middleware: refuses oversized bodies (413) and, with allowed_hosts, unknown Host headers
    (400: a web page elsewhere cannot reach the local server through DNS rebinding); adds security
    headers to every response. Its errors are JSON like the app's."""

    def __init__(self, app, max_body_bytes: int, allowed_hosts: list[str] | None) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.allowed_hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + SECURITY_HEADERS}
            await send(message)

        async def refuse(status: int, detail: str) -> None:
            headers, body = _json_bytes(status, detail)
            await send_with_headers({"type": "http.response.start", "status": status, "headers": headers})
            await send_with_headers({"type": "http.response.body", "body": body})

        headers = dict(scope.get("headers") or [])
        if self.allowed_hosts is not None:
            host = _host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                await refuse(400, f"unexpected Host header {host!r}; open the explorer at http://127.0.0.1")
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await refuse(400, "the Content-Length header is not a number")
                return
            if declared > self.max_body_bytes:
                await refuse(413, f"the request body is {declared} bytes; the limit is {self.max_body_bytes}")
                return
        # Read the whole body (it is small, or we stop at the limit), then replay it to the app.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await refuse(413, f"the request body is over the limit of {self.max_body_bytes} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send_with_headers)


def _host_name(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1', '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


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
    model = tokenizer = None
    meta: dict[str, Any] = {}
    if run_dir is not None:
        from circuitlab.training import load_checkpoint

        model, tokenizer, meta = load_checkpoint(run_dir, device=device)
        if tokenizer is None:
            raise CircuitlabError(f"{run_dir} has no tokenizer saved with it, so prompts cannot be encoded; "
                                  "serve a run written by `circuitlab train` or `circuitlab import`")
        max_tokens = prompt_page.token_limit(model, max_tokens)
        checkpoint_name = "/".join(Path(run_dir).resolve().parts[-2:])  # e.g. "demo/2l": no full path shown
    tuned = None
    if lens is not None or run_dir is not None:
        from circuitlab.analysis.lens.tuned import TunedLens, default_lens_dir

        if lens is not None and model is None:
            raise CircuitlabError("--lens needs --checkpoint: the model the tuned lens was trained on")
        if lens is not None and not TunedLens.exists(lens):
            raise CircuitlabError(f"--lens {lens} holds no tuned lens; train one with `circuitlab lens train`")
        folder = lens if lens is not None else default_lens_dir(run_dir)
        tuned = TunedLens.load(folder, model).to(device) if TunedLens.exists(folder) else None
    browser = None
    if dictionaries:
        if model is None:
            raise CircuitlabError("--dictionary needs --checkpoint: the model the dictionaries were trained on")
        from circuitlab.serve.features import FeatureBrowser

        browser = FeatureBrowser.load(model, tokenizer, dictionaries)
    from circuitlab.serve.circuits import CircuitBrowser, add_circuit_routes

    circuit_browser = CircuitBrowser.load(model, tokenizer, circuits or [])
    tc = None
    if transcoders is not None:
        if model is None:
            raise CircuitlabError("--transcoders needs --checkpoint: the model the transcoders were trained on")
        from circuitlab.graphs import Transcoders

        tc = Transcoders.load(model, transcoders, set_name=transcoder_set)
    if graphs is not None and not Path(graphs).is_dir():
        raise CircuitlabError(f"--graphs {graphs} is not a folder (give the runs folder holding `circuitlab graph` "
                              "outputs)")
    from circuitlab.serve.graphs import GraphBrowser, add_graph_routes

    from circuitlab.viz.graph_view import saved_dashboards

    graph_browser = GraphBrowser(Path(graphs) if graphs is not None else None, model, tokenizer, tc,
                                 runner=graph_runner, saved=saved_dashboards(transcoders))
    lock = threading.Lock()  # one analysis at a time: the machine's cores are better used by torch
    labels_cache: dict[str, Any] = {}

    def labels() -> tuple[dict[str, list[str]], str | None]:
        with lock:
            if "labels" not in labels_cache:
                labels_cache["labels"] = prompt_page.head_labels(model)
            return labels_cache["labels"]

    app = FastAPI(title="circuitlab explorer", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")
    limits = {"max_prompt_chars": max_prompt_chars, "max_tokens": max_tokens, "max_body_bytes": max_body_bytes,
              "adder_max_digits": prompt_page.ADDER_MAX_DIGITS}

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

    # ------------------------------------------------------------------ pages and static files

    def _page(name: str) -> FileResponse:
        return FileResponse(STATIC_DIR / name, media_type="text/html; charset=utf-8",
                            headers={"cache-control": "no-cache"})

    @app.get("/", include_in_schema=False)
    def explorer_page() -> FileResponse:
        return _page(PAGES["/"])

    @app.get("/adder", include_in_schema=False)
    def adder_page() -> FileResponse:
        return _page(PAGES["/adder"])

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

    # ------------------------------------------------------------------ JSON API

    @app.get("/api/model")
    def model_info() -> dict[str, Any]:
        """The loaded model's config, head labels and the server's limits."""
        if model is None:
            return {"loaded": False, "limits": limits,
                    "message": "no model loaded: start the server with `circuitlab serve --checkpoint RUN` "
                               "to use the explorer (the adder page works without one)"}
        head_labels, note = labels()
        return {**prompt_page.model_summary(model, tokenizer, meta, head_labels, note),
                "checkpoint": checkpoint_name, "limits": limits}

    @app.post("/api/analyse")
    def analyse_route(req: AnalyseRequest) -> dict[str, Any]:
        """Tokens, attention patterns [layer][head][query][key], logit lens and DLA for a prompt."""
        if model is None:
            raise StarletteHTTPException(409, "no model loaded: start the server with "
                                              "`circuitlab serve --checkpoint RUN` to analyse prompts")
        if len(req.prompt) > max_prompt_chars:
            raise CircuitlabError(f"the prompt is {len(req.prompt)} characters; the limit is {max_prompt_chars}")
        ids = prompt_page.encode_prompt(tokenizer, req.prompt, max_tokens)
        head_labels, _ = labels()
        with lock:
            found = prompt_page.analyse_prompt(model, tokenizer, ids, req.target, req.position, figures=req.figures,
                                            head_labels=head_labels)
        found["head_labels"] = head_labels
        return found

    @app.get("/api/adder")
    def adder_get(params: Annotated[AdderRequest, Query()]) -> dict[str, Any]:
        """a + b through the hand-built adder, stage by stage."""
        return adder_post(params)

    @app.post("/api/adder")
    def adder_post(req: AdderRequest) -> dict[str, Any]:
        """The same as GET, with the fields as a JSON body."""
        with lock:
            return prompt_page.adder_walkthrough(req.a, req.b, req.design, req.digits)

    def encode_prompt(prompt: str) -> list[int]:
        if len(prompt) > max_prompt_chars:
            raise CircuitlabError(f"the prompt is {len(prompt)} characters; the limit is {max_prompt_chars}")
        return prompt_page.encode_prompt(tokenizer, prompt, max_tokens)

    from circuitlab.serve.features import add_feature_routes

    add_feature_routes(app, browser, lock, encode_prompt, _page)
    from circuitlab.serve.inputs import add_input_routes

    add_input_routes(app, model, tokenizer, tuned, lock, encode_prompt, _page)
    add_circuit_routes(app, circuit_browser, lock, encode_prompt, _page)
    add_graph_routes(app, graph_browser, lock, encode_prompt, _page)
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    return app


def _plain_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()[:10]]
