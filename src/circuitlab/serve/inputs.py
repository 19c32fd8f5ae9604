"""The inputs page of `circuitlab serve` (/inputs): which prompt tokens a prediction depends on, what each
layer already predicts (logit lens, and the tuned lens when one is loaded), and steering. Plain JSON-able
dicts; add_input_routes puts them on the app.

    attribute_prompt(model, tok, ids, target=None, foil=None, method="all")   # POST /api/attribute
    attribute_form()                                                         # GET  /api/attribute/form
    lens_prompt(model, tok, ids, lens=None)                                  # POST /api/lens
    steer_prompt(model, tok, positive, negative, layer, coefs, prompt_ids)   # POST /api/steer
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from circuitlab.analysis.input_attribution import (attribute_methods, technique_names, technique_options,
                                                   techniques)
from circuitlab.checks import FINITE, Number
from circuitlab.errors import CircuitlabError
from circuitlab.model import model_device
from circuitlab.serve.page import JS, Page, Served
from circuitlab.serve.prompt import VALUE_DIGITS, resolve_target, token_str
from circuitlab.serve.requests import OptionsRequest, request_model
from circuitlab.spec import Options, options_of, schema

if TYPE_CHECKING:
    from circuitlab.model import Transformer

MAX_STEPS = 256            # integrated-gradients steps one request may ask for
STEPS = Number(int, low=1, high=MAX_STEPS, why="the explorer answers while you wait; `circuitlab attribute` takes more")
MAX_SAMPLES = 8192         # KernelSHAP / LIME coalitions one request may ask for
SAMPLES = Number(int, low=3, high=MAX_SAMPLES, why="the explorer answers while you wait; `circuitlab attribute` "
                                                    "takes more")
LIMITS = {"steps": STEPS, "samples": SAMPLES}   # where the explorer holds a technique's option tighter
# What a token shap and lime remove may become (or a token id), as the form names them; the first is the default.
BASELINES = {"mean": "the mean embedding", "zeros": "zeros", "eos": "the EOS token", "delete": "deleted"}
DEFAULT_BASELINE = next(iter(BASELINES))
# The explorer's own baseline (shap, lime: a name or a token id; ig starts from its own) stands for the
# techniques' baseline option; exact Shapley values (up to 65 534 passes) are no answer to wait for.
LEFT_OUT = ("baseline", "exact")
MAX_STEER_PROMPTS = 32     # prompts per steering set
MAX_STEER_COEFS = 8
MAX_STEER_TOKENS = 40      # tokens generated per coefficient
STEER_PROMPT = "Once upon a time,"   # the explorer's steered generations start here (its own default, as its coefs)
NEUTRAL_STORIES = 8        # built-in stories (seed 2, not the demo's) for steering's loss cost


def _r(x: float) -> float:
    return round(float(x), VALUE_DIGITS)


def explorer_options() -> type[Options]:
    """The technique options the explorer offers (every registered technique's but LEFT_OUT), as the registry
    declares them; LIMITS holds some tighter."""
    return technique_options("ExplorerAttributionOptions", left_out=LEFT_OUT)


def _check_limits(values: dict[str, Any]) -> dict[str, Any]:
    """The technique options' values, each held to its rule, LIMITS' where the explorer is stricter."""
    checked = explorer_options()(**values).check(CircuitlabError).to_dict()
    for name, rule in LIMITS.items():
        if name in checked:
            rule.check(checked[name], name)
    return checked


def attribute_prompt(model: Transformer, tokenizer, ids: list[int], target: str | int | None = None,
                     foil: str | int | None = None, method: str = "all", baseline: str | int = DEFAULT_BASELINE,
                     **options: Any) -> dict[str, Any]:
    """Attribution of the prediction after the prompt's last token to each prompt token, by one technique or
    all (technique_names()). target: id or one-token text (default: the model's top prediction); foil: explain
    target against it (logit difference). options: the techniques' options (explorer_options(): steps, samples,
    seed, kernel_width, ...; absent: their defaults). A token shap and lime remove becomes `baseline`
    (BASELINES or a token id)."""
    if method != "all" and method not in technique_names():
        raise CircuitlabError(f"unknown method {method!r}; choose all or one of {', '.join(technique_names())}")
    options = _check_limits(options)
    if isinstance(baseline, str) and baseline not in BASELINES:
        raise CircuitlabError(f"unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)} or a token id")
    if baseline == "eos":
        if getattr(tokenizer, "eos_id", None) is None:
            raise CircuitlabError("this tokenizer has no EOS token: choose another baseline")
        baseline = tokenizer.eos_id
    d_vocab = model.cfg.d_vocab
    target_id = resolve_target(tokenizer, d_vocab, target, "target")
    foil_id = resolve_target(tokenizer, d_vocab, foil, "foil")
    if foil_id is not None and foil_id == target_id:
        raise CircuitlabError("the foil is the target: give a different token to contrast with")
    tokens = torch.tensor(ids)
    with torch.no_grad():
        logits = model(tokens[None].to(model_device(model)))[0, -1]
    if target_id is None:
        target_id = int(logits.argmax())
    if foil_id is not None and foil_id == target_id:
        raise CircuitlabError("the foil is the model's top prediction, which is the default target: give a target")
    methods = technique_names() if method == "all" else (method,)
    found = attribute_methods(model, tokens, target_id, foil_id, methods, tokenizer, baseline, progress=False,
                              **options)
    out = {}
    for m, r in found.items():
        sampled = "samples" in r.extra   # shap, lime: a fit to coalitions (shap's efficiency gap is no path's error)
        out[m] = {"scores": [_r(s) for s in r.scores.tolist()], "summary": r.describe(),
                  "top": [{"pos": p, "score": _r(s)} for p, s in r.top(5)],
                  "completeness_error": None if sampled else r.completeness_error, "steps": r.steps,
                  "metric_value": r.metric_value,
                  "per_layer": [[_r(v) for v in row] for row in r.per_layer.tolist()] if r.per_layer is not None
                  else None}
        if sampled:
            out[m].update(samples=r.extra["samples"], baseline=r.baseline, surrogate_r2=_r(r.extra["surrogate_r2"]))
    probs = logits.float().softmax(-1)
    return {"tokens": [token_str(tokenizer, t) for t in ids],
            "target": {"id": target_id, "token": token_str(tokenizer, target_id), "prob": _r(probs[target_id])},
            "foil": None if foil_id is None else {"id": foil_id, "token": token_str(tokenizer, foil_id),
                                                 "prob": _r(probs[foil_id])},
            "methods": out}


def lens_prompt(model: Transformer, tokenizer, ids: list[int], lens=None) -> dict[str, Any]:
    """The logit lens (and the tuned lens, when one is loaded) on the prompt: per residual point the KL to
    the final distribution averaged over positions, and at each position the top-1 token and its probability."""
    from circuitlab.analysis.lens import logit_lens
    from circuitlab.analysis.lens.tuned import tuned_lens

    tokens = torch.tensor(ids)
    if model.cfg.n_layers == 0:
        raise CircuitlabError("a 0-layer model has no layers to read")
    views = {"logit": logit_lens(model, tokens, k=1, tokenizer=tokenizer)}
    if lens is not None:
        views["tuned"] = tuned_lens(model, tokens, lens, k=1, tokenizer=tokenizer)
    out: dict[str, Any] = {"tokens": [token_str(tokenizer, t) for t in ids], "labels": views["logit"].labels,
                           "tuned_available": lens is not None}
    for name, v in views.items():
        assert v.kl_to_final is not None  # both lenses measure it
        out[name] = {"mean_kl": [_r(x) for x in v.kl_to_final.mean(-1).tolist()],
                     "top": [[token_str(tokenizer, int(t)) for t in row] for row in v.top_tokens[..., 0].tolist()],
                     "top_prob": [[_r(p) for p in row] for row in v.top_probs[..., 0].tolist()]}
    if lens is not None and lens.train_info:
        out["tuned_train"] = lens.train_info
    return out


@torch.no_grad()
def steer_prompt(model: Transformer, tokenizer, positive: list[list[int]], negative: list[list[int]], layer: int,
                 coefs: list[float], prompt: list[int], max_tokens: int = 20) -> dict[str, Any]:
    """A difference-of-means direction (positive − negative prompts at blocks.{layer}.hook_resid_pre) added
    with each coefficient: the greedy continuation of the prompt, the preference for the positive set and
    the loss cost on a few held-out built-in stories."""
    from circuitlab.analysis.steering import contrast_direction, steering, steering_sweep

    if not coefs or len(coefs) > MAX_STEER_COEFS:
        raise CircuitlabError(f"give 1 to {MAX_STEER_COEFS} coefficients")
    coefs = [FINITE.check(c, f"coefs[{i}]") for i, c in enumerate(coefs)]
    if len(positive) > MAX_STEER_PROMPTS or len(negative) > MAX_STEER_PROMPTS:
        raise CircuitlabError(f"at most {MAX_STEER_PROMPTS} prompts per set")
    if not 1 <= max_tokens <= MAX_STEER_TOKENS:
        raise CircuitlabError(f"max_tokens must be from 1 to {MAX_STEER_TOKENS}")
    pos = [torch.tensor(p) for p in positive]
    neg = [torch.tensor(p) for p in negative]
    vector = contrast_direction(model, pos, neg, layer=layer)
    from circuitlab.data import generate_stories

    neutral = [torch.tensor(tokenizer.encode(s)[:model.cfg.n_ctx]) for s in generate_stories(NEUTRAL_STORIES, seed=2)]
    sweep = steering_sweep(model, vector, coefs, pos, neg, neutral)
    start = torch.tensor([prompt[-(model.cfg.n_ctx - max_tokens):]]) if model.cfg.n_ctx > max_tokens else None
    generations = []
    for c in sweep.coefs:
        if start is None:
            generations.append("")
            continue
        with steering(model, vector, c):
            out = model.generate(start.to(model_device(model)), max_tokens, temperature=0.0)
        generations.append(tokenizer.decode(out[0, start.shape[1]:].tolist()))
    return {"hook_name": vector.hook_name, "norm": _r(vector.direction.norm()), "coefs": sweep.coefs,
            "preference": [_r(x) for x in sweep.preference.tolist()],
            "loss_cost": [_r(x) for x in sweep.neutral_cost().tolist()], "generations": generations}


# ---------------------------------------------------------------------------- routes


def attribute_request() -> type[OptionsRequest]:
    """POST /api/attribute's model, generated from the registry: the prompt, target and foil, the technique (all
    or one registered), the explorer's baseline, and every option of explorer_options() (its rule, or LIMITS')."""
    method: Any = Literal.__getitem__(("all", *technique_names()))
    return request_model(explorer_options(), "AttributeRequest", limits=LIMITS, strict=True, extra={
        "prompt": (str, Field(description="the text; the prediction after its last token is explained")),
        "target": (StrictInt | str | None, Field(default=None,
                                                 description="token id or one-token text (default: top)")),
        "foil": (StrictInt | str | None, Field(default=None, description="contrast the target with this token")),
        "method": (method, Field(default="all", description="one technique, or all of them")),
        "baseline": (Literal.__getitem__(tuple(BASELINES)) | StrictInt, Field(
            default=DEFAULT_BASELINE, description="shap, lime: what a removed token becomes (or a token id)"))})


def attribute_form() -> dict[str, Any]:
    """What the /inputs form offers, from the registry: each technique's name and label, the options' defaults,
    bounds and help (attribute_request's JSON schema) and which techniques take each, and the baselines."""
    props = attribute_request().model_json_schema()["properties"]
    names = list(schema(explorer_options())["properties"])
    own = {t.name: {f.name for f, _ in options_of(t.options)} if t.options is not None else set() for t in techniques()}
    takes = {n: [t for t, names_of in own.items() if n in names_of] for n in names}
    return {"methods": [{"name": t.name, "label": t.label or t.name} for t in techniques()],
            "options": {n: props[n] for n in names}, "takes": takes,
            "baselines": [{"name": k, "label": v} for k, v in BASELINES.items()]}


class LensRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="the text to read layer by layer")


class SteerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    positive: list[str] = Field(description="prompts to steer towards")
    negative: list[str] = Field(description="prompts to steer away from")
    layer: StrictInt = Field(description="add the direction to the residual stream before this layer")
    # Strict: a string or a boolean is not a coefficient (the CLI refuses them too); NaN/inf refused by FINITE.
    coefs: list[StrictInt | StrictFloat] = Field(default=[0.0, 2.0, 4.0], description="coefficients to try")
    prompt: str = Field(default=STEER_PROMPT, description="the generations start here")
    max_tokens: StrictInt = Field(default=20, description="tokens generated per coefficient")


def add_input_routes(app, model: Transformer | None, tokenizer, lens, lock: threading.Lock, encode) -> None:
    """POST /api/attribute, POST /api/lens, POST /api/steer. encode(prompt) -> ids
    checks the server's limits; without a model the API answers 409."""
    from starlette.exceptions import HTTPException

    def need() -> Transformer:
        if model is None:
            raise HTTPException(409, "no model loaded: start the server with `circuitlab serve --checkpoint RUN`")
        return model

    def attribute_route(req: Any) -> dict[str, Any]:
        """Attribution of the next-token prediction to the prompt's tokens (one method or all)."""
        loaded = need()
        ids = encode(req.prompt)
        with lock:
            return attribute_prompt(loaded, tokenizer, ids, req.target, req.foil, req.method, req.baseline,
                                    **req.options().to_dict())

    # The request model is made when the app is: the techniques registered by then (the annotation is the class).
    attribute_route.__annotations__["req"] = attribute_request()
    app.post("/api/attribute")(attribute_route)

    @app.get("/api/attribute/form")
    def attribute_form_route() -> dict[str, Any]:
        """The attribution form's techniques and options: defaults, bounds and help (from the registry)."""
        return attribute_form()

    @app.post("/api/lens")
    def lens_view(req: LensRequest) -> dict[str, Any]:
        """Logit lens and tuned lens (when loaded): KL to the final distribution and top tokens per layer."""
        loaded = need()
        ids = encode(req.prompt)
        with lock:
            return lens_prompt(loaded, tokenizer, ids, lens)

    @app.post("/api/steer")
    def steer(req: SteerRequest) -> dict[str, Any]:
        """Steer with the difference of two prompt sets' means: generations and preference by coefficient."""
        loaded = need()
        sets = []
        for what, texts in (("positive", req.positive), ("negative", req.negative)):
            texts = [t for t in texts if t.strip()]
            if not texts:
                raise CircuitlabError(f"the {what} prompt set is empty: give at least one prompt")
            sets.append([encode(t) for t in texts])
        prompt = encode(req.prompt)
        with lock:
            return steer_prompt(loaded, tokenizer, sets[0], sets[1], req.layer, req.coefs, prompt, req.max_tokens)


def _load(served: Served, given: Mapping[str, Any]) -> Any:
    """The tuned lens of /inputs: create_app's lens folder (trained on the run's model), else the run's saved one
    (run_dir/tuned_lens); None without either."""
    from circuitlab.analysis.lens.tuned import TunedLens, default_lens_dir

    run_dir, lens = given.get("run_dir"), given.get("lens")
    folder: str | Path
    if lens is None:
        if run_dir is None:
            return None
        folder = default_lens_dir(run_dir)
    else:
        if served.model is None:
            raise CircuitlabError("--lens needs --checkpoint: the model the tuned lens was trained on")
        if not TunedLens.exists(lens):
            raise CircuitlabError(f"--lens {lens} holds no tuned lens; train one with `circuitlab lens train`")
        folder = lens
    return TunedLens.load(folder, served.model).to(given.get("device", "cpu")) if TunedLens.exists(folder) else None


PAGE = Page("inputs", "/inputs", "inputs.html", static={"inputs.js": JS}, load=_load, keywords=("lens",),
            routes=lambda app, s: add_input_routes(app, s.model, s.tokenizer, s.parts["inputs"], s.lock, s.encode),
            banner=lambda given: "inputs and lenses: /inputs" if given.get("run_dir") else None)
