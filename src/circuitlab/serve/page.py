"""What every explorer page module declares (its Page record) and what its routes are given (Served).

A page module (prompt.py, inputs.py, features.py, circuits.py, graphs.py) holds, in one place: its URL and page
(a static file, or a function rendering it, as graphs.py's: the attribution-graph viewer's browser), the static
files its page loads, what it needs loaded from create_app's keywords (checked before any server starts), its
route group, and the line `circuitlab serve` prints for it. serve/pages.py lists the Page records;
create_app and `circuitlab serve` iterate over them, so a new page is one module and one line there.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi.responses import FileResponse, HTMLResponse, Response

if TYPE_CHECKING:
    from fastapi import FastAPI

    from circuitlab.model import Transformer

STATIC_DIR = Path(__file__).parent / "static"
JS, CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
# The explorer's header links, in order (path, words as HTML); the static pages write the same (test_pages checks).
NAV = (("/", "explorer"), ("/adder", "hand-built adder"), ("/features", "features"),
       ("/inputs", "inputs &amp; lenses"), ("/circuits", "circuits"), ("/graphs", "graphs"))


def nav_html(current: str) -> str:
    """The explorer's header links (<nav>), the page at path `current` marked as the one shown."""
    mark = ' aria-current="page"'
    links = "".join(f'<a href="{path}"{mark if path == current else ""}>{words}</a>' for path, words in NAV)
    return f"<nav>{links}</nav>"


def page_response(page: str | Callable[[], str]) -> Response:
    """A page: a static HTML file of STATIC_DIR (by name) or what a function renders; never cached (the explorer
    changes with the package)."""
    headers = {"cache-control": "no-cache"}
    if callable(page):
        return HTMLResponse(page(), headers=headers)
    return FileResponse(STATIC_DIR / page, media_type="text/html; charset=utf-8", headers=headers)


def _no_encoder() -> list[int]:
    raise RuntimeError("Served.encode is set by create_app (it checks the server's prompt limits)")


@dataclass
class Served:
    """What the pages' routes read: the run folder's model, tokenizer and metadata (None / empty without one),
    checkpoint_name (its last two path parts), the server's limits, the one lock analyses take, encode(prompt) ->
    ids (checked against the limits), and parts: what each page loaded ({page name: its Page.load's value})."""

    model: Transformer | None = None
    tokenizer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    checkpoint_name: str | None = None
    limits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    encode: Callable[[str], list[int]] = field(default=lambda prompt: _no_encoder())
    parts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Page:
    """One explorer page in the registry (serve/pages.py).

    name: its key in Served.parts. path / html: its URL and the page served there, a static page of STATIC_DIR by
    name or a function returning the page's HTML (None: no page of its own). static: the files of STATIC_DIR its
    page loads, {name: media type}, served at /static/NAME.
    load(served, given) -> what its routes need (the browser of its files, the tuned lens, the transcoders...),
    from create_app's keywords `given`, each checked against the loaded model: a bad one is a CircuitlabError
    before any server starts (None: it needs nothing beyond the model). keywords: the create_app keywords it reads
    (besides run_dir and device, which every page may read). routes(app, served): its route group.
    banner(given) -> what `circuitlab serve` prints for it ("graphs: /graphs"), or None when it is not shown.
    """

    name: str
    path: str | None
    html: str | Callable[[], str] | None
    routes: Callable[[FastAPI, Served], None] | None
    static: Mapping[str, str] = field(default_factory=dict)
    load: Callable[[Served, Mapping[str, Any]], Any] | None = None
    keywords: tuple[str, ...] = ()
    banner: Callable[[Mapping[str, Any]], str | None] = lambda given: None
