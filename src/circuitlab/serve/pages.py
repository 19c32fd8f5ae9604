"""The explorer's pages, one module each (serve/page.py says what a module declares); create_app and `circuitlab
serve` iterate over PAGES, so a new page is its module and one entry here.

    from circuitlab.serve.pages import PAGES
    PAGES["inputs"].path, PAGES["inputs"].html      # "/inputs", "inputs.html" (a static page of serve/static)
    PAGES["graphs"].html()                          # /graphs's page, rendered by its module (graphs.py)
    banner({"run_dir": "runs/demo/2l"})             # "adder: /adder; inputs and lenses: /inputs; ..."
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import circuitlab.serve.circuits as circuits
import circuitlab.serve.features as features
import circuitlab.serve.graphs as graphs
import circuitlab.serve.inputs as inputs
import circuitlab.serve.prompt as prompt
from circuitlab.serve.page import Page

# In the order they are loaded (and checked) and named by `circuitlab serve`.
PAGES: dict[str, Page] = {p.name: p for p in (prompt.PAGE, prompt.ADDER_PAGE, inputs.PAGE, features.PAGE,
                                              circuits.PAGE, graphs.PAGE)}
SHARED_KEYWORDS = ("run_dir", "device")   # the create_app keywords every page may read


def page_keywords() -> set[str]:
    """The create_app keywords the pages read (the shared ones and each page's own)."""
    return {*SHARED_KEYWORDS, *(k for p in PAGES.values() for k in p.keywords)}


def banner(given: Mapping[str, Any]) -> str:
    """The pages `circuitlab serve` names for create_app's keywords `given` ("adder: /adder; ...; graphs: /graphs")."""
    return "; ".join(b for p in PAGES.values() if (b := p.banner(given)) is not None)
