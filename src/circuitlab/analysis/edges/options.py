"""What circuit discovery takes, declared once (circuitlab.spec): DiscoveryOptions, the metric, scoring method,
intervention, EAP-IG steps and how the circuit is chosen. `circuitlab circuit`'s options (experiments/circuit.py:
CircuitOptions) hold these fields as declared here (spec.same), and the explorer's discovery request
(serve/circuits.py: RunRequest) is generated from them.

    DiscoveryOptions(method="eap", steps=3).check()
"""
from __future__ import annotations

from dataclasses import dataclass

from circuitlab.analysis.edges.discovery import DEFAULT_METRIC, METRICS
from circuitlab.analysis.edges.scoring import DEFAULT_INTERVENTION, DEFAULT_METHOD, DEFAULT_STEPS, EAP_IG_STEPS, \
    INTERVENTIONS, METHODS
from circuitlab.checks import COUNT, NONNEG
from circuitlab.spec import Options, option


@dataclass(frozen=True)
class DiscoveryOptions(Options):
    """How a circuit is found on the rows: metric, scoring method and intervention (their names are checked by
    discovery.check_circuit_options, in its words), EAP-IG steps, and the circuit's size, threshold, growth and
    refinement."""

    metric: str = option(DEFAULT_METRIC, help=f"{' | '.join(METRICS)} (default {{default}})")
    method: str = option(DEFAULT_METHOD, help=f"{' | '.join(METHODS)} (default {{default}})")
    intervention: str = option(DEFAULT_INTERVENTION, help=" | ".join(INTERVENTIONS))
    steps: int = option(DEFAULT_STEPS, EAP_IG_STEPS,
                        help=f"EAP-IG path points (default {{default}}, at most {EAP_IG_STEPS.high})")
    edges: int | None = option(None, COUNT, help="circuit size (default: the fewest top edges recovering 90%% of the "
                                                 "gap)")   # %%: argparse's help is a format string
    threshold: float | None = option(None, NONNEG, help="keep edges with |score| >= this instead")
    greedy: bool = option(False, help="grow the circuit from the logits (with --edges)")
    refine: str | None = option(None, nargs="?", const="batched", metavar="batched|acdc",
                                help="then refine it with exact patching: batched per reader (the default when "
                                     "given), or acdc (one edge at a time, each against the circuit left so far)")
