"""The induction circuit in a labelled model: which head reads and which previous-token head it reads from."""
from __future__ import annotations

from circuitlab.analysis.heads import HeadClasses


def induction_and_previous_head(classes: HeadClasses) -> tuple[tuple[int, int], tuple[int, int]]:
    """The labelled (or, failing that, best-scoring) induction head and the previous-token head in an
    earlier layer that K-composes with it most. Needs two layers or more."""
    comp = classes.composition
    assert comp is not None, "the induction circuit needs the heads' K-composition scores"
    induction = classes.scores["induction"].clone()
    induction[0] = float("-inf")  # layer 0 cannot compose with anything
    labelled = classes.heads_with("induction")
    head: tuple[int, int] = labelled[0] if labelled else divmod(int(induction.argmax()), induction.shape[1])
    prev = classes.scores["previous_token"][: head[0]]
    k_comp = comp.k[: head[0], :, head[0], head[1]]
    # Prefer heads that both behave as previous-token heads and compose with the reader.
    best = (prev * k_comp).flatten().argmax()
    return head, divmod(int(best), prev.shape[1])
