"""Circuit discovery end to end: rows of (clean, corrupt, answer) prompts, a metric, scores, a circuit and its
faithfulness, in one call.

    data = induction_rows(model.cfg.d_vocab)                       # or rows_from_texts(tokenizer, clean, corrupt)
    result = find_circuit(model, data, metric="logit-diff", method="eap-ig")
    result.circuit.edge_list(); result.curve.summary(); result.summary()

Rows are (clean, corrupt, answer[, wrong]) prompts; the metric reads each row's last token. Rows of
different lengths are padded on the right (causal attention: padding never reaches earlier positions);
a row's clean and corrupted prompts must have the same length so that positions line up.
The drawing is viz.edges.circuit_svg(result.circuit); experiments.circuit writes the files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import torch

from circuitlab.checks import DEFAULT_SEED
from circuitlab.analysis.edges.circuit import Circuit, circuit_metric, refine_circuit, select_circuit
from circuitlab.analysis.edges.faithfulness import Faithfulness, faithfulness_curve
from circuitlab.analysis.edges.scoring import (DEFAULT_INTERVENTION, DEFAULT_METHOD, DEFAULT_STEPS, INTERVENTIONS,
                                               METHODS, EdgeScores, check_rows_fit, edge_scores)
from circuitlab.analysis.patching import Metric, kl_to_clean, logit_diff, logprob
from circuitlab.errors import CircuitlabError

if TYPE_CHECKING:
    from circuitlab.model import Transformer

METRICS = ("logit-diff", "logprob", "kl")
DEFAULT_METRIC: Final = "logit-diff"   # find_circuit's, and `circuitlab circuit`'s (CircuitOptions reads it)
REFINE = (False, True, "batched", "acdc")  # True = "batched"; "acdc": one edge at a time
TASKS = ("induction",)



@dataclass
class CircuitData:
    """Token rows: clean, corrupt [batch, pos] (right-padded), last [batch] (each row's last real position),
    answer [batch] and wrong [batch] token ids (None: taken from the model's own predictions)."""

    clean: torch.Tensor
    corrupt: torch.Tensor
    last: torch.Tensor
    answer: torch.Tensor | None = None
    wrong: torch.Tensor | None = None
    description: str = ""


INDUCTION_CORRUPTIONS = ("no-repeat", "first-copy", "other-repeat")


def induction_rows(d_vocab: int, batch: int = 16, half: int = 10, seed: int = DEFAULT_SEED,
                   corruption: str = "no-repeat"
                   ) -> CircuitData:
    """Repeated random tokens: clean [a, a]; the answer after the last token is a[0] (what induction predicts),
    the wrong one c[0]. What the corrupted rows change decides which paths the circuit needs:

    "no-repeat"     [c, d], nothing repeats: every path of induction differs (query, key through the
                    previous-token head, value, output) - the whole circuit.
    "first-copy"    [c, a], the first copy replaced: only what the keys learn from the earlier tokens
                    differs - the previous-token head and its K-composition into the induction heads.
    "other-repeat"  [c, c], other tokens repeated: the corrupted run attends exactly where the clean one
                    does, so a circuit of values and outputs alone is faithful (no K-composition needed).
    """
    if corruption not in INDUCTION_CORRUPTIONS:
        raise CircuitlabError(f"unknown corruption {corruption!r}; choose one of {', '.join(INDUCTION_CORRUPTIONS)}")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, d_vocab, (batch, half), generator=gen)
    c = torch.randint(0, d_vocab, (batch, half), generator=gen)
    d = torch.randint(0, d_vocab, (batch, half), generator=gen)
    second = {"no-repeat": d, "first-copy": a, "other-repeat": c}[corruption]
    last = torch.full((batch,), 2 * half - 1)
    return CircuitData(torch.cat([a, a], 1), torch.cat([c, second], 1), last, a[:, 0], c[:, 0],
                       f"induction: {batch} row{'' if batch == 1 else 's'} of {half} random tokens repeated (corrupted: {corruption})")


def rows_from_texts(tokenizer, clean: list[str], corrupt: list[str], answers: list[str] | None = None
                    ) -> CircuitData:
    """Prompts (one per row) tokenized; answers: per row "answer" or "answer<TAB>wrong" (each one token)."""
    if not clean:
        raise CircuitlabError("no clean prompts given (the file is empty)")
    if len(clean) != len(corrupt):
        raise CircuitlabError(f"{len(clean)} clean prompts but {len(corrupt)} corrupted ones: give one per row")
    enc_clean, enc_corrupt = tokenizer.encode_batch(list(clean)), tokenizer.encode_batch(list(corrupt))
    for i, (a, b) in enumerate(zip(enc_clean, enc_corrupt)):
        if len(a) != len(b) or not a:
            raise CircuitlabError(f"row {i + 1}: the clean prompt has {len(a)} tokens and the corrupted one {len(b)}; "
                                  "they must have the same token length so positions line up (reword one)")
    width = max(len(a) for a in enc_clean)
    pad = lambda rows: torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows])  # noqa: E731
    last = torch.tensor([len(a) - 1 for a in enc_clean])
    answer = wrong = None
    if answers is not None:
        if len(answers) != len(clean):
            raise CircuitlabError(f"{len(answers)} answers for {len(clean)} rows: give one line per row")
        parsed = [[_one_token(tokenizer, t, i) for t in line.split("\t")] for i, line in enumerate(answers)]
        answer = torch.tensor([p[0] for p in parsed])
        if all(len(p) > 1 for p in parsed):
            wrong = torch.tensor([p[1] for p in parsed])
    return CircuitData(pad(enc_clean), pad(enc_corrupt), last, answer, wrong, f"{len(clean)} prompt pair{'' if len(clean) == 1 else 's'}")


