"""The explorer web app: `create_app(run_dir)` returns a FastAPI app (run it with uvicorn, or test it
with fastapi.testclient.TestClient).

The pages are the registry's (serve/pages.py: one module each, declaring its URL, static page and files, what it
loads and its route group):
    /            the explorer: tokens, every head's attention, logit lens, direct logit attribution (prompt.py)
    /adder       the hand-built adder, layer by layer (prompt.py)
    /inputs      input attribution, logit lens vs tuned lens, steering (inputs.py)
    /features    the feature browser of the dictionaries loaded with --dictionary (features.py)
    /circuits    circuits saved by `circuitlab circuit` (--circuit) and discovery on the model (circuits.py)
    /graphs      attribution graphs under the runs folder, in the interactive viewer (graphs.py)
Each page module's docstring lists its JSON API; GET /api/openapi.json lists them all.

The app is assembled here: the model loaded, each page's part loaded and its routes added, static files (a fixed
list: each page's own and the shared ones below), error handlers, and the ASGI guard (guard.py).

Every error is JSON {"detail": "<one line>"} with a 4xx status: 422 for bad input, 409 when the explorer
has no model, 413 for an oversized body, 404 for unknown paths. An unexpected exception is answered
with a JSON 500 (and logged), never an HTML page or a stack trace.
"""
from __future__ import annotations

import argparse
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from circuitlab.atomic import json_text
from circuitlab.checks import COUNT, Number
from circuitlab.errors import CircuitlabError, InputError
import circuitlab.serve.prompt as prompt_page
from circuitlab.serve.guard import Guard
from circuitlab.serve.page import CSS, JS, STATIC_DIR, Served, page_response
from circuitlab.serve.pages import PAGES, page_keywords
from circuitlab.serve.requests import RULE_ERROR
from circuitlab.spec import Options, option, options_of

log = logging.getLogger("circuitlab.serve")

# The shared static files (each page adds its own: Page.static): name in the URL -> media type. Nothing else is
# looked up.
STATIC_FILES = {"common.js": JS, "style.css": CSS}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

DEFAULT_MAX_BODY_BYTES = 64 * 1024   # the guard's limit on a request body (no flag sets it)
PORT = Number(int, low=1, high=65535)


@dataclass(frozen=True)
class ServeOptions(Options):
    """What `circuitlab serve` takes, declared once (circuitlab.spec): each flag's default, rule and help; create_app
    reads its keyword defaults from here. device is the Python API's alone, its flag written in commands/serve.py
    from this default (the package writes device="cpu" as the default of ~20 loaders, so it is no option).
    The port and the prompt limits are read as any whole number and refused by check() in the words the explorer
    has always used ("--port must be from 1 to 65535", create_app's "max_tokens must be a positive whole number")."""

    checkpoint: str | Path | None = option(None, aliases=("--model",),
                                           help="a run or checkpoint directory for the explorer page (without one, "
                                                "only the adder page works)")
    dictionaries: tuple[str | Path, ...] = option((), repeat=True, flag="--dictionary", metavar="DIR",
                                                  help="a sparse dictionary for the checkpoint's model (ours, SAELens, "
                                                       "Gemma Scope 1/2, Llama Scope, a circuit-tracer "
                                                       "layer_N.safetensors), for the feature browser at /features "
                                                       "(repeat for several; its dashboards/ subfolder is used when "
                                                       "present)")
    lens: str | Path | None = option(None, metavar="DIR",
                                     help="a tuned lens trained on the checkpoint's model (`circuitlab lens train`) for "
                                          "the /inputs page (default: <checkpoint>/tuned_lens when there is one)")
    circuits: tuple[str | Path, ...] = option((), repeat=True, flag="--circuit", metavar="DIR",
                                              help="a folder written by `circuitlab circuit` to show at /circuits "
                                                   "(repeat for several); with --checkpoint the page also runs "
                                                   "discovery on the model")
    graphs: str | Path | None = option(None, metavar="DIR", help="runs folder whose `circuitlab graph` outputs /graphs "
                                                                 "lists (default: runs/ when it exists)")
    transcoders: str | Path | None = option(None, metavar="DIR", help="the model's transcoders: interventions, feature "
                                                                      "cards and new graphs on /graphs")
    transcoder_set: str | None = option(None, metavar="NAME",
                                        help="when --transcoders is a run holding several sets (clt-demo), the one to "
                                             "use (as circuitlab graph --transcoder-set: clt-batchtopk or transcoders)")
    host: str = option("127.0.0.1", help="address to bind (default {default}: this machine only; anything else "
                                         "exposes the explorer to your network)")
    port: int = option(8000, PORT, arg=int, help="port (default {default})")
    max_tokens: int = option(128, COUNT, arg=int, help="longest prompt in tokens (default {default}; also capped by the "
                                                       "model's context)")
    max_prompt_chars: int = option(2000, COUNT, arg=int, help="longest prompt in characters (default {default})")
    device: str = "cpu"

    def check(self, error: type[Exception] = InputError) -> ServeOptions:
        """The port and the limits in the explorer's words (see check_limits), then every field's rule."""
        self.check_limits(cli=False, error=error)
        return super().check(error)

    def check_limits(self, cli: bool, error: type[Exception] = InputError) -> None:
        """The port (named as the command line (cli) or Python spells it), then create_app's prompt limits."""
        if PORT.problem(self.port) is not None:
            raise error(f"{'--port' if cli else 'port'} must be from {PORT.low:g} to {PORT.high:g}, got {self.port}")
        check_limits(self.max_prompt_chars, self.max_tokens, error=error)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """The command's options, the port in its flag's spelling first."""
        cls(**{f.name: getattr(args, f.name) for f, _ in options_of(cls)}).check_limits(cli=True)
        return super().from_args(args)

    def given(self, runs: Path | str = "runs") -> dict[str, Any]:
        """create_app's page keywords these options give (graphs: the runs folder when none is given and it exists)."""
        graphs = self.graphs if self.graphs is not None else (str(runs) if Path(runs).is_dir() else None)
        return {"dictionaries": list(self.dictionaries), "lens": self.lens, "circuits": list(self.circuits),
                "graphs": graphs, "transcoders": self.transcoders, "transcoder_set": self.transcoder_set}


