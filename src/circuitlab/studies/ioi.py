"""The indirect-object identification study (Wang et al. 2022, "Interpretability in the wild"): after "When Mary
and John went to the store, John gave a drink to" a model says " Mary", the indirect object (IO), not the
repeated subject (S). In GPT-2 small a circuit of heads does it: name movers in late layers attend from the end to
IO and copy it to the logits, negative name movers push the other way, earlier heads (S-inhibition, induction,
duplicate-token) tell the name movers which name not to copy; mean-ablating every head outside the circuit keeps
most of the IO - S logit difference.

Measured on `prompts` prompts of one token length (templates x places x objects x names, each name one token in
this tokenizer: checked, the names that are not are left out), half ABBA ("Mary and John ... John"), half BABA
("John and Mary ... John"); the corrupted prompts (Wang's ABC) put three other names in the same places:
- accuracy (IO's logit above S's) and the IO - S logit difference (patching.logit_diff);
- path patching from each head straight to the logits (patching.path.path_patching_to_logits): name movers lower
  the logit difference when their direct path is corrupted, negative name movers raise it;
- each head's total effect (activation patching of its output, clean run with the corrupted output: patching's
  head_out, direction "noise"); the circuit: the name movers, the negative name movers and the heads of largest
  total effect;
- the found heads' attention from the final position to IO, S1 and S2;
- S-inhibition: path patching from every earlier head into the name mover's query (patching.path.path_patching);
- faithfulness: the logit difference kept with every head outside the circuit mean-ablated (means over the ABC
  prompts at each position: ablation's mean_by_pos), and with the circuit's own heads ablated (its complement).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import circuitlab.memory as memory
from circuitlab.checks import COUNT, INT
from circuitlab.errors import CircuitlabError
from circuitlab.names import head_name, parse_head
from circuitlab.spec import Options, option
from circuitlab.studies.base import Claim, Study, StudyResult, forward_flops

if TYPE_CHECKING:
    from circuitlab.model import Transformer
    from circuitlab.viz.figure import FigureSpec

NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Kate", "Anne", "Paul", "Mark", "Lisa",
         "Sarah", "David", "Michael", "Emma", "Jack", "Alice", "Bob", "Peter", "Laura", "Chris", "Ben", "Sam",
         "Lucy", "George", "Rachel", "Robert", "Susan")
TEMPLATES = ("When {A} and {B} went to the {place}, {S} gave a {thing} to",
             "After {A} and {B} went to the {place}, {S} gave a {thing} to",
             "While {A} and {B} were at the {place}, {S} gave a {thing} to",
             "Then, {A} and {B} went to the {place}. {S} gave a {thing} to")
PLACES = ("store", "park", "school", "office", "garden", "station", "house", "beach")
THINGS = ("drink", "ball", "book", "key", "ring", "gift", "bone", "letter")
# The verdicts' thresholds, written once.
ACCURATE = 0.9        # the task is solved: IO above S on this share of the prompts
MOVER_SHARE = 0.1     # a (negative) name mover's direct path carries this share of the logit difference or more
MOST = 0.5            # "most of the logit difference"


@dataclass(frozen=True)
class IOIOptions(Options):
    """The IOI study's sizes (small by default: the study fits 5 minutes at 150 GFLOP/s on a 135M model)."""

    title = "ioi study"
    prompts: int = option(8, COUNT, help="IOI prompts (half ABBA, half BABA), all of one token length")
    circuit_size: int = option(12, COUNT, help="heads of largest total effect in the circuit (with the name movers)")
    movers: int = option(3, COUNT, help="name movers (and negative name movers) named at most")
    prompt_seed: int = option(0, INT, help="the seed of the prompts' names, templates, places and objects")


