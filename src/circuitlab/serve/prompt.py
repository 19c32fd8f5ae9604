"""The explorer's prompt page, the model summary and the adder walk-through, as plain JSON-able dicts: no web
framework except add_prompt_routes, which puts them on the app.

    summary = model_summary(model, tokenizer, meta)            # GET /api/model
    found = analyse_prompt(model, tokenizer, ids, target=None)  # POST /api/analyse
    walk = adder_walkthrough(17, 25)                           # GET/POST /api/adder

Errors are CircuitlabError with a one-line message; the app answers them with a 422.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from circuitlab.analysis._json import round_tensor
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.names import head_name
from circuitlab.serve.page import JS, Page

if TYPE_CHECKING:
    from circuitlab.model import Transformer

PATTERN_DIGITS = 4   # attention weights are rounded to this many decimals
VALUE_DIGITS = 5     # probabilities, logits, residual coordinates
LENS_K = 5           # top-k tokens per layer and position in the logit lens
PREDICTIONS = 10     # the model's top predictions listed at the DLA position
ADDER_MAX_DIGITS = 8  # the carry adder's residual has 14 + 2·digits coordinates; keep the table readable
ADDER_DIGITS = 2      # the adder page's digits of a and of b (its design defaults to the post's 2+2 adder)
MAX_PATTERN_CELLS = 2_000_000  # attention weights in one answer (heads × tokens²): caps the tokens of big models


def token_limit(model: Transformer, max_tokens: int) -> int:
    """The most prompt tokens served: max_tokens, the model's context, and the pattern-size cap."""
    heads = max(1, model.cfg.n_layers * model.cfg.n_heads)
    return max(1, min(max_tokens, model.cfg.n_ctx, int((MAX_PATTERN_CELLS / heads) ** 0.5)))


def _round(t: torch.Tensor, digits: int = VALUE_DIGITS) -> Any:
    return round_tensor(t, digits, torch.float64)


def token_str(tokenizer, token_id: int) -> str:
    """One token as text; an id the tokenizer cannot decode (a padded vocabulary) shows as <id>."""
    if tokenizer is None:
        return f"<{token_id}>"
    try:
        return tokenizer.decode([int(token_id)])
    except Exception:  # noqa: BLE001 - a display string must never fail the request
        return f"<{token_id}>"


# ---------------------------------------------------------------------------- model summary


