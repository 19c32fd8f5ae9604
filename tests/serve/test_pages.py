"""The explorer's page registry (serve/pages.py): create_app and `circuitlab serve` iterate over it, so a page
registered from here alone is served, loaded and named; every page's files exist and nothing else is served."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from circuitlab.errors import CircuitlabError
from circuitlab.serve import create_app
from circuitlab.serve.app import STATIC_FILES
from circuitlab.serve.page import JS, STATIC_DIR, Page, nav_html
from circuitlab.serve.pages import PAGES, banner


def test_the_pages_and_their_order():
    """Loaded (and checked) in this order: the tuned lens before the dictionaries, as `circuitlab serve` names them."""
    assert list(PAGES) == ["explorer", "adder", "inputs", "features", "circuits", "graphs"]
    assert {p.path for p in PAGES.values()} == {"/", "/adder", "/inputs", "/features", "/circuits", "/graphs"}


def test_the_banner_names_the_pages_the_server_was_given():
    """`circuitlab serve`'s line: /inputs with a checkpoint, /features with dictionaries, the rest always."""
    assert banner({"run_dir": None, "dictionaries": []}) == "adder: /adder; circuits: /circuits; graphs: /graphs"
    assert banner({"run_dir": "runs/demo/2l", "dictionaries": ["d"]}) == (
        "adder: /adder; inputs and lenses: /inputs; features: /features; circuits: /circuits; graphs: /graphs")


def test_every_static_file_is_a_pages_or_shared_and_exists():
    declared = {**STATIC_FILES, **{n: m for p in PAGES.values() for n, m in p.static.items()}}
    pages = {p.html for p in PAGES.values() if isinstance(p.html, str)}   # the rest render theirs
    on_disk = {f.name for f in STATIC_DIR.iterdir() if f.is_file()}
    assert set(declared) | pages == on_disk, "a static file no page serves, or a declared file that is missing"


def test_every_static_page_has_the_explorers_nav():
    """nav_html (what a rendered page, /graphs, puts in its header) is the links every static page writes."""
    for page in PAGES.values():
        if isinstance(page.html, str):
            text = (STATIC_DIR / page.html).read_text(encoding="utf-8")
            assert nav_html(page.path) in text, page.html


def test_a_page_registered_alone_is_loaded_routed_and_served(monkeypatch):
    """A toy page: its keyword reaches its load, its load's value its routes, its static file the static route;
    a keyword no page reads is refused like Python refuses one; a load's CircuitlabError stops create_app."""
    def load(served, given):
        if given.get("toy") == "bad":
            raise CircuitlabError("--toy bad is not a toy")
        return {"toy": given.get("toy"), "model": served.model is not None}

    def routes(app, served):
        @app.get("/api/toy")
        def toy() -> dict:
            return served.parts["toy"]

    page = Page("toy", "/toy", "index.html", routes=routes, static={"explorer.js": JS}, load=load, keywords=("toy",),
                banner=lambda given: f"toy: /toy ({given.get('toy')})")
    monkeypatch.setitem(PAGES, "toy", page)
    client = TestClient(create_app(None, toy="ball"))
    assert client.get("/api/toy").json() == {"toy": "ball", "model": False}
    assert client.get("/toy").text == (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    assert banner({"toy": "ball"}).endswith("; toy: /toy (ball)")
    with pytest.raises(CircuitlabError, match="not a toy"):
        create_app(None, toy="bad")
    with pytest.raises(TypeError, match="unexpected keyword argument 'tyo'"):
        create_app(None, tyo="ball")
    monkeypatch.delitem(PAGES, "toy")
    with pytest.raises(TypeError, match="'toy'"):
        create_app(None, toy="ball")