def _one_token(tokenizer, text: str, row: int) -> int:
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        raise CircuitlabError(f"answer {text!r} on row {row + 1} is {len(ids)} tokens; an answer must be one token")
    return ids[0]


def make_metric(name: str, model: Transformer, data: CircuitData) -> Metric:
    """logit-diff (answer − wrong), logprob (of the answer) or kl (to the clean output) at each row's last
    token. Missing answers: the clean run's top prediction; missing wrong ones: the corrupted run's."""
    if name not in METRICS:
        raise CircuitlabError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)} (or pass any function "
                              "of the logits to edge_scores from Python)")
    rows = torch.arange(len(data.last))
    with torch.no_grad():
        clean_logits = model(data.clean)
    if name == "kl":
        return kl_to_clean(clean_logits, pos=data.last)
    answer = data.answer if data.answer is not None else clean_logits[rows, data.last].argmax(-1)
    if name == "logprob":
        return logprob(answer, pos=data.last)
    if data.wrong is not None:
        wrong = data.wrong
    else:
        with torch.no_grad():
            wrong = model(data.corrupt)[rows, data.last].argmax(-1)
    if bool((wrong == answer).all()):
        raise CircuitlabError("the corrupted prompts lead to the same answers as the clean ones, so the logit "
                              "difference is zero; give answers (answer<TAB>wrong per row) or use --metric kl")
    return logit_diff(answer, wrong, pos=data.last)


