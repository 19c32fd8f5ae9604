"""Automatic circuit discovery on the edge graph: scores for every edge, circuits, faithfulness.

graph         EdgeGraph: writers (input, heads, MLPs), reader inputs (q/k/v per head, MLP in, logits), edges
forward       graph_forward: the model's forward pass with a patch weight on every edge, batched over copies
scoring       edge_scores: EAP, EAP-IG (inputs or edges path), exact batched edge patching; interventions
circuit       select_circuit (top-n, threshold, greedy; pruned), refine_circuit (ACDC-style), circuit_metric,
              edge_auc against a known edge set
faithfulness  faithfulness_curve: f at 0.1 ... 100 % of the edges, CPR, CMD, sizes for 80 / 90 %
io            JSON save/load of scores and circuits, and the MIB / EAP-IG edge-score layout
discovery     find_circuit: prompt rows (induction_rows, rows_from_texts) + metric -> scores, circuit, curve
"""
from circuitlab.analysis.edges.circuit import Circuit, circuit_metric, edge_auc, prune, refine_circuit, select_circuit
from circuitlab.analysis.edges.discovery import CircuitData, CircuitResult, find_circuit, induction_rows
from circuitlab.analysis.edges.faithfulness import FRACTIONS, Faithfulness, faithfulness_curve
from circuitlab.analysis.edges.forward import EdgeRun, graph_forward
from circuitlab.analysis.edges.edge_graph import EdgeGraph
from circuitlab.analysis.edges.scoring import INTERVENTIONS, METHODS, EdgeScores, edge_scores

__all__ = ["Circuit", "CircuitData", "CircuitResult", "EdgeGraph", "EdgeScores", "FRACTIONS", "Faithfulness",
           "EdgeRun", "INTERVENTIONS", "METHODS", "circuit_metric", "edge_auc", "edge_scores", "faithfulness_curve",
           "find_circuit", "graph_forward", "induction_rows", "prune", "refine_circuit", "select_circuit"]
