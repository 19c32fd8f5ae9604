"""The graph browser behind `circuitlab serve --graphs DIR [--transcoders DIR]`: attribution graphs written by
`circuitlab graph` under a runs folder, opened in the interactive viewer (viz/graph_view.js), plain JSON-able
dicts; add_graph_routes puts them on the app, page_html is the page (the viewer's browser mode, CLGraphView.browse).

    browser = GraphBrowser(Path("runs"), model, tokenizer, transcoders)
    browser.list_graphs()                                   # GET  /api/graphs
    browser.graph("graph-lily")                             # GET  /api/graphs/graph?id=...  (graph.json itself)
    browser.save_qparams(id, pinned_ids, supernodes)        # POST /api/graphs/qparams  (written into graph.json)
    browser.feature_card(id, layer, feature)                # GET  /api/graphs/feature  (dashboards on demand)
    browser.intervene(id, node_ids, scale)                  # POST /api/graphs/intervene
    browser.compute(ids, prompt, GraphOptions(...))         # POST /api/graphs/compute  (a new graph, bounded)

A graph is named by its folder relative to the runs folder, and looked up in a fresh listing of that
folder: no name from a request is ever joined to a path. Interventions, feature cards and new graphs need
the model (--checkpoint) and its transcoders (--transcoders); listing and viewing do not. Every graph file
read is checked (graphs.export.check_viewer_json): a malformed one is a 422 naming its fault. Interventions
and feature cards run only on a graph whose recorded identity (metadata.identity: hashes of the model and
transcoders it was made with) is that of the loaded ones: another model or transcoders, or a graph that
records none, is a 409 saying which; the listing says the same of each graph (made_with).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fastapi.responses import Response  # at module level: the OpenAPI schema resolves route annotations here
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.checks import FINITE, Number
from circuitlab.errors import CircuitlabError
from circuitlab.graphs.export import FEATURE, check_viewer_json
from circuitlab.graphs.options import DEFAULTS, EXPLORER, GraphOptions, graph_options
from circuitlab.graphs.transcoders import differs, made_with
from circuitlab.methods.graph import graph_experiment
from circuitlab.serve.page import CSS, JS, Page, Served, nav_html
from circuitlab.serve.requests import request_model
from circuitlab.spec import only, schema
from circuitlab.viz.graph_view import asset, feature_cards, graph_browser_html, saved_dashboards

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MAX_GRAPHS = 500            # folders listed
MAX_DEPTH = 4               # runs/<a>/<b>/<c>/graph.json at most
MAX_SUPERNODES, MAX_NAME = 200, 100
COMPUTED = "explorer-graphs"  # where graphs computed from the page are written, under the runs folder
SCALE = Number(float, low=-1000, high=1000, why="a feature scaled further only saturates the logits")
MAX_GRAPH_TOKENS = Number(int, low=1, high=64, why="a graph runs one backward pass per feature; "
                                                  "`circuitlab graph` takes longer prompts")
MAX_GRAPH_MB = 256          # a graph's dense matrices (graphs.attribution.graph_floats), before they are built
MAX_NODES_CAP = Number(int, low=1, high=4000, why="each feature node costs a backward row")


def _budget() -> int:
    return int(MAX_GRAPH_MB * 2**20 / 4)   # floats


def _node_count_limit() -> int:
    return int((_budget() / 4) ** 0.5)     # graphs.plan.graph_floats: pruning's float64 rows and masks, ~4 a pair


class QParamsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="the graph (its folder under the runs folder, as /api/graphs lists it)")
    pinnedIds: list[str] = Field(default=[], description="node ids to pin")
    supernodes: list[list[str]] = Field(default=[], description="[[name, node_id, ...], ...] (Neuronpedia's layout)")


class InterveneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="the graph")
    nodes: list[str] = Field(description="feature node ids ({layer}_{feature}_{pos}) to scale")
    scale: StrictInt | StrictFloat = Field(description="multiply their activations by this (0 removes them)")
    top: StrictInt = Field(default=5, description="top logits per column")


# The graph options the page may set (graphs.options.EXPLORER), declared where every front end reads them:
# defaults, rules and descriptions from GraphOptions; the page reads them from /api/graphs ("options").
ComputeOptions = only(GraphOptions, EXPLORER, "ComputeOptions")


class ComputeRequest(request_model(ComputeOptions, "ComputeRequest", extra={  # type: ignore[misc]
        "prompt": (str, Field(description="the text whose next-token prediction the graph explains"))})):
    """POST /api/graphs/compute: a prompt and the options of ComputeOptions; options() -> them, checked."""


class NotMadeWith(CircuitlabError):
    """The graph was made with another model or transcoders than the loaded ones, or records none (409)."""


def _load_json(path: Path) -> Any:
    """A graph file's JSON; NaN / Infinity (files written before JSON was strict) read as null."""
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=lambda _: None)


