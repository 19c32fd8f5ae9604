"""QK attributions: why a head attended where it did, as (query-side part x key-side part) terms.

    qk = qk_attribution(model, transcoders, tokens, layer=1, head=0, query_pos=9, key_pos=4, tokenizer=tok)
    qk.top_pairs(5)        # [{"query": "token 'A' @9", "key": "L0H0 output @4 ...", "term": 19.7}, ...]
    qk.keys                # which keys won the softmax at the query, and by how much
    qk.terms.sum()         # == the model's own (pre-soft-cap) score, float64 to 1e-9

With attention patterns and norm scales frozen (the attribution graph's replacement model), the residual
stream entering layer `layer` at a position is an exact sum of parts: the token node (its embedding, with
learned positions), each active transcoder feature there (act x its decoders into the layers below), each
error node, each transcoder's skip path, each earlier head's output there (a head moves information from
other positions: its output is the part that arrived), and constants (biases, the position embedding when
the token node holds none). Through the frozen ln1, W_Q / W_K, a frozen q/k norm and the rotation for the
position (all linear) each part has its own share of the query and of the key (Block.qk_parts), and the
score q . k * scale splits into one term per pair. A soft-capped score is split before the cap.

What the terms cannot say: the softmax. A large term raises this key's score, but whether the head attends
here depends on every other key's score as well; `keys` says which keys won and by what margin.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from circuitlab.display import Displayed
from circuitlab.errors import InputError
from circuitlab.graphs.replacement import ReplacementModel
from circuitlab.graphs.transcoders import Transcoders
from circuitlab.model import model_dtype
from circuitlab.model.hooks import ActivationCache, HookFn, HookPoint

if TYPE_CHECKING:
    from circuitlab.model import Transformer

FULL_TERMS = 2 ** 22     # keep the whole [query parts, key parts] matrix up to this many terms (32 MiB float64)
TOP_PAIRS = 50           # past it: the largest pairs by |term| and every part's row / column sums


@dataclass
class QKAttribution(Displayed):
    """One head's score at (query_pos, key_pos) split into query-part x key-part terms.

    query_parts / key_parts: [{"kind", "label", "layer", "pos", ...}] (the last one of each: the constant);
    terms [n_query_parts, n_key_parts] float64 (None when too large: top_pairs and the marginals remain);
    query_totals [n_query_parts] (each query part against the whole key), key_totals [n_key_parts];
    raw_score: the score before any soft-cap (the terms' sum, computed apart); score: the model's own
    (capped) score; keys: the head's attention at query_pos, the strongest keys first."""

    layer: int
    head: int
    query_pos: int
    key_pos: int
    query_parts: list[dict[str, Any]]
    key_parts: list[dict[str, Any]]
    terms: torch.Tensor | None
    query_totals: torch.Tensor
    key_totals: torch.Tensor
    pairs: list[dict[str, Any]]
    raw_score: float
    terms_sum: float
    score: float
    soft_cap: float | None
    keys: list[dict[str, Any]]
    query_token: str = ""
    key_token: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """|sum of the terms - the model's raw score|."""
        return abs(self.terms_sum - self.raw_score)

    def top_pairs(self, k: int = 5) -> list[dict[str, Any]]:
        """The k terms of largest magnitude: {"query", "key", "term", "words", indices}."""
        return self.pairs[:k]

    def key_softmax(self) -> dict[str, Any]:
        """The key at key_pos in the softmax: its probability, rank, and its score's margin over the best
        other key (negative: another key scored higher; None when it is the only key)."""
        me = next(k for k in self.keys if k["pos"] == self.key_pos)
        others = [k["score"] for k in self.keys if k["pos"] != self.key_pos]
        return {"prob": me["prob"], "rank": me["rank"], "score": me["score"],
                "margin": me["score"] - max(others) if others else None}

    def summary(self, k: int = 3) -> list[str]:
        s = self.key_softmax()
        winner = self.keys[0]
        lines = [f"L{self.layer}H{self.head} from {self.query_token} @{self.query_pos} to {self.key_token} "
                 f"@{self.key_pos}: score {self.score:+.3g}"
                 + (f" (raw {self.raw_score:+.3g} before the soft-cap)" if self.soft_cap is not None else "")
                 + f", attention {s['prob']:.2f} (rank {s['rank']}; "
                 + (f"margin {s['margin']:+.3g} over the next key)" if s["margin"] is not None else "the only key)")]
        if winner["prob"] > s["prob"]:
            lines.append(f"the head attended most to {winner['token']} @{winner['pos']} ({winner['prob']:.2f})")
        lines += [p["words"] for p in self.top_pairs(k)]
        return lines

    def to_dict(self, k: int = 10) -> dict[str, Any]:
        return {"layer": self.layer, "head": self.head, "query_pos": self.query_pos, "key_pos": self.key_pos,
                "query_token": self.query_token, "key_token": self.key_token, "score": self.score,
                "raw_score": self.raw_score, "terms_sum": self.terms_sum, "soft_cap": self.soft_cap,
                "key": self.key_softmax(), "keys": self.keys[:5],
                "top_pairs": [{k_: v for k_, v in p.items() if k_ not in ("q", "k")} for p in self.top_pairs(k)],
                "top_query_parts": _top_parts(self.query_parts, self.query_totals, k),
                "top_key_parts": _top_parts(self.key_parts, self.key_totals, k),
                "n_query_parts": len(self.query_parts), "n_key_parts": len(self.key_parts), "info": self.info}

    def __repr__(self) -> str:
        return (f"QKAttribution(L{self.layer}H{self.head}, query {self.query_pos} -> key {self.key_pos}: score "
                f"{self.score:+.4g}, {len(self.query_parts)} x {len(self.key_parts)} parts)")

    def _repr_html_(self) -> str:
        return qk_html([self])


def _top_parts(parts: list[dict[str, Any]], totals: torch.Tensor, k: int) -> list[dict[str, Any]]:
    order = totals.abs().argsort(descending=True)[:k].tolist()
    return [{"label": parts[i]["label"], "kind": parts[i]["kind"], "total": float(totals[i])} for i in order]


def qk_html(results: Sequence[QKAttribution], k: int = 5) -> str:
    """A small HTML block per result: the softmax line and the top pairs (Jupyter, report.html)."""
    out = []
    for r in results:
        lines = r.summary(0)
        rows = "".join(f"<tr><td>{html.escape(p['query'])}</td><td>{html.escape(p['key'])}</td>"
                       f"<td style='text-align:right'>{p['term']:+.3g}</td></tr>" for p in r.top_pairs(k))
        out.append(f"<div><b>QK attribution</b> {html.escape(lines[0])}"
                   + "".join(f"<br>{html.escape(x)}" for x in lines[1:])
                   + f"<table><tr><th>query part</th><th>key part</th><th>term</th></tr>{rows}</table></div>")
    return "".join(out)


# ---------------------------------------------------------------------------- computing them

def check_request(model: Transformer, layer: Any, head: Any, query_pos: Any, key_pos: Any, n_pos: int) -> None:
    """One line for a head, layer or position that does not exist, or a key after the query."""
    cfg = model.cfg
    if cfg.n_layers == 0:
        raise InputError("this model has no attention layers: QK attributions need a model with attention")
    for name, v, n in (("layer", layer, cfg.n_layers), ("head", head, cfg.n_heads), ("query position", query_pos, n_pos),
                       ("key position", key_pos, n_pos)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise InputError(f"{name} {v!r} does not exist: the {'prompt' if 'position' in name else 'model'} has "
                             f"{n} {'positions' if 'position' in name else name + 's'} (0..{n - 1})")
    if key_pos > query_pos:
        raise InputError(f"key position {key_pos} is after query position {query_pos}: attention is causal, a "
                         "query only reads keys at or before it")
    window = model.blocks[layer].attn.window
    if window is not None and query_pos - key_pos >= window:
        raise InputError(f"key position {key_pos} is outside layer {layer}'s sliding window of {window} from "
                         f"query position {query_pos}")


class _Reference:
    """What QK attributions at several (layer, position) places share: the replacement model's reference
    run and each head's output (hook_result) at the positions asked for only, each layer's scores there."""

    def __init__(self, model: Transformer, transcoders: Transcoders | None, tokens: torch.Tensor, layers: set[int],
                 positions: set[int], bos: bool = False, rm: ReplacementModel | None = None) -> None:
        self.model, self.tc = model, transcoders
        if transcoders is None:
            if model.cfg.has_mlp:
                raise InputError("this model has MLPs: give its transcoders (QK parts name the features there)")
            self.rm = None
            self.tokens = torch.as_tensor(tokens)
        else:
            self.rm = rm if rm is not None else ReplacementModel(model, transcoders, tokens, bos=bos)
            self.tokens = self.rm.tokens
        pos = sorted(positions)
        top = max(layers)
        names = [n for n in ("hook_embed", "hook_pos_embed") if n in model.hook_points()]
        keep: dict[str, torch.Tensor] = {}

        def save(t: torch.Tensor, hook: HookPoint) -> None:   # only the positions asked for
            keep[hook.name] = t.detach()[:, :, pos] if _per_head(hook.name) else t.detach()[:, pos]

        fns: list[tuple[str, HookFn]] = [(n, save) for n in names]
        fns += [(f"blocks.{k}.attn.hook_result", save) for k in range(top)]
        fns += [(f"blocks.{k}.hook_resid_pre", save) for k in layers]
        fns += [(f"blocks.{k}.attn.hook_attn_scores", save) for k in layers]
        fns += [(f"blocks.{k}.attn.hook_pattern", save) for k in layers]
        frozen = model.frozen_hook_names()
        cache: dict[str, torch.Tensor] = {}

        def whole(t: torch.Tensor, hook: HookPoint) -> None:
            cache[hook.name] = t.detach()

        with torch.no_grad(), model.hooks(fns + [(n, whole) for n in frozen]):
            model(self.tokens[None])
        self.frozen = cache
        self.slot = {p: i for i, p in enumerate(pos)}
        self.keep = keep

    def at(self, name: str, pos: int) -> torch.Tensor:
        """A kept activation [..] at a position (batch 0)."""
        t = self.keep[name]
        return t[0, :, self.slot[pos]] if _per_head(name) else t[0, self.slot[pos]]

    def parts(self, layer: int, pos: int, tokenizer: Any) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """The parts of the residual stream entering `layer` at `pos`: labels and vectors [n, d_model]."""
        model, rm, tc = self.model, self.rm, self.tc
        tok = _token_str(tokenizer, int(self.tokens[pos]))
        labels: list[dict[str, Any]] = []
        vecs: list[torch.Tensor] = []

        def add(vec: torch.Tensor, kind: str, label: str, **more: Any) -> None:
            labels.append({"kind": kind, "label": label, "pos": pos, **more})
            vecs.append(vec)

        embedded = sum(self.at(n, pos) for n in ("hook_embed", "hook_pos_embed") if n in self.keep)
        token = rm.embeddings[pos] if rm is not None else self.at("hook_embed", pos)
        add(token, "token", f"token {tok} @{pos}")
        rest = embedded - token
        if bool(rest.any()):   # learned positions the token node does not hold
            add(rest, "position", f"position {pos}")
        for k in range(layer):
            block = model.blocks[k]
            shares, bias = block.attn_out_shares(self.at(f"blocks.{k}.attn.hook_result", pos))
            pattern = self.frozen[f"blocks.{k}.attn.hook_pattern"][0, :, pos]          # [head, key_pos]
            for h in range(model.cfg.n_heads):
                src = int(pattern[h].argmax())
                add(shares[h], "head", f"L{k}H{h} output @{pos} (attending @{src} "
                    f"{_token_str(tokenizer, int(self.tokens[src]))} {float(pattern[h, src]):.2f})", layer=k, head=h)
            if bool(torch.as_tensor(bias).any()):
                add(bias, "bias", f"attention bias L{k}", layer=k)
            if not model.cfg.has_mlp:
                continue
            assert rm is not None  # a model with MLPs comes with transcoders, so with a replacement run
            if tc is None or not tc.has(k):
                add(rm.errors[k][pos], "error", f"error L{k} @{pos} (whole MLP)", layer=k)
                continue
            skip = tc.skip(k, rm.inputs[k][pos])
            if skip is not None:
                add(skip, "skip", f"skip L{k} @{pos}", layer=k)
            add(rm.errors[k][pos], "error", f"error L{k} @{pos}", layer=k)
            zeros = {j: rm.acts[j][pos].new_zeros(tc.d_sae(j)) for j in tc.layers}
            add(tc.decode(k, zeros), "bias", f"transcoder bias L{k}", layer=k)
        if tc is not None and rm is not None:   # each active feature here: its decoders into the layers below `layer`
            for j in tc.layers:
                if j >= layer:
                    continue
                into = [i for i, t in enumerate(tc.writes(j)) if t < layer]
                feats = rm.acts[j][pos].nonzero().flatten()
                if not len(feats) or not into:
                    continue
                dec = tc.decoder_vectors(j, feats)[:, into].sum(1)              # [n, d_model]
                acts = rm.acts[j][pos, feats]
                for f, a, d in zip(feats.tolist(), acts, dec):
                    add(a * d, "feature", f"feature L{j} #{f} @{pos} {tok}", layer=j, feature=f,
                        activation=float(a))
        dtype = model_dtype(model)
        return labels, torch.stack([v.to(dtype) for v in vecs])


def _per_head(name: str) -> bool:
    """Scores and patterns are [batch, head, query_pos, key_pos]: their positions are dim 2."""
    return name.endswith("hook_attn_scores") or name.endswith("hook_pattern")


def _token_str(tokenizer: Any, token: int) -> str:
    if tokenizer is None:
        return f"[{token}]"
    try:
        return repr(tokenizer.decode([token]))
    except Exception:  # noqa: BLE001 - a label only
        return f"[{token}]"


def qk_attribution(model: Transformer, transcoders: Transcoders | None, tokens: torch.Tensor, layer: int, head: int,
                   query_pos: int, key_pos: int, tokenizer: Any = None, bos: bool = False) -> QKAttribution:
    """Head `head` of layer `layer`'s score from query_pos to key_pos (tokens [pos]) split into query-part x
    key-part terms over the replacement model's parts (features, error nodes, token nodes, skips, earlier
    heads' outputs, biases). transcoders: None for an attention-only model."""
    return qk_attributions(model, transcoders, tokens, [(layer, head, query_pos, key_pos)], tokenizer, bos)[0]


def qk_attributions(model: Transformer, transcoders: Transcoders | None, tokens: torch.Tensor,
                    requests: Sequence[tuple[int, int, int, int]], tokenizer: Any = None, bos: bool = False,
                    rm: ReplacementModel | None = None) -> list[QKAttribution]:
    """Several (layer, head, query_pos, key_pos) at once, on one reference run (see qk_attribution)."""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 1:
        raise InputError(f"QK attributions are computed on one prompt: tokens [pos], got shape {tuple(tokens.shape)}")
    requests = [cast(tuple[int, int, int, int], tuple(r)) for r in requests]  # checked just below
    for r in requests:
        if len(r) != 4:
            raise InputError(f"a QK request is (layer, head, query_pos, key_pos), got {r!r}")
        check_request(model, *r, len(tokens))
    if not requests:
        return []
    ref = _Reference(model, transcoders, tokens, {r[0] for r in requests}, {p for r in requests for p in r[2:]},
                     bos, rm)
    out = []
    with torch.no_grad():
        # the parts first, outside frozen mode: a post-norm's share of each head is taken at the scale of this
        # very output (Block.attn_out_shares), which frozen mode would fit to whole sequences
        parts = {(r[0], p): ref.parts(r[0], p, tokenizer) for r in requests for p in r[2:]}
        with model.frozen(ActivationCache(ref.frozen, {}, model)):
            for layer, head, qp, kp in requests:
                out.append(_one(ref, layer, head, qp, kp, tokenizer, parts[layer, qp], parts[layer, kp]))
    return out


def _one(ref: _Reference, layer: int, head: int, qp: int, kp: int, tokenizer: Any,
         q_side: tuple[list[dict[str, Any]], torch.Tensor], k_side: tuple[list[dict[str, Any]], torch.Tensor]
         ) -> QKAttribution:
    model = ref.model
    block = model.blocks[layer]
    attn = block.attn
    q_labels, q_parts = list(q_side[0]), q_side[1]
    k_labels, k_parts = list(k_side[0]), k_side[1]
    q_labels.append({"kind": "bias", "label": f"query constant (L{layer} norm bias, b_Q)", "pos": qp})
    k_labels.append({"kind": "bias", "label": f"key constant (L{layer} norm bias, b_K)", "pos": kp})
    # the parts must add up to what the model's block read: a failed sum is a bug, not a user's error
    for parts, pos in ((q_parts, qp), (k_parts, kp)):
        want = ref.at(f"blocks.{layer}.hook_resid_pre", pos)
        gap = float((parts.sum(0) - want).abs().max())
        if gap > 1e-4 * (1 + float(want.abs().max())):
            raise RuntimeError(f"QK parts at position {pos} miss the residual stream by {gap:.3g}")
    q = block.qk_parts(q_parts, qp, "q")[:, head].double()                    # [n_q, d_head]
    k = block.qk_parts(k_parts, kp, "k")[:, attn.kv_head(head)].double()      # [n_k, d_head]
    q_total, k_total = q.sum(0), k.sum(0)
    n_q, n_k = len(q), len(k)
    keep_all = n_q * n_k <= FULL_TERMS
    terms = q.new_zeros(n_q, n_k) if keep_all else None
    best_v = q.new_zeros(0)
    best_i = torch.zeros(0, dtype=torch.long)
    total = 0.0
    rows = max(1, FULL_TERMS // max(n_k, 1))
    for a in range(0, n_q, rows):       # chunks of query parts: memory stays bounded by FULL_TERMS
        t = attn.score_terms(q[a:a + rows], k)
        total += float(t.sum())
        if terms is not None:
            terms[a:a + rows] = t
        flat = t.flatten()
        v, i = flat.abs().topk(min(TOP_PAIRS, flat.numel()))
        best_v = torch.cat([best_v, v])
        best_i = torch.cat([best_i, i + a * n_k])
        sel = best_v.argsort(descending=True)[:TOP_PAIRS]
        best_v, best_i = best_v[sel], best_i[sel]
    q_tot = attn.score_terms(q, k_total[None])[:, 0]
    k_tot = attn.score_terms(q_total[None], k)[0]
    pairs = []
    for v_, idx in zip(best_v.tolist(), best_i.tolist()):
        if v_ == 0:
            break
        i, j = divmod(idx, n_k)
        term = float(attn.score_terms(q[i:i + 1], k[j:j + 1])[0, 0])
        pairs.append({"query": q_labels[i]["label"], "key": k_labels[j]["label"], "term": term, "q": i, "k": j,
                      "words": f"query: {q_labels[i]['label']} x key: {k_labels[j]['label']} -> {term:+.3g}"})
    scores = ref.at(f"blocks.{layer}.attn.hook_attn_scores", qp)[head, :qp + 1].double()
    score = float(scores[kp])
    # the model's own score before its soft-cap (the cap c tanh(s / c) undone), what the terms add up to
    raw = score if attn.softcap is None else attn.softcap * math.atanh(score / attn.softcap)
    pattern = ref.at(f"blocks.{layer}.attn.hook_pattern", qp)[head, :qp + 1].double()
    order = pattern.argsort(descending=True, stable=True).tolist()
    rank = {p: 1 + int((pattern > pattern[p]).sum()) for p in order}     # ties share a rank
    keys = [{"pos": p, "token": _token_str(tokenizer, int(ref.tokens[p])), "prob": float(pattern[p]),
             "score": float(scores[p]), "rank": rank[p]} for p in order[:5]]
    if kp not in order[:5]:
        keys.append({"pos": kp, "token": _token_str(tokenizer, int(ref.tokens[kp])), "prob": float(pattern[kp]),
                     "score": float(scores[kp]), "rank": rank[kp]})
    return QKAttribution(layer, head, qp, kp, q_labels, k_labels, terms, q_tot, k_tot, pairs, raw, total,
                         score, attn.softcap, keys, _token_str(tokenizer, int(ref.tokens[qp])),
                         _token_str(tokenizer, int(ref.tokens[kp])),
                         info={"n_terms": n_q * n_k, "terms_kept": keep_all})


def qk_cost(model: Transformer, transcoders: Transcoders | None, n_requests: int, n_pos: int) -> dict[str, float]:
    """What QK attributions for n_requests heads hold at most, said before the work: the kept head outputs
    (layers x heads x 2 positions per request x d_model) and one request's terms (bounded by FULL_TERMS)."""
    cfg = model.cfg
    held = cfg.n_layers * cfg.n_heads * min(2 * n_requests, n_pos) * cfg.d_model
    return {"requests": n_requests, "head_outputs_mb": held * 8 / 2**20, "terms_mb_max": FULL_TERMS * 8 / 2**20}