def one_token_names(tokenizer: Any) -> list[str]:
    """The NAMES that encode to one token after a space (" Mary") in this tokenizer (one it cannot encode is not)."""
    def one(name: str) -> bool:
        try:
            return len(tokenizer.encode(" " + name)) == 1
        except CircuitlabError:   # e.g. a char tokenizer without this letter
            return False
    return [n for n in NAMES if one(n)]


def make_prompts(tokenizer: Any, opts: IOIOptions) -> dict[str, Any]:
    """Clean and ABC prompts of one token length: {"clean", "corrupt": [text], "io", "s": [token id],
    "order": ["ABBA" | "BABA"], "positions": [{"IO", "S1", "S2"}], "tokens", "corrupt_tokens": [n, pos],
    "names": the one-token names used, "length"}."""
    names = one_token_names(tokenizer)
    if len(names) < 5:
        raise CircuitlabError(f"only {len(names)} of the study's {len(NAMES)} names are one token in this tokenizer "
                              "(IOI needs 5: IO, S and three others for the corrupted prompts)")
    gen = torch.Generator().manual_seed(opts.prompt_seed)

    def pick(seq: tuple[str, ...] | list[str]) -> str:
        return seq[int(torch.randint(len(seq), (1,), generator=gen))]

    rows: list[dict[str, Any]] = []
    for i in range(8 * opts.prompts):   # drawn until enough share one length
        template, place, thing = pick(TEMPLATES), pick(PLACES), pick(THINGS)
        order = torch.randperm(len(names), generator=gen)[:5].tolist()
        io, s, c, d, e = (names[j] for j in order)
        abba = i % 2 == 0
        a, b = (io, s) if abba else (s, io)
        text = template.format(A=a, B=b, S=s, place=place, thing=thing)
        corrupt = template.format(A=c, B=d, S=e, place=place, thing=thing)
        ids, cids = tokenizer.encode(text), tokenizer.encode(corrupt)
        if len(ids) != len(cids):
            continue
        io_id, s_id = tokenizer.encode(" " + io)[0], tokenizer.encode(" " + s)[0]
        s_at = [p for p, t in enumerate(ids) if t == s_id]
        if len(s_at) != 2 or ids.count(io_id) != 1:
            continue
        rows.append({"clean": text, "corrupt": corrupt, "io": io_id, "s": s_id, "order": "ABBA" if abba else "BABA",
                     "positions": {"IO": ids.index(io_id), "S1": s_at[0], "S2": s_at[1]}, "ids": ids, "cids": cids})
    lengths = [len(r["ids"]) for r in rows]
    if not lengths:
        raise CircuitlabError("no IOI prompt kept its length under the corrupted names; this tokenizer splits them")
    length = max(set(lengths), key=lambda n: (lengths.count(n), -n))
    same = [r for r in rows if len(r["ids"]) == length]
    first = [r for r in same if r["order"] == "ABBA"][: (opts.prompts + 1) // 2]
    kept = first + [r for r in same if r["order"] == "BABA"][: opts.prompts - len(first)]
    return {key: [r[key] for r in kept] for key in ("clean", "corrupt", "io", "s", "order", "positions")} | {
        "tokens": torch.tensor([r["ids"] for r in kept]), "corrupt_tokens": torch.tensor([r["cids"] for r in kept]),
        "names": names, "length": length}


@torch.no_grad()
def attention_to_names(model: "Transformer", tokens: torch.Tensor, positions: list[dict[str, int]],
                       heads: list[str]) -> dict[str, dict[str, float]]:
    """Each head's attention from the final position to IO, S1 and S2, averaged over the prompts."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    out = {}
    rows = torch.arange(tokens.shape[0])
    for name in heads:
        layer, head = parse_head(name)
        last = cache["pattern", layer][:, head, -1]   # [batch, key]
        out[name] = {k: round(float(last[rows, torch.tensor([p[k] for p in positions])].mean()), 4)
                     for k in ("IO", "S1", "S2")}
    return out


def run_ioi(model: "Transformer", tokenizer: Any, options: IOIOptions, progress: bool = True) -> StudyResult:
    """The IOI study on `model` (see the module docstring)."""
    from circuitlab.analysis.ablation import run_ablated
    from circuitlab.analysis.patching import activation_patching, logit_diff
    from circuitlab.analysis.patching.path import path_patching_to_logits

    opts = options.check()
    if tokenizer is None:
        raise CircuitlabError("the IOI study writes English prompts: the checkpoint needs its tokenizer")
    t0 = time.time()
    p = make_prompts(tokenizer, opts)
    clean, corrupt = p["tokens"], p["corrupt_tokens"]
    metric = logit_diff(torch.tensor(p["io"]), torch.tensor(p["s"]))
    with torch.no_grad():
        logits = model(clean)[:, -1].float()
    rows = torch.arange(len(clean))
    per_row = logits[rows, torch.tensor(p["io"])] - logits[rows, torch.tensor(p["s"])]
    ld = float(per_row.mean())
    direct = path_patching_to_logits(model, clean, corrupt, metric)
    total = activation_patching(model, clean, corrupt, metric, "head_out", direction="noise", progress=progress)
    movers = [h for h, e in direct.ranked(opts.movers, -1) if -e >= MOVER_SHARE * abs(ld)]
    negative = [h for h, e in direct.ranked(opts.movers, 1) if e >= MOVER_SHARE * abs(ld)]
    effect = total.effect()   # [layer, head]: the logit difference's change with the head's output corrupted
    H = effect.shape[1]
    by_total = [head_name(i // H, i % H) for i in effect.abs().flatten().argsort(descending=True)[
        : opts.circuit_size].tolist()]
    circuit = list(dict.fromkeys(movers + negative + by_total))
    every = [head_name(l, h) for l in range(model.cfg.n_layers) for h in range(H)]
    outside = [h for h in every if h not in circuit]
    with torch.no_grad():
        kept = float(metric(run_ablated(model, clean, outside, "mean_by_pos", corrupt)))
        without = float(metric(run_ablated(model, clean, circuit, "mean_by_pos", corrupt)))
    numbers = {
        "logit_diff": round(ld, 4), "accuracy": round(float((per_row > 0).double().mean()), 4),
        "top1_io": round(float((logits.argmax(-1) == torch.tensor(p["io"])).double().mean()), 4),
        "logit_diff_by_order": {o: round(float(per_row[[i for i, x in enumerate(p["order"]) if x == o]].mean()), 4)
                                for o in ("ABBA", "BABA") if o in p["order"]},
        "corrupt_logit_diff": round(direct.corrupt_value, 4),
        "direct": direct.to_dict(), "total_effect": [[round(float(x), 4) for x in r] for r in effect],
        "name_movers": movers, "negative_name_movers": negative, "circuit": circuit,
        "attention": {},   # below
        "faithfulness": {"circuit_logit_diff": round(kept, 4), "complement_logit_diff": round(without, 4),
                         "circuit_share": round(kept / ld, 4) if ld else None,
                         "complement_share": round(without / ld, 4) if ld else None,
                         "heads_ablated_outside": len(outside)}}
    setup = {"prompts": p["clean"], "corrupted": p["corrupt"], "order": p["order"], "length": p["length"],
             "one_token_names": p["names"], "names_left_out": [n for n in NAMES if n not in p["names"]],
             "seed": opts.prompt_seed, "ablation": "mean over the ABC prompts at each position (mean_by_pos)"}
    attention = attention_to_names(model, clean, p["positions"], circuit)
    numbers["attention"] = attention
    numbers["s_inhibition"] = s_inhibition(model, clean, corrupt, metric, movers, attention, progress)
    return StudyResult("ioi", setup, numbers, ioi_claims(numbers), seconds={"wall": round(time.time() - t0, 1)})


def name_mover_receiver(movers: list[str], attention: dict[str, dict[str, float]]) -> str | None:
    """The name mover whose query S-inhibition is traced into: the strongest that attends IO over both S (else
    the strongest); None without name movers."""
    on_io = [h for h in movers if attention[h]["IO"] > max(attention[h]["S1"], attention[h]["S2"])]
    chosen = on_io or movers
    return chosen[0] if chosen else None


def s_inhibition(model: "Transformer", clean: torch.Tensor, corrupt: torch.Tensor, metric: Any, movers: list[str],
                 attention: dict[str, dict[str, float]], progress: bool = True) -> dict[str, Any] | None:
    """Path patching from every earlier head into the name mover's query (patching.path.path_patching, Wang et
    al.'s S-inhibition step): the senders whose corrupted output, reaching that query alone, lowers the logit
    difference most. None without a name mover past layer 0."""
    from circuitlab.analysis.patching.path import path_patching

    receiver = name_mover_receiver(movers, attention)
    if receiver is None or parse_head(receiver)[0] == 0:
        return None
    found = path_patching(model, clean, corrupt, metric, parse_head(receiver), "q", progress=progress)
    effect = found.effect().nan_to_num(0.0)
    H = effect.shape[1]
    order = effect.flatten().argsort()[:5].tolist()   # most negative first: these senders' paths carry IO's choice
    return {"receiver": receiver, "clean_value": round(found.clean_value, 4),
            "senders": [{"head": head_name(i // H, i % H), "effect": round(float(effect.flatten()[i]), 4)}
                        for i in order if effect.flatten()[i] < 0]}


def ioi_claims(n: dict[str, Any]) -> list[Claim]:
    """The paper's claims against the numbers (as run_ioi writes them); each verdict states its numbers."""
    ld, acc = n["logit_diff"], n["accuracy"]
    claims = [Claim("The model identifies the indirect object: it prefers IO to the repeated subject S.",
                    f"IO's logit above S's on {acc:.0%} of the prompts (solved means {ACCURATE:.0%} or more), mean "
                    f"IO - S logit difference {ld:+.2f}.", acc >= ACCURATE and ld > 0)]
    if ld <= 0:
        why = f"the logit difference is {ld:+.2f}: there is no preference for IO to explain, so nothing can be said."
        return claims + [Claim(c, why, None) for c in (_MOVERS, _NEGATIVE, _S_INHIBITION, _FAITHFUL, _NECESSARY)]
    lowers, raises = n["direct"]["lowers"], n["direct"]["raises"]
    strong = [r for r in lowers if -r["effect"] >= MOVER_SHARE * ld]
    if not strong:
        top = lowers[0] if lowers else None
        said = (f"no head's direct path carries {MOVER_SHARE:.0%} of the logit difference {ld:+.2f}" +
                (f" (the largest, {top['head']}, {-top['effect']:.2f})." if top else "."))
        claims.append(Claim(_MOVERS, said, False))
    else:
        def att(h: str) -> dict[str, float]:
            return n["attention"].get(h, {"IO": 0.0, "S1": 0.0, "S2": 0.0})

        on_io = [r for r in strong if att(r["head"])["IO"] > max(att(r["head"])["S1"], att(r["head"])["S2"])]
        r = on_io[0] if on_io else strong[0]
        a = att(r["head"])
        said = (f"corrupting {r['head']}'s direct path lowers the logit difference by {-r['effect']:.2f} "
                f"({-r['effect'] / ld:.0%} of {ld:.2f}); from the end it attends IO {a['IO']:.2f}, S1 {a['S1']:.2f}, "
                f"S2 {a['S2']:.2f}")
        if on_io:
            said += ": more to IO than to either S."
            if r is not strong[0]:
                b = att(strong[0]["head"])
                said += (f" The strongest direct path, {strong[0]['head']} ({-strong[0]['effect']:.2f}), attends IO "
                         f"{b['IO']:.2f}, S1 {b['S1']:.2f}, S2 {b['S2']:.2f}.")
        else:
            said += (f": not more to IO than to S, nor does any of the {len(strong)} head(s) carrying "
                     f"{MOVER_SHARE:.0%} or more.")
        claims.append(Claim(_MOVERS, said, bool(on_io)))
    neg = raises[0] if raises else None
    if neg is not None and neg["effect"] >= MOVER_SHARE * ld:
        claims.append(Claim(_NEGATIVE, f"corrupting {neg['head']}'s direct path raises the logit difference by "
                            f"{neg['effect']:.2f} ({neg['effect'] / ld:.0%} of {ld:.2f}).", True))
    else:
        claims.append(Claim(_NEGATIVE, f"no head's direct path lowers the logit difference by {MOVER_SHARE:.0%} or "
                            "more" + (f" (the largest, {neg['head']}, {neg['effect']:.2f})." if neg else "."), False))
    claims.append(_s_inhibition_claim(n.get("s_inhibition"), ld))
    f = n["faithfulness"]
    size = len(n["circuit"])
    claims.append(Claim(_FAITHFUL, f"with the {f['heads_ablated_outside']} heads outside the circuit of {size} "
                        f"mean-ablated the logit difference is {f['circuit_logit_diff']:+.2f}, "
                        f"{f['circuit_share']:.0%} of {ld:.2f} (most means {MOST:.0%} or more).",
                        f["circuit_share"] >= MOST))
    claims.append(Claim(_NECESSARY, f"with the circuit's {size} heads mean-ablated it is "
                        f"{f['complement_logit_diff']:+.2f}, {f['complement_share']:.0%} of {ld:.2f}" +
                        (": the rest does not keep most of it." if f["complement_share"] < MOST else
                         ": the rest keeps most of it, so the circuit is not needed."),
                        f["complement_share"] < MOST))
    return claims


_MOVERS = ("Name movers: a late head's direct path to the logits carries the logit difference, attending from the "
           "end to IO rather than S.")
_NEGATIVE = "Negative name movers: some head's direct path pushes against the answer."
_S_INHIBITION = ("S-inhibition: earlier heads reach the name mover's query, and corrupting that path alone lowers "
                 "the logit difference.")
S_INHIBITION_SHARE = 0.05   # a sender's path into the name mover's query carries this share of the logit difference


def _s_inhibition_claim(found: dict[str, Any] | None, ld: float) -> Claim:
    if found is None:
        return Claim(_S_INHIBITION, "there is no name mover past layer 0 whose query to trace, so nothing can be said.",
                     None)
    top = found["senders"][0] if found["senders"] else None
    if top is None or -top["effect"] < S_INHIBITION_SHARE * ld:
        return Claim(_S_INHIBITION, f"no earlier head's path into {found['receiver']}'s query lowers the logit "
                     f"difference by {S_INHIBITION_SHARE:.0%} of {ld:.2f} or more" +
                     (f" (the largest, {top['head']}, {-top['effect']:.2f})." if top else "."), False)
    return Claim(_S_INHIBITION, f"corrupting {top['head']}'s path into {found['receiver']}'s query lowers the logit "
                 f"difference by {-top['effect']:.2f} ({-top['effect'] / ld:.0%} of {ld:.2f}); next: " +
                 (", ".join(f"{s['head']} {s['effect']:+.2f}" for s in found["senders"][1:4]) or "none") + ".", True)


_FAITHFUL = "The circuit is faithful: with every head outside it mean-ablated, it keeps most of the logit difference."
_NECESSARY = "Its complement is not: with the circuit's heads ablated, the rest does not keep most of it."


def ioi_markdown(result: StudyResult) -> list[str]:
    n, s = result.numbers, result.setup
    lines = ["", f"Prompts ({len(s['prompts'])}, {s['length']} tokens each; one-token names: "
                 f"{len(s['one_token_names'])}, left out: {', '.join(s['names_left_out']) or 'none'}), e.g. "
                 f"\"{s['prompts'][0]}\" (corrupted: \"{s['corrupted'][0]}\").", "",
             f"Accuracy {n['accuracy']:.0%}, IO as the top prediction {n['top1_io']:.0%}, logit difference "
             f"{n['logit_diff']:+.2f} (" + ", ".join(f"{k} {v:+.2f}" for k, v in n["logit_diff_by_order"].items()) +
             f"; corrupted {n['corrupt_logit_diff']:+.2f}).", "",
             "### The heads found", "", "| head | role | direct path effect | total effect | attention IO / S1 / S2 |",
             "|---|---|---|---|---|"]
    direct = n["direct"]["values"]
    for h in n["circuit"]:
        l, i = parse_head(h)
        role = ("name mover" if h in n["name_movers"] else "negative name mover" if h in n["negative_name_movers"]
                else "large total effect")
        a = n["attention"][h]
        lines.append(f"| {h} | {role} | {direct[l][i] - n['direct']['clean_value']:+.3f} | {n['total_effect'][l][i]:+.3f} "
                     f"| {a['IO']:.2f} / {a['S1']:.2f} / {a['S2']:.2f} |")
    si = n.get("s_inhibition")
    if si:
        lines += ["", f"S-inhibition (path patching into {si['receiver']}'s query): " +
                  (", ".join(f"{x['head']} {x['effect']:+.3f}" for x in si["senders"]) or "no sender lowers it") + "."]
    lines += ["", "GPT-2 small's published circuit (Wang et al.): name movers 9.6, 9.9, 10.0; negative name movers "
                  "10.7, 11.10; S-inhibition 7.3, 7.9, 8.6, 8.10. This model's heads are its own: the table is what "
                  "it showed."]
    return lines


def ioi_figures(result: StudyResult) -> dict[str, "FigureSpec"]:
    from circuitlab.viz.parts import Heatmap, Panel, as_array
    from circuitlab.viz.figure import FigureSpec

    n = result.numbers
    clean = n["direct"]["clean_value"]
    direct = [[None if v is None else v - clean for v in row] for row in n["direct"]["values"]]
    panels = []
    for name, grid in (("direct path to the logits", direct), ("total effect", n["total_effect"])):
        z = as_array(grid)
        top = float(abs(z[z == z]).max()) if (z == z).any() else 1.0   # white at 0
        panels.append(Panel(heatmap=Heatmap(z, [f"H{h}" for h in range(len(grid[0]))],
                                            [f"L{l}" for l in range(len(grid))], -top, top, scale="RdBu",
                                            value_name="change in IO - S", value_format=".3f"),
                            x_title="head", y_title="layer", name=name))
    return {"head_effects": FigureSpec(panels, "Each head's effect on the IO - S logit difference when corrupted",
                                       layout="menu", height=min(900, 200 + 22 * len(direct)))}


def estimate_ioi(model: "Transformer", options: IOIOptions) -> memory.Estimate:
    """The clean, corrupted and cached runs; activation patching of every head's output (each patch runs from its
    layer on: half the model on average); the two ablated runs. Prompts of about 17 tokens."""
    from circuitlab.model.transformer import cache_estimate

    opts = options.check()
    T = 17
    est = cache_estimate(model, opts.prompts, T)
    heads = model.cfg.n_layers * model.cfg.n_heads
    runs = 8 + heads / 2 + heads   # patching every head's output; path patching into a name mover's query
    return memory.Estimate(f"ioi study (~{runs:.0f} runs of {opts.prompts} x {T} tokens)", est.parts,
                           held=memory.tensor_bytes(model), flops=runs * forward_flops(model, opts.prompts * T),
                           efficiency=0.45)


STUDY = Study("ioi", "Indirect-object identification", "Wang et al. 2022, Interpretability in the wild",
              IOIOptions, run_ioi, ioi_markdown, ioi_figures, estimate_ioi)