def check_limits(max_prompt_chars: Any, max_tokens: Any, max_body_bytes: Any = DEFAULT_MAX_BODY_BYTES,
                 error: type[Exception] = CircuitlabError) -> None:
    """Each limit a positive whole number (the rule COUNT, in the explorer's words), or a one-line error."""
    for name, value in (("max_prompt_chars", max_prompt_chars), ("max_tokens", max_tokens),
                        ("max_body_bytes", max_body_bytes)):
        if COUNT.problem(value) is not None:
            raise error(f"{name} must be a positive whole number, got {value!r}")


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
    if err.get("type") == RULE_ERROR:   # a generated model's rule: its message names the field
        return str(err.get("msg", "invalid value"))
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


def create_app(run_dir: Path | str | None, *, max_prompt_chars: int = ServeOptions.max_prompt_chars,
               max_tokens: int = ServeOptions.max_tokens, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               allowed_hosts: list[str] | None = None, device: str = ServeOptions.device, **given: Any) -> FastAPI:
    """The explorer app for the run (or checkpoint) folder run_dir; None serves the adder page alone.
    given: the pages' own keywords (serve/pages.py), each read by the page that declares it:
    dictionaries: dictionary folders for the feature browser (/features); they need run_dir's model.
    lens: a tuned-lens folder for /inputs (default: run_dir/tuned_lens when one is saved there).
    circuits: `circuitlab circuit` output folders for /circuits (shown with or without a model).
    graphs, transcoders, transcoder_set, graph_runner: the runs folder /graphs lists and writes new graphs under,
    and what interventions, feature cards and new graphs need (serve/graphs.py's _load).

    The model and every page's part are loaded here, so a missing or corrupt checkpoint (or dictionary, lens,
    transcoders) is a CircuitlabError before any server starts. max_tokens is capped by the model's context.
    allowed_hosts: Host header names accepted (None: any; `circuitlab serve` passes the loopback names when bound
    to loopback).
    """
    check_limits(max_prompt_chars, max_tokens, max_body_bytes)
    unknown = sorted(set(given) - page_keywords())
    if unknown:
        raise TypeError(f"create_app() got an unexpected keyword argument {unknown[0]!r}")
    served = _load_model(run_dir, device)
    if served.model is not None:
        max_tokens = prompt_page.token_limit(served.model, max_tokens)
    pages_given = {**given, "run_dir": run_dir, "device": device}
    for page in PAGES.values():
        if page.load is not None:
            served.parts[page.name] = page.load(served, pages_given)

    def encode_prompt(prompt: str) -> list[int]:
        if len(prompt) > max_prompt_chars:
            raise CircuitlabError(f"the prompt is {len(prompt)} characters; the limit is {max_prompt_chars}")
        return prompt_page.encode_prompt(served.tokenizer, prompt, max_tokens)

    served.encode = encode_prompt
    served.limits = {"max_prompt_chars": max_prompt_chars, "max_tokens": max_tokens, "max_body_bytes": max_body_bytes,
                     "adder_max_digits": prompt_page.ADDER_MAX_DIGITS}
    app = FastAPI(title="circuitlab explorer", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")
    _add_error_handlers(app)
    _add_page_routes(app, served)
    app.add_middleware(Guard, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    return app


def _load_model(run_dir: Path | str | None, device: str) -> Served:
    """The run folder's model, tokenizer and metadata (all None / empty without one)."""
    if run_dir is None:
        return Served()
    from circuitlab.training import load_checkpoint

    model, tokenizer, meta = load_checkpoint(run_dir, device=device)
    if tokenizer is None:
        raise CircuitlabError(f"{run_dir} has no tokenizer saved with it, so prompts cannot be encoded; "
                              "serve a run written by `circuitlab train` or `circuitlab import`")
    checkpoint_name = "/".join(Path(run_dir).resolve().parts[-2:])  # e.g. "demo/2l": no full path shown
    return Served(model, tokenizer, meta, checkpoint_name)


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


def _add_page_routes(app: FastAPI, served: Served) -> None:
    """Each page of the registry (its page, its routes), plotly.js, /favicon.ico, then /static/... (a fixed list of
    files: the shared ones and each page's; registered last, so a page's own /static/ routes come first)."""

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return Response(_plotly_js(), media_type="text/javascript; charset=utf-8",
                        headers={"cache-control": "max-age=86400"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    files = dict(STATIC_FILES)
    for page in PAGES.values():
        if page.path is not None and page.html is not None:
            app.get(page.path, include_in_schema=False)(functools.partial(page_response, page.html))
        if page.routes is not None:
            page.routes(app, served)
        files.update(page.static)

    @app.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> FileResponse:
        if name not in files:  # a fixed list: no path from the URL ever reaches the file system
            raise StarletteHTTPException(404, f"no static file {name!r}")
        return FileResponse(STATIC_DIR / name, media_type=files[name], headers={"cache-control": "no-cache"})


def _plain_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()[:10]]