def head_labels(model: Transformer) -> tuple[dict[str, list[str]], str | None]:
    """{"L0H0": [labels...]} for every head (from classify_heads), and a note when none could be computed."""
    from circuitlab.analysis.heads import classify_heads

    cfg = model.cfg
    names = [head_name(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    if cfg.n_layers == 0:
        return {}, "a 0-layer model has no attention heads"
    try:
        classes = classify_heads(model)
    except CircuitlabError as e:
        return {n: [] for n in names}, f"head labels unavailable: {e}"
    return {n: classes.labels_of(*divmod(i, cfg.n_heads)) for i, n in enumerate(names)}, None


def model_summary(model: Transformer, tokenizer, meta: dict, labels: dict[str, list[str]], note: str | None) -> dict[str, Any]:
    cfg = model.cfg
    return {
        "loaded": True,
        "name": cfg.name or (meta.get("run") or {}).get("name") or "",
        "config": {**{k: getattr(cfg, k) for k in ("n_layers", "n_heads", "d_model", "d_vocab", "n_ctx",
                                                   "attn_only", "norm", "positional")}, "d_head": cfg.head_dim},
        "tokenizer": getattr(tokenizer, "name", type(tokenizer).__name__),
        "heads": [{"name": head_name(l, h), "layer": l, "head": h, "labels": labels.get(head_name(l, h), [])}
                  for l in range(cfg.n_layers) for h in range(cfg.n_heads)],
        "labels_note": note,
    }


# ---------------------------------------------------------------------------- prompt analysis


def encode_prompt(tokenizer, prompt: str, max_tokens: int) -> list[int]:
    """Token ids of the prompt, checked against the token limit (a CircuitlabError otherwise)."""
    if not prompt.strip():
        raise CircuitlabError("the prompt is empty; type some text")
    ids = tokenizer.encode(prompt)  # a CircuitlabError for text the tokenizer cannot encode
    if not ids:
        raise CircuitlabError("the prompt encodes to no tokens; type some other text")
    if len(ids) > max_tokens:
        raise CircuitlabError(f"the prompt is {len(ids)} tokens; the limit is {max_tokens}")
    return list(ids)


def resolve_target(tokenizer, d_vocab: int, target: str | int | None, what: str = "target") -> int | None:
    """A target token id from an id (int) or a text that is exactly one token; None stays None.
    what: how the messages name it ("target", "foil")."""
    if target is None:
        return None
    if isinstance(target, int):
        if not 0 <= target < d_vocab:
            raise CircuitlabError(f"{what} token id {target} is outside the vocabulary [0, {d_vocab})")
        return target
    if target == "":
        raise CircuitlabError(f"the {what} token is empty; leave it out to use the model's top prediction"
                              if what == "target" else f"the {what} token is empty; leave it out")
    try:
        ids = tokenizer.encode(target)
    except CircuitlabError as e:
        raise CircuitlabError(f"unknown {what} token {target!r}: {e}") from None
    if len(ids) != 1:
        pieces = ", ".join(repr(token_str(tokenizer, i)) for i in ids[:6])
        raise CircuitlabError(f"unknown {what} token {target!r}: it is {len(ids)} tokens ({pieces}), not one; "
                              "pick a single token (e.g. from the predictions list)")
    if not 0 <= ids[0] < d_vocab:
        raise CircuitlabError(f"{what} {target!r} is token {ids[0]}, outside the model's vocabulary [0, {d_vocab})")
    return ids[0]


@torch.no_grad()
def analyse_prompt(model: Transformer, tokenizer, ids: list[int], target: str | int | None = None, position: int | None = None,
                   figures: bool = False, head_labels: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Tokens, every head's attention pattern, the logit lens and direct logit attribution.

    target: the token whose logit DLA explains (an id or a one-token text); default the model's top
    prediction at `position` (default the last). figures: also return the three as plotly figure
    JSON (circuitlab.viz.interactive), under "figures".
    """
    from circuitlab.analysis.logit_attribution import direct_logit_attribution
    from circuitlab.analysis.lens import logit_lens

    cfg = model.cfg
    T = len(ids)
    pos = T - 1 if position is None else position
    if not -T <= pos < T:
        raise CircuitlabError(f"position {position} is outside the prompt's {T} tokens")
    pos %= T
    target_id = resolve_target(tokenizer, cfg.d_vocab, target)
    device = model_device(model)
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    logits, cache = model.run_with_cache(tokens[None])
    probs = logits[0, pos].float().softmax(dim=-1)
    top_p, top_i = probs.topk(min(PREDICTIONS, probs.shape[-1]))
    predictions = [{"id": int(i), "token": token_str(tokenizer, int(i)), "prob": round(float(p), VALUE_DIGITS)}
                   for p, i in zip(top_p, top_i)]
    if target_id is None:
        target_id = int(top_i[0])

    patterns = [_round(cache["pattern", l][0], PATTERN_DIGITS) for l in range(cfg.n_layers)]
    lens = logit_lens(model, tokens, k=LENS_K, tokenizer=tokenizer, cache=cache)
    dla = direct_logit_attribution(model, cache, answer=target_id, pos=pos)
    attributions = dla.attributions[:, 0]
    found = {
        "tokens": [{"id": int(t), "text": token_str(tokenizer, int(t))} for t in ids],
        "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "attention": {"heads": [head_name(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)],
                      "patterns": patterns},  # [layer][head][query][key]
        "logit_lens": {"labels": lens.labels, "k": LENS_K,
                       "top_tokens": lens.top_tokens.tolist(),            # [point][pos][k]
                       "top_strs": lens.top_strs,                         # [point][pos][k]
                       "top_probs": _round(lens.top_probs),               # [point][pos][k]
                       "entropy": _round(lens.entropy),                   # [point][pos]
                       "final_top_probs": _round(lens.final_top_probs)},  # [point][pos]
        "dla": {"position": pos, "target": {"id": target_id, "token": token_str(tokenizer, target_id)},
                "target_prob": round(float(probs[target_id]), VALUE_DIGITS),
                "components": [{"component": c, "attribution": round(float(v), VALUE_DIGITS)}
                               for c, v in zip(dla.labels, attributions)],
                "constant": round(float(dla.constant[0]), VALUE_DIGITS),
                "logit": round(float(dla.logit[0]), VALUE_DIGITS),
                "predictions": predictions},
    }
    if figures:
        found["figures"] = _figures(found, cache, lens, dla, head_labels or {})
    return found


def _figures(found: dict[str, Any], cache, lens, dla, head_labels: dict[str, list[str]]) -> dict[str, Any]:
    """The explorer's three views as plotly figure JSON, from the shared interactive figure builders."""
    import json

    from circuitlab.viz.heads import attention_figure
    from circuitlab.viz.lens import logit_attribution_figure, logit_lens_figure

    figs = {"logit_lens": logit_lens_figure(lens),
            "attribution": logit_attribution_figure(
                dla, title=f"Direct logit attribution to {found['dla']['target']['token']!r}")}
    if found["n_layers"]:
        patterns = torch.stack([cache["pattern", l][0] for l in range(found["n_layers"])])
        figs["attention"] = attention_figure([t["text"] for t in found["tokens"]], patterns,
                                             labels={k: ", ".join(v) for k, v in head_labels.items() if v})
    return {name: json.loads(fig.to_plotly().to_json()) for name, fig in figs.items()}


# ---------------------------------------------------------------------------- the hand-built adder


@functools.lru_cache(maxsize=16)
def _adder(design: str, digits: int):
    from circuitlab.forge.adder import build_adder

    return build_adder(design, digits, digits)


def _coordinate_names(layout, d_model: int) -> list[str]:
    if layout is None:
        return [f"d{i}" for i in range(d_model)]
    names = []
    for name in layout.names:
        size = layout.size(name)
        names += [name] if size == 1 else [f"{name}[{i}]" for i in range(size)]
    return names


@torch.no_grad()
def adder_walkthrough(a: Any, b: Any, design: str = "post", digits: int = ADDER_DIGITS) -> dict[str, Any]:
    """a + b through a hand-built adder: each token's residual after the embedding and after each
    layer (and each layer's attention, when it has MLPs), where EOS attends, and the answer.

    design "post": the reference post's 2-digit adder (answer read off EOS's residual);
    "carry": the exact adder of two `digits`-digit numbers (answer digits as tokens, fed back).
    """
    from circuitlab.forge.adder import EOS, digits_to_str

    if design not in ("post", "carry"):
        raise CircuitlabError(f"unknown adder design {design!r}; choose post or carry")
    if design == "post" and digits != 2:
        raise CircuitlabError("the post's design adds two 2-digit numbers; use design carry for other widths")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= ADDER_MAX_DIGITS:
        raise CircuitlabError(f"digits must be a whole number from 1 to {ADDER_MAX_DIGITS}, got {digits!r}")
    adder = _adder(design, digits)
    prompt = adder.prompt(a, b)  # checks a and b: whole numbers, not negative, fit in `digits`
    a, b = int(a), int(b)
    model, cfg = adder.model, adder.model.cfg
    if design == "post":
        tokens = prompt[None]
        result = int(digits_to_str(adder.answer_digits(tokens)[0]))
        answer_tokens: list[int] = []
    else:
        full = model.generate(prompt[None], adder.n_answer, temperature=0)
        answer_tokens = full[0, adder.prompt_len:].tolist()
        tokens = full[:, :-1]  # the last answer digit is predicted, never fed back
        result = int(digits_to_str(full[0, adder.prompt_len:]))
    _, cache = model.run_with_cache(tokens)
    names = ["EOS" if t == EOS else str(t) for t in tokens[0].tolist()]
    embed = cache["hook_embed"] + (cache["hook_pos_embed"] if "hook_pos_embed" in cache else 0)
    stages = [{"label": "embedding", "layer": None, "residual": _round(embed[0])}]
    for l in range(cfg.n_layers):
        if f"blocks.{l}.hook_resid_mid" in cache:
            stages.append({"label": f"layer {l} attention", "layer": l,
                           "residual": _round(cache[f"blocks.{l}.hook_resid_mid"][0])})
        stages.append({"label": f"after layer {l}", "layer": l, "residual": _round(cache["resid_post", l][0])})
    eos = adder.prompt_len - 1
    attention = [{"layer": l, "head": h, "name": head_name(l, h),
                  "eos": _round(cache["pattern", l][0, h, eos], PATTERN_DIGITS),
                  "pattern": _round(cache["pattern", l][0, h], PATTERN_DIGITS)}
                 for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    found: dict[str, Any] = {
        "design": design, "digits": digits, "a": a, "b": b, "result": result, "expected": a + b,
        "correct": result == a + b, "tokens": names, "prompt_len": adder.prompt_len, "eos_position": eos,
        "answer_tokens": answer_tokens, "coordinates": _coordinate_names(adder.layout, cfg.d_model),
        "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "stages": stages, "attention": attention,
    }
    if design == "post":
        x = cache["resid_post", cfg.n_layers - 1][0, eos]
        acc, digit = float(x[adder.layout["acc"]][0]), float(x[adder.layout["digit"]][0])
        found["readout"] = (f"EOS residual: acc {acc:g}, digit {digit:g} -> 10·{digit:g} + {acc:g} = "
                            f"{round(10 * digit + acc)} (read off the residual, as in the post)")
    else:
        found["readout"] = (f"answer tokens after EOS, most significant first: "
                            f"{' '.join(str(t) for t in answer_tokens)} -> {result}")
    return found


# ---------------------------------------------------------------------------- the routes


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
    digits: int = Field(default=ADDER_DIGITS, ge=1, le=ADDER_MAX_DIGITS, description="digits of a and of b")


def add_prompt_routes(app, model: Transformer | None, tokenizer, meta: dict[str, Any], checkpoint_name: str | None,
                      limits: dict[str, int], lock: threading.Lock, encode: Callable[[str], list[int]]) -> None:
    """GET /api/model, POST /api/analyse, GET and POST /api/adder. encode(prompt) -> ids checks the server's
    limits; without a model /api/model says so and /api/analyse answers 409 (the adder needs none)."""
    from starlette.exceptions import HTTPException

    labels_cache: dict[str, Any] = {}

    def labels() -> tuple[dict[str, list[str]], str | None]:
        with lock:
            if "labels" not in labels_cache:
                assert model is not None   # the routes that label heads answer 409 first without a model
                labels_cache["labels"] = head_labels(model)
            return labels_cache["labels"]

    @app.get("/api/model")
    def model_info() -> dict[str, Any]:
        """The loaded model's config, head labels and the server's limits."""
        if model is None:
            return {"loaded": False, "limits": limits,
                    "message": "no model loaded: start the server with `circuitlab serve --checkpoint RUN` "
                               "to use the explorer (the adder page works without one)"}
        labelled, note = labels()
        return {**model_summary(model, tokenizer, meta, labelled, note), "checkpoint": checkpoint_name,
                "limits": limits}

    @app.post("/api/analyse")
    def analyse_route(req: AnalyseRequest) -> dict[str, Any]:
        """Tokens, attention patterns [layer][head][query][key], logit lens and DLA for a prompt."""
        if model is None:
            raise HTTPException(409, "no model loaded: start the server with "
                                     "`circuitlab serve --checkpoint RUN` to analyse prompts")
        ids = encode(req.prompt)
        labelled, _ = labels()
        with lock:
            found = analyse_prompt(model, tokenizer, ids, req.target, req.position, figures=req.figures,
                                   head_labels=labelled)
        found["head_labels"] = labelled
        return found

    @app.get("/api/adder")
    def adder_get(params: Annotated[AdderRequest, Query()]) -> dict[str, Any]:
        """a + b through the hand-built adder, stage by stage."""
        return adder_post(params)

    @app.post("/api/adder")
    def adder_post(req: AdderRequest) -> dict[str, Any]:
        """The same as GET, with the fields as a JSON body."""
        with lock:
            return adder_walkthrough(req.a, req.b, req.design, req.digits)


# The explorer (/: the prompt API's page) and the hand-built adder (/adder: its GET and POST /api/adder are
# among the prompt routes, which need no model for it).
PAGE = Page("explorer", "/", "index.html", static={"explorer.js": JS},
            routes=lambda app, s: add_prompt_routes(app, s.model, s.tokenizer, s.meta, s.checkpoint_name, s.limits,
                                                    s.lock, s.encode))
ADDER_PAGE = Page("adder", "/adder", "adder.html", static={"adder.js": JS}, routes=None,
                  banner=lambda given: "adder: /adder")
