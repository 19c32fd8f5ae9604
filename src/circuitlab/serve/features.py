"""The feature browser behind `circuitlab serve --dictionary DIR`: plain JSON-able dicts, no web framework
except add_feature_routes, which puts them on the app.

    browser = FeatureBrowser.load(model, tokenizer, ["runs/sae"])       # dashboards: DIR/dashboards if written
    browser.list_dictionaries()                                         # GET  /api/dictionaries
    browser.page("sae", page=0, per_page=20, order="density")           # GET  /api/features
    browser.feature("sae", 12)                                          # GET  /api/feature
    browser.prompt_features("sae", ids, top=5)                          # POST /api/features/prompt

A dictionary folder without saved dashboards gets them computed at load, on held-out built-in stories
(DEFAULT_TOKENS tokens), so the browser always has something to page through.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.serve.page import JS, Page, Served

if TYPE_CHECKING:
    from circuitlab.model import Transformer

DEFAULT_TOKENS = 8192
MAX_PER_PAGE = 100
ORDERS = ("index", "density", "max")


@dataclass
class _Entry:
    name: str
    dictionary: Any
    dashboards: Any
    source: str  # where the dashboards came from


class FeatureBrowser:
    def __init__(self, model: Transformer, tokenizer, entries: list[_Entry]) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.entries = {e.name: e for e in entries}

    @classmethod
    def load(cls, model: Transformer, tokenizer, folders: Sequence[str | Path], progress: bool = True,
             n_tokens: int = DEFAULT_TOKENS) -> "FeatureBrowser":
        """Load each dictionary folder (checked against the model) and its dashboards (folder/dashboards,
        written by `circuitlab sae dashboards`), computing them when absent."""
        from circuitlab.dictionaries import SparseDictionary
        from circuitlab.dictionaries.features import FeatureDashboards, feature_dashboards, text_batches

        entries: list[_Entry] = []
        device = model_device(model)
        for folder in folders:
            folder = Path(folder)
            d = SparseDictionary.load(folder, device=device, model=model)  # checked against the model, hooks bound
            name, n = folder.name or "dictionary", 2
            while name in {e.name for e in entries}:
                name, n = f"{folder.name}-{n}", n + 1
            saved = folder / "dashboards"
            if (saved / "dashboards.json").is_file():
                dash, source = FeatureDashboards.load(saved), str(saved)
            else:
                if progress:
                    print(f"computing dashboards of {folder} on {n_tokens:,} tokens of held-out stories "
                          f"(save them with `circuitlab sae dashboards` to skip this)")
                seq = min(64, model.cfg.n_ctx)
                dash = feature_dashboards(model, d, text_batches(tokenizer, n_tokens=n_tokens, seq_len=seq),
                                          tokenizer=tokenizer, progress=progress)
                source = f"computed at start on {dash.n_tokens:,} tokens of held-out built-in stories"
            entries.append(_Entry(name, d, dash, source))
        return cls(model, tokenizer, entries)

    def _entry(self, name: str) -> _Entry:
        if name not in self.entries:
            known = ", ".join(self.entries) or "none (start the server with --dictionary DIR)"
            raise CircuitlabError(f"unknown dictionary {name!r}; loaded: {known}")
        return self.entries[name]

    def list_dictionaries(self) -> list[dict[str, Any]]:
        return [{"name": e.name, **e.dashboards.summary(), "dashboards_from": e.source} for e in self.entries.values()]

    def page(self, name: str, page: int = 0, per_page: int = 20, order: str = "index") -> dict[str, Any]:
        """One page of feature summaries: index, density, max activation and the top context's tokens."""
        dash = self._entry(name).dashboards
        if order not in ORDERS:
            raise CircuitlabError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if not 1 <= per_page <= MAX_PER_PAGE or page < 0:
            raise CircuitlabError(f"per_page must be from 1 to {MAX_PER_PAGE} and page at least 0")
        rows = list(range(len(dash.features)))
        if order != "index":
            key = dash.density if order == "density" else dash.max_act
            rows = key.argsort(descending=True, stable=True).tolist()
        pages = max(1, -(-len(rows) // per_page))
        if page >= pages:
            raise CircuitlabError(f"page {page} is past the last page ({pages - 1})")
        out = []
        for i in rows[page * per_page:(page + 1) * per_page]:
            f = dash.features[i]
            contexts = dash.contexts(f)[:1]
            out.append({"feature": f, "density": float(dash.density[i]), "max_act": round(float(dash.max_act[i]), 5),
                        "top_context": contexts[0] if contexts else None})
        return {"dictionary": name, "page": page, "pages": pages, "per_page": per_page, "order": order,
                "total": len(rows), "features": out}

    def feature(self, name: str, feature: int) -> dict[str, Any]:
        return {"dictionary": name, **self._entry(name).dashboards.feature(feature)}

    @torch.no_grad()
    def prompt_features(self, name: str, ids: list[int], top: int = 5) -> dict[str, Any]:
        """Which features fire on a prompt: per token its top features, and the features with the largest
        activation anywhere in the prompt with their activation on every token."""
        from circuitlab.dictionaries.features import feature_activations
        from circuitlab.serve.prompt import token_str

        e = self._entry(name)
        if not 1 <= top <= 50:
            raise CircuitlabError(f"top must be from 1 to 50, got {top}")
        acts = feature_activations(self.model, e.dictionary, torch.tensor([ids]))[0].float().cpu()  # [pos, d_sae]
        k = min(top, acts.shape[-1])
        vals, idx = acts.topk(k, dim=-1)
        per_token = [[{"feature": int(f), "value": round(float(v), 5)} for f, v in zip(i, vs) if v > 0]
                     for i, vs in zip(idx.tolist(), vals.tolist())]
        peak = acts.max(dim=0).values
        order = [int(f) for f in peak.argsort(descending=True)[:max(k, 10)] if peak[f] > 0]
        return {"dictionary": name, "tokens": [token_str(self.tokenizer, t) for t in ids], "per_token": per_token,
                "features": [{"feature": f, "max": round(float(peak[f]), 5),
                              "acts": [round(float(a), 5) for a in acts[:, f]]} for f in order],
                "n_active": [int(n) for n in (acts > 0).sum(-1)]}


class PromptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dictionary: str = Field(description="a loaded dictionary's name (GET /api/dictionaries)")
    prompt: str = Field(description="the text to run")
    top: StrictInt = Field(default=5, description="features listed per token")


def add_feature_routes(app, browser: FeatureBrowser | None, lock: threading.Lock, encode) -> None:
    """GET /api/dictionaries, GET /api/features, GET /api/feature,
    POST /api/features/prompt (the page, /features: serve/pages.py). encode(prompt) -> ids checks the server's
    limits. Without dictionaries the API answers 409."""
    from fastapi import Query
    from starlette.exceptions import HTTPException

    def need() -> FeatureBrowser:
        if browser is None:
            raise HTTPException(409, "no dictionary loaded: start the server with "
                                     "`circuitlab serve --checkpoint RUN --dictionary DIR`")
        return browser

    @app.get("/api/dictionaries")
    def dictionaries() -> dict[str, Any]:
        """The loaded dictionaries with their summary numbers."""
        return {"dictionaries": browser.list_dictionaries() if browser is not None else []}

    @app.get("/api/features")
    def features(dictionary: str, page: int = Query(0), per_page: int = Query(20),
                 order: Literal["index", "density", "max"] = Query("index")) -> dict[str, Any]:
        """One page of a dictionary's features."""
        b = need()
        with lock:
            return b.page(dictionary, page, per_page, order)

    @app.get("/api/feature")
    def feature(dictionary: str, feature: int) -> dict[str, Any]:
        """One feature's dashboard: contexts, histogram, density, promoted/suppressed tokens."""
        b = need()
        with lock:
            return b.feature(dictionary, feature)

    @app.post("/api/features/prompt")
    def prompt(req: PromptRequest) -> dict[str, Any]:
        """The features that fire on a prompt, token by token."""
        b = need()
        ids = encode(req.prompt)
        with lock:
            return b.prompt_features(req.dictionary, ids, req.top)


def _load(served: Served, given: Mapping[str, Any]) -> FeatureBrowser | None:
    """The feature browser of create_app's dictionaries (folders of dictionaries for the run's model), or None."""
    if not given.get("dictionaries"):
        return None
    if served.model is None:
        raise CircuitlabError("--dictionary needs --checkpoint: the model the dictionaries were trained on")
    return FeatureBrowser.load(served.model, served.tokenizer, given["dictionaries"])


PAGE = Page("features", "/features", "features.html", static={"features.js": JS}, load=_load,
            keywords=("dictionaries",),
            routes=lambda app, s: add_feature_routes(app, s.parts["features"], s.lock, s.encode),
            banner=lambda given: "features: /features" if given.get("dictionaries") else None)
