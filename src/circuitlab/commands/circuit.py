"""circuitlab circuit: score every edge of a checkpoint's graph and find the circuit of a behaviour."""
from __future__ import annotations

import argparse

HELP = "find a circuit: EAP, EAP-IG or exact edge patching on every edge, a pruned circuit, faithfulness"
EXAMPLE = ("circuitlab circuit --checkpoint runs/demo/2l --task induction --method eap-ig --out runs/demo/circuit   "
           "(--estimate: what the scoring will hold and take, then stop)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.analysis.edges.scoring import EAP_IG_STEPS
    from circuitlab.checks import COUNT, NONNEG

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--task", choices=["induction"], default=None,
                   help="built-in rows instead of files: induction = repeated random tokens")
    p.add_argument("--corruption", default=None,
                   help="for --task induction, the corrupted rows: no-repeat (default; other random tokens: the whole "
                        "circuit), first-copy (only the first copy replaced: the K-composition path) or "
                        "other-repeat (other tokens repeated: values and outputs only)")
    p.add_argument("--clean", default=None, help="file with one clean prompt per line")
    p.add_argument("--corrupt", default=None, help="file with one corrupted prompt per line (same token length)")
    p.add_argument("--answers", default=None,
                   help="file with one line per row: the answer token, or answer<TAB>wrong (default: the model's "
                        "own predictions on the clean / corrupted prompts)")
    p.add_argument("--metric", default="logit-diff", help="logit-diff | logprob | kl (default logit-diff)")
    p.add_argument("--method", default="eap-ig", help="eap | eap-ig | exact (default eap-ig)")
    p.add_argument("--intervention", default="counterfactual", help="counterfactual | zero | mean | position-mean")
    p.add_argument("--steps", type=EAP_IG_STEPS.arg, default=5,
                   help=f"EAP-IG path points (default 5, at most {EAP_IG_STEPS.high})")
    p.add_argument("--edges", type=COUNT.arg, default=None,
                   help="circuit size (default: the fewest top edges recovering 90%% of the gap)")
    p.add_argument("--threshold", type=NONNEG.arg, default=None, help="keep edges with |score| >= this instead")
    p.add_argument("--greedy", action="store_true", help="grow the circuit from the logits (with --edges)")
    p.add_argument("--refine", nargs="?", const="batched", default=None, metavar="batched|acdc",
                   help="then refine it with exact patching: batched per reader (the default when given), or acdc "
                        "(one edge at a time, each against the circuit left so far)")
    p.add_argument("--out", default=None,
                   help="output directory (default: <run>/circuit, or <checkpoint>-circuit beside a checkpoint "
                        "folder); an earlier circuit there is kept, renamed (or replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier circuit in --out instead of keeping it")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (and no estimate before the work)")
    from circuitlab.commands._args import add_memory_arguments

    add_memory_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from circuitlab.analysis.edges.discovery import check_circuit_options
    from circuitlab.errors import CircuitlabError
    from circuitlab.experiments.circuit import find_circuit, induction_rows, rows_from_texts, write_circuit_outputs
    from circuitlab.textfile import read_lines
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_output_folder, default_out, output_folder

    if args.task is None and not (args.clean and args.corrupt):
        raise CircuitlabError("give --clean and --corrupt prompt files, or a built-in --task (induction)")
    if args.task is not None and (args.clean or args.corrupt):
        raise CircuitlabError("--task and --clean/--corrupt are alternatives: give one of them")
    if args.corruption is not None and args.task is None:
        raise CircuitlabError("--corruption chooses the built-in task's corrupted rows; with prompt files, the "
                              "--corrupt file is the corruption")
    # every option and the output folder before anything is read, run or moved
    check_circuit_options(args.metric, args.method, args.intervention, args.refine or False)
    out = Path(args.out) if args.out else default_out(args.checkpoint, "circuit")
    check_output_folder(out, "circuit", overwrite=args.overwrite, is_previous=_is_circuit_output)
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    if args.task == "induction":
        data = induction_rows(model.cfg.d_vocab, half=min(10, model.cfg.n_ctx // 2),
                              corruption=args.corruption or "no-repeat")
    else:
        if tokenizer is None:
            raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it, so prompt files cannot be read")
        answers = read_lines(args.answers, "answer file") if args.answers else None
        data = rows_from_texts(tokenizer, read_lines(args.clean, "clean prompt file"),
                               read_lines(args.corrupt, "corrupted prompt file"), answers)
    from circuitlab.analysis.edges.scoring import check_rows_fit, edge_estimate

    if args.estimate or not args.no_progress:   # what the scoring will hold and take, before the work
        check_rows_fit(model, data.clean)
        rows, pos = data.clean.shape
        print(edge_estimate(model, rows, pos, args.method, args.steps).timed().line(), flush=True)
        if args.estimate:
            return 0
    result = find_circuit(model, data, args.metric, args.method, edges=args.edges, threshold=args.threshold,
                          greedy=args.greedy, refine=args.refine or False, intervention=args.intervention,
                          steps=args.steps, progress=not args.no_progress)
    kept = output_folder(out, "circuit", overwrite=args.overwrite, is_previous=_is_circuit_output)
    if kept:
        print(f"kept the earlier circuit as {kept}")
    write_circuit_outputs(result, out)
    print("\n".join(result.summary()))
    print(f"-> {out}/results.json, {out}/report.md, {out}/report.html, {out}/circuit.svg")
    return 0


def _is_circuit_output(folder) -> bool:
    """A circuit folder written before output folders were marked: results.json beside circuit.json."""
    return (folder / "results.json").is_file() and (folder / "circuit.json").is_file()