def _count(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _score(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _ids(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in data["nodes"]}


class GraphBrowser:
    def __init__(self, root: Path | None, model: Transformer | None = None, tokenizer=None, transcoders=None,
                 runner=None,
                 saved: dict[int, Any] | None = None) -> None:
        self.root = Path(root).resolve() if root is not None else None
        self.model, self.tokenizer, self.tc = model, tokenizer, transcoders
        self.saved = saved or {}   # {layer: FeatureDashboards} saved with the transcoders (viz.graph_view)
        self.runner = runner   # what writes a new graph folder: methods.graph.graph_experiment (_load's default)
        self._cards: dict[tuple[str, float, int], dict[str, Any]] = {}
        self._replacement: tuple[tuple[int, ...], Any] | None = None
        self._made_with: dict[str, Any] | None = None
        self._write = threading.Lock()

    # ------------------------------------------------------------------ listing and files
    def _folders(self) -> dict[str, Path]:
        """id -> folder of every graph (a folder holding graph.json and results.json) under the runs folder."""
        if self.root is None or not self.root.is_dir():
            return {}
        found: dict[str, Path] = {}
        level = [self.root]
        for _ in range(MAX_DEPTH + 1):
            nxt = []
            for folder in sorted(level):
                if (folder / "graph.json").is_file() and (folder / "results.json").is_file():
                    found[folder.relative_to(self.root).as_posix() or "."] = folder
                    if len(found) >= MAX_GRAPHS:
                        return found
                try:
                    nxt += [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()
                            and not p.name.startswith(".")]
                except OSError:
                    continue
            level = nxt
        return found

    def _folder(self, graph_id: str) -> Path:
        folders = self._folders()
        if graph_id not in folders:
            raise LookupError(f"unknown graph {graph_id[:200]!r}; /api/graphs lists the "
                              f"{len(folders)} graph(s) under the runs folder")
        return folders[graph_id]

    def _read(self, graph_id: str) -> tuple[Path, dict[str, Any]]:
        folder = self._folder(graph_id)
        try:
            data = _load_json(folder / "graph.json")
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise CircuitlabError(f"{graph_id}/graph.json cannot be read ({type(e).__name__}); "
                                  "write it again with `circuitlab graph`") from None
        return folder, check_viewer_json(data, f"{graph_id[:200]}/graph.json")

    def identity(self) -> dict[str, Any]:
        """made_with(...) of the loaded model and transcoders (computed once)."""
        if self._made_with is None:
            self._made_with = made_with(self._model(), self.tc)
        return self._made_with

    def _check_made_with(self, graph_id: str, data: dict[str, Any]) -> None:
        """Refuse a graph made with other weights than the loaded ones (or that cannot tell): its node ids,
        tokens and features would be read against a model they do not belong to."""
        d = differs(data["metadata"].get("identity"), self.identity())
        if d == "unrecorded":
            raise NotMadeWith(f"graph {graph_id[:200]!r} records no identity of the model and transcoders it was "
                              "made with (written before circuitlab recorded one, or by another tool), so it cannot "
                              "be checked against the loaded ones: make it again with `circuitlab graph` to "
                              "intervene on it (viewing it needs nothing)")
        if d is not None:
            raise NotMadeWith(f"graph {graph_id[:200]!r} was made with {d}; serve the model and transcoders it was "
                              "made with (--checkpoint, --transcoders) to intervene on it")

    def list_graphs(self) -> dict[str, Any]:
        out = []
        for graph_id, folder in self._folders().items():
            try:
                results = _load_json(folder / "results.json")
                g = results.get("graph", {})
                pruned = g.get("pruned", {})
                made = None
                if self.can_run():
                    made = differs(results.get("identity"), self.identity()) or "the loaded model and transcoders"
                prompt = results.get("prompt")
                out.append({"id": graph_id, "prompt": prompt[:1000] if isinstance(prompt, str) else None,
                            "nodes": _count(pruned.get("nodes")), "edges": _count(pruned.get("edges")),
                            "replacement_score": _score(g.get("replacement_score")),
                            "completeness_score": _score(g.get("completeness_score")), "made_with": made,
                            "modified": (folder / "graph.json").stat().st_mtime})
            except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError):
                out.append({"id": graph_id, "prompt": None, "error": "results.json cannot be read"})
        out.sort(key=lambda g: -float(g.get("modified") or 0))
        return {"root": self.root.name if self.root else None, "graphs": out, "can_compute": self.can_run(),
                "limits": {"max_tokens": MAX_GRAPH_TOKENS.high, "max_graph_mb": MAX_GRAPH_MB,
                           "max_nodes": _node_count_limit()},
                "options": schema(ComputeOptions)["properties"]}   # the page's inputs: defaults, bounds, help

    def graph(self, graph_id: str) -> dict[str, Any]:
        return self._read(graph_id)[1]

    def save_qparams(self, graph_id: str, pinned: list[str], supernodes: list[list[str]]) -> dict[str, Any]:
        """Write pinnedIds and supernodes into the graph file's qParams (every id must be a node of it)."""
        with self._write:
            folder, data = self._read(graph_id)
            ids = _ids(data)
            unknown = [i for i in pinned if i not in ids]
            if len(supernodes) > MAX_SUPERNODES:
                raise CircuitlabError(f"{len(supernodes)} supernodes; at most {MAX_SUPERNODES}")
            for s in supernodes:
                if len(s) < 2 or not s[0].strip() or len(s[0]) > MAX_NAME:
                    raise CircuitlabError(f"a supernode is [name, node_id, ...] with a name of 1 to {MAX_NAME} "
                                          f"characters and at least one node, got {json_text(s)[:120]}")
                unknown += [i for i in s[1:] if i not in ids]
            if unknown:
                raise CircuitlabError(f"unknown node id(s) {', '.join(repr(u[:60]) for u in unknown[:5])} in "
                                      f"graph {graph_id!r}")
            q = data.setdefault("qParams", {})
            q["pinnedIds"] = list(dict.fromkeys(pinned))
            q["supernodes"] = [[s[0].strip(), *dict.fromkeys(s[1:])] for s in supernodes]
            atomic_write_text(folder / "graph.json", json_text(data))
            return {"id": graph_id, "pinnedIds": q["pinnedIds"], "supernodes": q["supernodes"]}

    # ------------------------------------------------------------------ model work
    def can_run(self) -> bool:
        return self.model is not None and self.tc is not None

    def _model(self) -> Transformer:
        """The model, where the caller has checked it is loaded (_need, can_run)."""
        assert self.model is not None
        return self.model

    def _need(self) -> None:
        if not self.can_run():
            raise PermissionError("this needs the model and its transcoders: start the server with "
                                  "`circuitlab serve --checkpoint RUN --transcoders DIR --graphs DIR`")

    def _tokens(self, data: dict[str, Any]) -> list[int]:
        """The prompt's token ids, read from the token nodes (E_{token}_{pos}), checked against the model."""
        by_pos = {int(n["ctx_idx"]): int(n["node_id"].split("_")[1]) for n in data["nodes"]
                  if n.get("feature_type") == "embedding"}
        tokens = [by_pos.get(p, -1) for p in range(len(by_pos))]
        cfg = self._model().cfg
        if not tokens or min(tokens) < 0 or max(tokens) >= cfg.d_vocab or len(tokens) > cfg.n_ctx:
            raise CircuitlabError("this graph's tokens do not fit the loaded model (another vocabulary or context): "
                                  "serve the checkpoint the graph was made with")
        return tokens

    def _feature_nodes(self, data: dict[str, Any], node_ids: list[str]) -> list[tuple[int, int, int]]:
        ids = _ids(data)
        out = []
        for i in node_ids:
            n = ids.get(i)
            if n is None:
                raise CircuitlabError(f"unknown node id {i[:60]!r}: not a node of this graph")
            if n.get("feature_type") != FEATURE:
                raise CircuitlabError(f"node {i!r} is a {n.get('feature_type')} node; only feature nodes can be scaled")
            layer, feature, pos = (int(x) for x in i.split("_"))
            if not self.tc.has(layer) or not 0 <= feature < self.tc.d_sae(layer):
                raise CircuitlabError(f"feature node {i!r} does not fit the loaded transcoders; serve the "
                                      "transcoders the graph was made with")
            out.append((layer, feature, pos))
        return out

    def feature_card(self, graph_id: str, layer: int, feature: int) -> dict[str, Any]:
        """A feature's dashboard (top contexts, promoted tokens): from the dashboards saved with the transcoders
        (`circuitlab sae dashboards`) when they hold it, else computed for every feature node of its layer in this
        graph on first use (GraphOptions' dashboard_tokens held-out story tokens); then cached."""
        self._need()
        folder, data = self._read(graph_id)
        self._check_made_with(graph_id, data)
        feats = sorted({int(n["node_id"].split("_")[1]) for n in data["nodes"]
                        if n.get("feature_type") == FEATURE and n["node_id"].split("_")[0] == str(layer)})
        if feature not in feats:
            raise CircuitlabError(f"feature {feature} of layer {layer} is not a node of graph {graph_id!r}")
        key = (graph_id, (folder / "graph.json").stat().st_mtime, layer)
        if key not in self._cards:
            self._cards[key] = feature_cards(self._model(), self.tc, {layer: feats}, self.tokenizer, n_tokens=DEFAULTS.dashboard_tokens,
                                             saved=self.saved)
            if f"{layer}_{feature}" not in self._cards[key]:
                raise CircuitlabError("this tokenizer cannot read the built-in stories the feature cards are made of")
        return self._cards[key][f"{layer}_{feature}"]

    def _replacement_model(self, tokens: list[int]):
        from circuitlab.graphs import ReplacementModel

        if self._replacement is None or self._replacement[0] != tuple(tokens):
            self._replacement = (tuple(tokens), ReplacementModel(self._model(), self.tc, torch.tensor(tokens)))
        return self._replacement[1]

    def intervene(self, graph_id: str, node_ids: list[str], scale: float, top: int = 5) -> dict[str, Any]:
        """Scale the features at their positions; the top next tokens in the graph (its logit nodes), the
        replacement model, the real model with attention and norms frozen, and the real model left free."""
        from circuitlab.graphs import Intervention

        self._need()
        scale = SCALE.check(scale, "scale")
        top = Number(int, low=1, high=20).check(top, "top")
        if not node_ids:
            raise CircuitlabError("choose at least one feature node to intervene on")
        _, data = self._read(graph_id)
        self._check_made_with(graph_id, data)
        feats = self._feature_nodes(data, node_ids)
        rm = self._replacement_model(self._tokens(data))
        ivs = [Intervention(layer=layer, feature=f, scale=scale, pos=pos) for layer, f, pos in feats]
        from circuitlab.serve.prompt import token_str

        def best(logits: torch.Tensor) -> list[dict[str, Any]]:
            probs = logits[0, -1].double().softmax(-1)
            p, i = probs.topk(min(top, len(probs)))
            return [{"token": token_str(self.tokenizer, int(t)), "id": int(t), "prob": float(q)}
                    for q, t in zip(p, i)]

        graph_col = sorted(({"token": (n.get("clerp") or "").removeprefix('Output "').rsplit('" (p=', 1)[0],
                             "id": int(n["feature"]), "prob": float(n.get("token_prob") or 0)}
                            for n in data["nodes"] if n.get("feature_type") == "logit"), key=lambda x: -float(x["prob"]))
        columns = {"graph (no intervention)": graph_col[:top],
                   "replacement model": best(rm.run(ivs).logits),
                   "model, attention frozen": best(rm.run(ivs, mode="model").logits),
                   "model, attention free": best(rm.run(ivs, mode="model", freeze_attention=False).logits)}
        return {"id": graph_id, "nodes": node_ids, "scale": scale, "columns": columns}

    def compute(self, ids: list[int], prompt: str, options: GraphOptions) -> dict[str, Any]:
        """A new graph of the prompt (written under the runs folder) with these options (of them, the page sets
        EXPLORER; no feature cards: dashboard_tokens 0), refused up front when too large."""
        from circuitlab.graphs import ReplacementModel
        from circuitlab.graphs.attribution import check_graph_size

        self._need()
        if self.runner is None:
            raise PermissionError("this graph browser was made without a graph runner (create_app gives one)")
        if self.root is None:
            raise PermissionError("start the server with --graphs DIR to write new graphs there")
        opts = graph_options(options, dashboard_tokens=0)
        MAX_GRAPH_TOKENS.check(len(ids), "the prompt's length in tokens")
        max_feature_nodes = opts.max_feature_nodes
        if max_feature_nodes is not None:
            MAX_NODES_CAP.check(max_feature_nodes, "max_feature_nodes")
        layers = ReplacementModel(self._model(), self.tc, torch.tensor(ids)).active_features[:, 0]
        cap = len(layers) if max_feature_nodes is None else min(len(layers), max_feature_nodes)
        check_graph_size(layers, self.tc, cap, len(ids), opts.max_n_logits, self._model().cfg.d_model, budget=_budget(),
                         name="max_feature_nodes", where=", the explorer's")
        out = self.root / COMPUTED / time.strftime("graph-%Y%m%d-%H%M%S")
        n = 2
        while out.exists():
            out, n = out.with_name(f"{out.name.split('~')[0]}~{n}"), n + 1
        self.runner(self.model, self.tc, prompt, self.tokenizer, out=out, options=opts, progress=False)
        return {"id": out.relative_to(self.root).as_posix()}


def add_graph_routes(app, browser: GraphBrowser, lock: threading.Lock, encode) -> None:
    """The /api/graphs endpoints and the viewer's script and style (/static/graph_view.js, .css).
    Unknown graphs answer 404, missing model 409."""
    from starlette.exceptions import HTTPException

    def call(fn, *args):
        try:
            return fn(*args)
        except LookupError as e:
            raise HTTPException(404, str(e)) from None
        except (PermissionError, NotMadeWith) as e:
            raise HTTPException(409, str(e)) from None

    @app.get("/static/graph_view.js", include_in_schema=False)
    def graph_view_js() -> Response:
        return Response(asset("graph_view.js"), media_type=JS, headers={"cache-control": "no-cache"})

    @app.get("/static/graph_view.css", include_in_schema=False)
    def graph_view_css() -> Response:
        return Response(asset("graph_view.css"), media_type=CSS, headers={"cache-control": "no-cache"})

    @app.get("/api/graphs")
    def list_graphs() -> dict[str, Any]:
        """The graphs under the runs folder (newest first) and whether this server can compute new ones."""
        return browser.list_graphs()

    @app.get("/api/graphs/graph")
    def graph(id: str) -> dict[str, Any]:
        """The graph file itself (the Neuronpedia viewer JSON) of one listed graph."""
        return call(browser.graph, id)

    @app.post("/api/graphs/qparams")
    def qparams(req: QParamsRequest) -> dict[str, Any]:
        """Save pinned nodes and supernodes into the graph file's qParams."""
        return call(browser.save_qparams, req.id, req.pinnedIds, req.supernodes)

    @app.get("/api/graphs/feature")
    def feature(id: str, layer: int, feature: int) -> dict[str, Any]:
        """A feature node's dashboard, computed on first use."""
        with lock:
            return call(browser.feature_card, id, layer, feature)

    @app.post("/api/graphs/intervene")
    def intervene(req: InterveneRequest) -> dict[str, Any]:
        """Scale feature nodes; top logits in the replacement model and the real model (frozen and free)."""
        FINITE.check(req.scale, "scale")
        with lock:
            return call(browser.intervene, req.id, req.nodes, req.scale, req.top)

    @app.post("/api/graphs/compute")
    def compute(req: ComputeRequest) -> dict[str, Any]:
        """Compute a new graph of a prompt (bounded: refused above a size, saying why)."""
        call(browser._need)
        ids = encode(req.prompt)
        with lock:
            return call(browser.compute, ids, req.prompt, GraphOptions(**req.options().to_dict()))


def _load(served: Served, given: Mapping[str, Any]) -> GraphBrowser:
    """The graph browser of create_app's graphs (the runs folder `circuitlab graph` writes under), transcoders (the
    model's: interventions, feature cards, new graphs; transcoder_set: which set of a run holding several, as
    Transcoders.load's set_name) and graph_runner (what writes a new graph folder; default graph_experiment)."""
    graphs, transcoders = given.get("graphs"), given.get("transcoders")
    tc = None
    if transcoders is not None:
        if served.model is None:
            raise CircuitlabError("--transcoders needs --checkpoint: the model the transcoders were trained on")
        from circuitlab.graphs import Transcoders

        tc = Transcoders.load(served.model, transcoders, set_name=given.get("transcoder_set"))
    if graphs is not None and not Path(graphs).is_dir():
        raise CircuitlabError(f"--graphs {graphs} is not a folder (give the runs folder holding `circuitlab graph` "
                              "outputs)")
    return GraphBrowser(Path(graphs) if graphs is not None else None, served.model, served.tokenizer, tc,
                        runner=given.get("graph_runner") or graph_experiment, saved=saved_dashboards(transcoders))


def page_html() -> str:
    """/graphs: the viewer's browser (viz/graph_view.py: pick, open and compute graphs over these routes, its form
    the ComputeOptions' fields) in the explorer's header, its script and style from /static/ (routes above)."""
    return graph_browser_html("/api/graphs", ComputeOptions, assets="/static/", stylesheets=("/static/style.css",),
                              nav=nav_html("/graphs"))


PAGE = Page("graphs", "/graphs", page_html, load=_load,
            keywords=("graphs", "transcoders", "transcoder_set", "graph_runner"),
            routes=lambda app, s: add_graph_routes(app, s.parts["graphs"], s.lock, s.encode),
            banner=lambda given: "graphs: /graphs")
