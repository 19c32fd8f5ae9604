"""Feature dashboards' data: for each feature of a dictionary, the contexts that activate it most (with
the activation of every token around them), an activation histogram, its density, and the tokens it
promotes and suppresses through the unembedding.

    acts = feature_activations(model, sae, tokens)                  # [batch, pos, d_sae]
    dash = feature_dashboards(model, sae, batches, tokenizer=tok)   # batches: token tensors [batch, pos]
    dash.feature(12)                                                # one feature as a JSON-able dict
    dash.save("runs/sae/dashboards"); FeatureDashboards.load(...)

One pass over the batches; memory holds k contexts per feature, whatever the number of tokens.
Histograms use fixed log10-spaced bins (HIST_RANGE, HIST_BINS) so batches add up without a first pass.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from circuitlab.atomic import atomic_write_file, atomic_write_text, json_text
from circuitlab.display import Displayed
from circuitlab.dictionaries.feature_logits import feature_logit_effects
from circuitlab.dictionaries.splice import flatten_trailing
from circuitlab.errors import CircuitlabError
from circuitlab.textfile import read_text
from circuitlab.model import model_device

if TYPE_CHECKING:
    from circuitlab.data.tokenizers import Tokenizer
    from circuitlab.dictionaries.sae import SparseDictionary
    from circuitlab.model import Transformer

HIST_RANGE = (-4.0, 3.0)  # log10 of the activation
HIST_BINS = 70
TENSORS_FILE, META_FILE = "dashboards.safetensors", "dashboards.json"
_TENSORS = ("density", "max_act", "mean_act", "top_values", "top_seq", "top_pos", "window_tokens", "window_acts",
            "hist_counts", "all_density")
_LOGIT_TENSORS = ("promoted_tokens", "promoted_values", "suppressed_tokens", "suppressed_values")


@torch.no_grad()
def feature_activations(model: Transformer, dictionary: SparseDictionary, tokens: torch.Tensor) -> torch.Tensor:
    """The dictionary's feature activations on tokens [batch, pos]: [batch, pos, d_sae] (the model unchanged)."""
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    name = dictionary.cfg.hook_name
    device = model_device(model)
    _, cache = model.run_with_cache(tokens.to(device), names_filter=name)
    x = flatten_trailing(cache[name], dictionary.cfg.d_in, name)
    return dictionary.encode(x.to(dictionary.W_enc.device))