@dataclass
class CircuitResult:
    """Scores, the chosen circuit, its faithfulness, and the curve over circuit sizes."""

    scores: EdgeScores
    circuit: Circuit
    circuit_value: float
    curve: Faithfulness
    data: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def circuit_faithfulness(self) -> float:
        return (self.circuit_value - self.curve.empty_value) / (self.curve.full_value - self.curve.empty_value)

    def summary(self) -> list[str]:
        s, c = self.scores, self.circuit
        return [f"Graph: {s.graph.summary()}.",
                f"Scores: {s.method} ({s.intervention}), metric {s.metric}: {s.clean_value:.4g} on the clean prompts, "
                f"{s.ablated_value:.4g} with every edge patched; {s.seconds:.2f} s.",
                f"Circuit ({c.how}): {c.n_edges} of {s.graph.n_edges} edges ({100 * c.n_edges / s.graph.n_edges:.3g}%), "
                f"nodes {', '.join(c.nodes())}; faithfulness {self.circuit_faithfulness:.3f}.",
                f"Faithfulness curve: {self.curve.summary()}."]

    def to_dict(self) -> dict[str, Any]:
        return {"data": self.data, "summary": self.summary(), "scores": self.scores.to_dict(),
                "circuit": self.circuit.to_dict(), "circuit_value": round(self.circuit_value, 6),
                "circuit_faithfulness": round(self.circuit_faithfulness, 6), "faithfulness": self.curve.to_dict(),
                **self.extra}

    def _repr_html_(self) -> str:  # the drawing: viz.edges.circuit_svg(result.circuit)
        items = "".join(f"<li>{line}</li>" for line in self.summary())
        return f"<ul>{items}</ul>{self.circuit._repr_html_()}"

    def markdown(self) -> str:
        lines = ["# circuitlab circuit", "", self.data, "", *[f"- {s}" for s in self.summary()], "",
                 "![circuit](circuit.svg)", "", "## Circuit edges", "", "| from | to | score |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {v:+.4g} |" for a, b, v in self.circuit.to_dict()["edges"]]
        lines += ["", "## Faithfulness", "", "| edges kept | n | f |", "|---|---|---|"]
        lines += [f"| {100 * x:g}% | {n} | {float(f):.3f} |"
                  for x, n, f in zip(self.curve.fractions, self.curve.n_edges, self.curve.faithfulness)]
        lines += ["", "## Top edges by |score|", "", "| from | to | score |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {v:+.4g} |" for a, b, v in self.scores.top(20)]
        return "\n".join(lines) + "\n"


def check_circuit_options(metric: str | Metric, method: str, intervention: str, refine: bool | str) -> None:
    """Refuse an unknown metric, method, intervention or refinement by name, before any work (and before a
    command touches its output folder)."""
    if isinstance(metric, str) and metric not in METRICS:
        raise CircuitlabError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)} (or pass any function "
                              "of the logits to edge_scores from Python)")
    if method not in METHODS:
        raise CircuitlabError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if intervention not in INTERVENTIONS:
        raise CircuitlabError(f"unknown intervention {intervention!r}; choose one of {', '.join(INTERVENTIONS)}")
    if refine not in REFINE:
        raise CircuitlabError(f"unknown refinement {refine!r}; choose batched or acdc")


def find_circuit(model: Transformer, data: CircuitData, metric: str | Metric = DEFAULT_METRIC,
                 method: str = DEFAULT_METHOD, *, edges: int | None = None, threshold: float | None = None,
                 greedy: bool = False, refine: bool | str = False, intervention: str = DEFAULT_INTERVENTION,
                 steps: int = DEFAULT_STEPS, progress: bool = True) -> CircuitResult:
    """Score every edge, choose a circuit (edges / threshold; default: the fewest top edges recovering 90% of
    the gap), optionally refine it with exact patching (refine: True or "batched", or "acdc": one edge at a
    time; see refine_circuit), and measure its faithfulness."""
    check_circuit_options(metric, method, intervention, refine)
    check_rows_fit(model, data.clean)  # before any run over all rows (the metric's own reads them)
    fn = make_metric(metric, model, data) if isinstance(metric, str) else metric
    corrupt = data.corrupt if intervention == "counterfactual" else None
    scores = edge_scores(model, data.clean, corrupt, fn, method=method, intervention=intervention, steps=steps,
                         progress=progress)
    curve = faithfulness_curve(model, data.clean, corrupt, fn, scores)
    if edges is None and threshold is None:
        edges = curve.size_for.get(0.9) or scores.graph.n_edges
    circuit = select_circuit(scores, n=edges, threshold=threshold, greedy=greedy)
    if refine:
        circuit = refine_circuit(model, data.clean, corrupt, fn, circuit, intervention=intervention,
                                 sequential=refine == "acdc")
    value = float(circuit_metric(model, data.clean, corrupt, fn, [circuit.edges], intervention=intervention)[0])
    return CircuitResult(scores, circuit, value, curve, data.description)


__all__ = ["CircuitData", "CircuitResult", "INDUCTION_CORRUPTIONS", "METRICS", "TASKS", "check_circuit_options",
           "find_circuit", "induction_rows", "make_metric", "rows_from_texts"]
