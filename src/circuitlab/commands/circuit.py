"""circuitlab circuit: score every edge of a checkpoint's graph and find the circuit of a behaviour (its options:
experiments/circuit.CircuitOptions)."""
from __future__ import annotations

import argparse

HELP = "find a circuit: EAP, EAP-IG or exact edge patching on every edge, a pruned circuit, faithfulness"
EXAMPLE = ("circuitlab circuit --checkpoint runs/demo/2l --task induction --method eap-ig --out runs/demo/circuit   "
           "(--estimate: what the scoring will hold and take, then stop)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_memory_arguments
    from circuitlab.experiments.circuit import CircuitOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, CircuitOptions)   # every flag but --memory / --estimate, declared in experiments/circuit.py
    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.errors import CircuitlabError
    from circuitlab.experiments.circuit import (CircuitOptions, find_circuit, induction_rows, rows_from_texts,
                                                write_circuit_outputs)
    from circuitlab.textfile import read_lines
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_output_folder, default_out, output_folder

    # every option and the output folder before anything is read, run or moved
    opts = CircuitOptions.from_args(args)
    checkpoint = str(opts.checkpoint)
    out = Path(opts.out) if opts.out else default_out(checkpoint, "circuit")
    check_output_folder(out, "circuit", overwrite=opts.overwrite, is_previous=_is_circuit_output)
    model, tokenizer, _ = load_checkpoint(checkpoint)
    if opts.task == "induction":
        data = induction_rows(model.cfg.d_vocab, half=min(10, model.cfg.n_ctx // 2),
                              corruption=opts.corruption or "no-repeat")
    else:
        if tokenizer is None:
            raise CircuitlabError(f"{checkpoint} has no tokenizer saved with it, so prompt files cannot be read")
        assert opts.clean is not None and opts.corrupt is not None   # check(): files when there is no task
        answers = read_lines(opts.answers, "answer file") if opts.answers else None
        data = rows_from_texts(tokenizer, read_lines(opts.clean, "clean prompt file"),
                               read_lines(opts.corrupt, "corrupted prompt file"), answers)
    from circuitlab.analysis.edges.scoring import check_rows_fit, edge_estimate

    if args.estimate or opts.progress:   # what the scoring will hold and take, before the work
        check_rows_fit(model, data.clean)
        rows, pos = data.clean.shape
        print(edge_estimate(model, rows, pos, opts.method, opts.steps).timed().line(), flush=True)
        if args.estimate:
            return 0
    result = find_circuit(model, data, opts.metric, opts.method, edges=opts.edges, threshold=opts.threshold,
                          greedy=opts.greedy, refine=opts.refine or False, intervention=opts.intervention,
                          steps=opts.steps, progress=opts.progress)
    kept = output_folder(out, "circuit", overwrite=opts.overwrite, is_previous=_is_circuit_output)
    if kept:
        print(f"kept the earlier circuit as {kept}")
    write_circuit_outputs(result, out)
    print("\n".join(result.summary()))
    print(f"-> {out}/results.json, {out}/report.md, {out}/report.html, {out}/circuit.svg")
    return 0


def _is_circuit_output(folder) -> bool:
    """A circuit folder written before output folders were marked: results.json beside circuit.json."""
    return (folder / "results.json").is_file() and (folder / "circuit.json").is_file()