@dataclass
class FeatureDashboards(Displayed):
    """Dashboards of some features of one dictionary (F of them; k contexts each, windows of W tokens).

    density, max_act, mean_act (over active tokens) [F]; top_values, top_seq, top_pos [F, k] (the
    sequence number in the order seen, the position of the activating token); window_tokens [F, k, W]
    (-1 outside the sequence) and window_acts [F, k, W] with the activating token at index `before`;
    hist_counts [F, HIST_BINS] over log10(activation) of active tokens; all_density [d_sae]: every
    feature's density; promoted_* / suppressed_* [F, n]: the largest and smallest logit effects (None
    when the dictionary does not write into the residual stream). token_strs: id -> text of every token shown.
    In Jupyter it displays as the cards of its first ten features (viz/features.py).
    """

    hook_name: str
    d_sae: int
    features: list[int]
    n_tokens: int
    before: int
    density: torch.Tensor
    max_act: torch.Tensor
    mean_act: torch.Tensor
    top_values: torch.Tensor
    top_seq: torch.Tensor
    top_pos: torch.Tensor
    window_tokens: torch.Tensor
    window_acts: torch.Tensor
    hist_counts: torch.Tensor
    all_density: torch.Tensor
    promoted_tokens: torch.Tensor | None = None
    promoted_values: torch.Tensor | None = None
    suppressed_tokens: torch.Tensor | None = None
    suppressed_values: torch.Tensor | None = None
    token_strs: dict[int, str] = field(default_factory=dict)
    dictionary_info: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def hist_edges() -> list[float]:
        """The HIST_BINS + 1 bin edges, as activations (not logs)."""
        lo, hi = HIST_RANGE
        return [10 ** (lo + (hi - lo) * i / HIST_BINS) for i in range(HIST_BINS + 1)]

    def index(self, feature: int) -> int:
        """Row of a feature (its index in the dictionary) in these dashboards."""
        try:
            return self.features.index(int(feature))
        except ValueError:
            raise CircuitlabError(f"feature {feature} is not in these dashboards (they hold {len(self.features)} "
                                  f"of the dictionary's {self.d_sae}; features {self.features[0]}..{self.features[-1]})"
                                  ) from None

    def token(self, token_id: int) -> str:
        return self.token_strs.get(int(token_id), f"<{int(token_id)}>")

    def contexts(self, feature: int) -> list[dict[str, Any]]:
        """The top-activating contexts of a feature, strongest first (only those where it fired):
        [{"value", "seq", "pos", "tokens": [str], "acts": [float], "at": index of the activating token}]."""
        i = self.index(feature)
        out = []
        for j in range(self.top_values.shape[1]):
            value = float(self.top_values[i, j])
            if value <= 0:
                break
            ids, acts = self.window_tokens[i, j].tolist(), self.window_acts[i, j].tolist()
            keep = [n for n, t in enumerate(ids) if t >= 0]
            out.append({"value": round(value, 5), "seq": int(self.top_seq[i, j]), "pos": int(self.top_pos[i, j]),
                        "tokens": [self.token(ids[n]) for n in keep], "ids": [ids[n] for n in keep],
                        "acts": [round(acts[n], 5) for n in keep], "at": keep.index(self.before)})
        return out

    def logit_tokens(self, feature: int) -> dict[str, list[dict[str, Any]]] | None:
        """{"promoted": [{"token", "id", "value"}], "suppressed": [...]} or None."""
        if self.promoted_tokens is None:
            return None
        i = self.index(feature)
        return {kind: [{"token": self.token(t), "id": int(t), "value": round(float(v), 5)}
                       for t, v in zip(getattr(self, f"{kind}_tokens")[i].tolist(), getattr(self, f"{kind}_values")[i])]
                for kind in ("promoted", "suppressed")}

    def feature(self, feature: int) -> dict[str, Any]:
        """Everything about one feature, JSON-able (what a dashboard shows)."""
        i = self.index(feature)
        return {"feature": int(feature), "density": float(self.density[i]), "max_act": round(float(self.max_act[i]), 5),
                "mean_act": round(float(self.mean_act[i]), 5), "contexts": self.contexts(feature),
                "histogram": {"edges": [round(e, 6) for e in self.hist_edges()],
                              "counts": self.hist_counts[i].tolist()},
                "logits": self.logit_tokens(feature)}

    def summary(self) -> dict[str, Any]:
        """The dictionary-level numbers: tokens seen, dead (never fired) and dense (> 10% of tokens) fractions."""
        d = self.all_density
        return {"hook_name": self.hook_name, "d_sae": self.d_sae, "n_tokens": self.n_tokens,
                "features_shown": len(self.features), "dead_fraction": round(float((d == 0).float().mean()), 6),
                "dense_fraction": round(float((d > 0.1).float().mean()), 6),
                "median_density": float(d.median()), **({"dictionary": self.dictionary_info} if self.dictionary_info else {})}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "features": [self.feature(f) for f in self.features]}

    # ------------------------------------------------------------------ disk
    def save(self, folder: str | Path) -> Path:
        """dashboards.safetensors + dashboards.json in folder, each written atomically."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        names = _TENSORS + (_LOGIT_TENSORS if self.promoted_tokens is not None else ())
        tensors = {n: getattr(self, n).contiguous() for n in names}
        meta = {"format": "circuitlab-dashboards-1", "hook_name": self.hook_name, "d_sae": self.d_sae,
                "features": self.features, "n_tokens": self.n_tokens, "before": self.before,
                "hist_range": list(HIST_RANGE), "hist_bins": HIST_BINS, "dictionary": self.dictionary_info,
                "token_strs": {str(k): v for k, v in self.token_strs.items()}}
        atomic_write_file(folder / TENSORS_FILE, lambda tmp: save_file(tensors, tmp))
        atomic_write_text(folder / META_FILE, json_text(meta))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "FeatureDashboards":
        folder = Path(folder)
        if not (folder / META_FILE).is_file():
            raise CircuitlabError(f"{folder} holds no dashboards ({META_FILE} is missing); "
                                  "write them with `circuitlab sae dashboards`")
        try:
            meta = json.loads(read_text(folder / META_FILE, "dashboards metadata"))  # names the byte if not UTF-8
            tensors = load_file(str(folder / TENSORS_FILE))
        except CircuitlabError:
            raise
        except FileNotFoundError as e:
            raise CircuitlabError(f"{folder} holds no dashboards ({Path(e.filename).name} is missing); "
                                  "write them with `circuitlab sae dashboards`") from None
        except Exception as e:  # noqa: BLE001 - a truncated file is the user's to rebuild
            raise CircuitlabError(f"dashboards in {folder} are corrupt ({type(e).__name__}: {e}); build them again"
                                  ) from None
        if meta.get("format") != "circuitlab-dashboards-1" or meta.get("hist_bins") != HIST_BINS:
            raise CircuitlabError(f"dashboards in {folder} are in another format; build them again")
        saved: dict[str, Any] = {**{n: tensors[n] for n in _TENSORS}, **{n: tensors.get(n) for n in _LOGIT_TENSORS}}
        return cls(meta["hook_name"], meta["d_sae"], meta["features"], meta["n_tokens"], meta["before"], **saved,
                   token_strs={int(k): v for k, v in meta["token_strs"].items()},
                   dictionary_info=meta.get("dictionary", {}))


def _check_features(features: Iterable[int] | None, d_sae: int) -> list[int]:
    features = list(range(d_sae)) if features is None else sorted({int(f) for f in features})
    bad = [f for f in features if not 0 <= f < d_sae]
    if bad or not features:
        raise CircuitlabError(f"feature indices must be in [0, {d_sae}), got {bad or 'none'}")
    return features


@torch.no_grad()
def feature_dashboards(model: Transformer, dictionary: SparseDictionary, batches: Iterable[torch.Tensor] | torch.Tensor,
                       features: Iterable[int] | None = None, k: int = 10, before: int = 12, after: int = 4,
                       n_logits: int = 10, tokenizer: Tokenizer | None = None, progress: bool = False
                       ) -> FeatureDashboards:
    """Dashboards of `features` (default: all) from token batches [batch, pos] (an iterable, or one tensor).

    k contexts per feature, each a window of `before` tokens, the activating one, and `after` tokens;
    n_logits promoted and suppressed tokens. tokenizer: to show tokens as text.
    """
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    d_sae = dictionary.cfg.d_sae
    feats = _check_features(features, d_sae)
    F, W = len(feats), before + 1 + after
    index = torch.tensor(feats)
    fired = torch.zeros(d_sae, dtype=torch.long)
    act_sum, max_act = torch.zeros(F, dtype=torch.float64), torch.zeros(F)
    hist = torch.zeros(F * HIST_BINS, dtype=torch.long)
    best_vals = torch.empty(F, 0)
    best_seq = best_pos = torch.empty(F, 0, dtype=torch.long)
    best_tok = torch.empty(F, 0, W, dtype=torch.long)
    best_acts = torch.empty(F, 0, W)
    n_tokens = seen = 0
    lo, hi = HIST_RANGE
    offsets = torch.arange(-before, after + 1)
    for tokens in tqdm(batches, desc="feature dashboards", disable=not progress):
        tokens = (tokens[None] if tokens.dim() == 1 else tokens).cpu()
        acts_all = feature_activations(model, dictionary, tokens).float().cpu()  # [batch, pos, d_sae]
        B, T = tokens.shape
        fired += (acts_all > 0).sum(dim=(0, 1))
        acts = acts_all[..., index]  # [batch, pos, F]
        flat = acts.reshape(B * T, F)
        act_sum += flat.sum(0).double()
        max_act = torch.maximum(max_act, flat.max(0).values)
        rows, cols = (flat > 0).nonzero(as_tuple=True)
        bins = ((flat[rows, cols].log10() - lo) / (hi - lo) * HIST_BINS).floor().clamp(0, HIST_BINS - 1).long()
        hist += torch.bincount(cols * HIST_BINS + bins, minlength=F * HIST_BINS)
        # This batch's k best per feature, with their windows, merged into the best so far.
        vals, idx = flat.T.topk(min(k, B * T), dim=-1)  # [F, k']
        seq, pos = idx // T, idx % T
        win = pos[..., None] + offsets  # [F, k', W]
        inside = (win >= 0) & (win < T)
        win_c = win.clamp(0, T - 1)
        seq_w = seq[..., None].expand_as(win)
        tok_w = tokens[seq_w, win_c].masked_fill(~inside, -1)
        act_w = acts[seq_w, win_c, torch.arange(F)[:, None, None].expand_as(win)].masked_fill(~inside, 0.0)
        all_vals = torch.cat([best_vals, vals], dim=1)
        best_vals, order = all_vals.topk(min(k, all_vals.shape[1]), dim=-1)
        best_seq = torch.cat([best_seq, seq + seen], dim=1).gather(1, order)
        best_pos = torch.cat([best_pos, pos], dim=1).gather(1, order)
        order_w = order[..., None].expand(-1, -1, W)
        best_tok = torch.cat([best_tok, tok_w], dim=1).gather(1, order_w)
        best_acts = torch.cat([best_acts, act_w], dim=1).gather(1, order_w)
        seen += B
        n_tokens += B * T
    if n_tokens == 0:
        raise CircuitlabError("feature_dashboards got no token batches")
    density = fired[index].double() / n_tokens
    mean_act = (act_sum / fired[index].clamp(min=1)).float()
    dash = FeatureDashboards(dictionary.cfg.hook_name, d_sae, feats, n_tokens, before, density.float(), max_act,
                             mean_act, best_vals, best_seq, best_pos, best_tok, best_acts,
                             hist.view(F, HIST_BINS), (fired.double() / n_tokens).float())
    try:
        effects = feature_logit_effects(model, dictionary, feats).float().cpu()  # [F, d_vocab]
    except CircuitlabError:
        effects = None  # a dictionary not writing into the residual stream has no direct logit effect
    if effects is not None:
        n = min(n_logits, effects.shape[-1])
        dash.promoted_values, dash.promoted_tokens = effects.topk(n, dim=-1)
        dash.suppressed_values, dash.suppressed_tokens = effects.topk(n, dim=-1, largest=False)
    if tokenizer is not None:
        shown = set(best_tok[best_tok >= 0].tolist())
        if dash.promoted_tokens is not None and dash.suppressed_tokens is not None:  # set with the effects above
            shown |= set(dash.promoted_tokens.flatten().tolist()) | set(dash.suppressed_tokens.flatten().tolist())
        dash.token_strs = {t: _decode(tokenizer, t) for t in sorted(shown)}
    cfg = dictionary.cfg
    dash.dictionary_info = {"architecture": cfg.architecture, "d_in": cfg.d_in, "d_sae": cfg.d_sae,
                            "hook_name": cfg.hook_name, "out_hook_name": getattr(cfg, "out_hook_name", None)}
    return dash


def _decode(tokenizer: Tokenizer, token_id: int) -> str:
    try:
        return tokenizer.decode([int(token_id)])
    except Exception:  # noqa: BLE001 - a display string must never fail the dashboards
        return f"<{int(token_id)}>"


TEXT_SEQ_LEN = 64   # text_batches' rows: tokens per held-out sequence
TEXT_BATCH = 16     # ...and rows per batch


def text_batches(tokenizer: Tokenizer, source: str = "stories", n_tokens: int = 16_384, seq_len: int = TEXT_SEQ_LEN,
                 batch_size: int = TEXT_BATCH, seed: int = 1) -> list[torch.Tensor]:
    """Token batches [batch, seq_len] of about n_tokens from a text source ("stories", "file:PATH",
    "folder:PATH", "hf:NAME"): documents joined by EOS and cut into rows. The built-in stories use seed 1
    by default, not the 0 that training uses, so the contexts shown are held-out text."""
    from circuitlab.data.sources import load_texts

    rows_wanted = max(1, n_tokens // seq_len)
    stream: list[int] = []
    for text in load_texts(source, n_stories=max(64, n_tokens // 40), seed=seed):
        stream += tokenizer.encode(text) + [tokenizer.eos_id]
        if len(stream) >= rows_wanted * seq_len:
            break
    rows = min(rows_wanted, len(stream) // seq_len)
    if rows == 0:
        raise CircuitlabError(f"{source} gave {len(stream)} tokens, fewer than one row of {seq_len}")
    tokens = torch.tensor(stream[:rows * seq_len], dtype=torch.long).view(rows, seq_len)
    return list(tokens.split(batch_size))
