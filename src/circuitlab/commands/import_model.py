"""circuitlab import: a Hugging Face checkpoint (local folder or hub name) into a circuitlab model folder."""
from __future__ import annotations

import argparse
from pathlib import Path

from circuitlab.pretrained.catalog import SUPPORTED

NAME = "import"
HELP = f"import a Hugging Face checkpoint of any family the catalogue reads: {SUPPORTED}"
EXAMPLE = "circuitlab import gpt2 --out models/gpt2"

_DTYPES = ("float32", "bfloat16", "float16")  # storage dtypes of the written model.safetensors


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import positive_int

    p.add_argument("source", metavar="NAME_OR_PATH",
                   help="a local Hugging Face checkpoint folder, or a hub name (local cache first, then the network)")
    p.add_argument("--out", required=True, help="folder to write (model.safetensors, config.json, tokenizer/)")
    p.add_argument("--dtype", choices=_DTYPES, default="float32",
                   help="storage dtype of the written weights (default float32); bfloat16 halves the file and the "
                        "memory of every command that loads it, which still computes in float32 on a CPU "
                        "(--compute-dtype there)")
    p.add_argument("--n-ctx", type=positive_int, default=None, help="keep a shorter context than the checkpoint's")
    p.add_argument("--no-tokenizer", action="store_true", help="do not import the tokenizer")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    p.add_argument("--cache-dir", default=None, help="Hugging Face cache folder (default: the usual one)")


def run(args: argparse.Namespace) -> int:
    import torch

    from circuitlab.atomic import set_aside
    from circuitlab.errors import InputError
    from circuitlab.pretrained import load_pretrained
    from circuitlab.training.checkpoint import is_checkpoint, save_checkpoint
    from circuitlab.training.outputs import check_writable

    check_writable(args.out, "the model")   # before anything is downloaded or read
    model, tokenizer = load_pretrained(args.source, dtype=getattr(torch, args.dtype), n_ctx=args.n_ctx,
                                       tokenizer=not args.no_tokenizer, cache_dir=args.cache_dir,
                                       revision=args.revision)
    cfg = model.cfg
    source = {"name_or_path": str(args.source), "revision": args.revision, "dtype": args.dtype}
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", 0) is None:  # checked before anything moves
        raise InputError(f"the tokenizer of {args.source} has no end-of-text (EOS) token, which circuitlab needs to "
                         "separate documents; import the weights alone with --no-tokenizer (generate and interpret "
                         "need a tokenizer), or give the checkpoint's tokenizer an eos_token")
    kept = set_aside(Path(args.out), is_checkpoint, "model")
    if kept:
        print(f"kept the previous model as {kept}")
    out = save_checkpoint(args.out, model, tokenizer, extra={"source": source})
    print(f"imported {args.source}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads"
          f"{f' ({cfg.kv_heads} kv)' if cfg.kv_heads != cfg.n_heads else ''}, "
          f"{model.num_params():,} parameters, {args.dtype}")
    print(f"wrote {out}/ (model.safetensors, config.json{', tokenizer/' if tokenizer is not None else ''})")
    if tokenizer is None and not args.no_tokenizer:
        print("note: the checkpoint has no tokenizer; `generate` and `interpret` need one")
    return 0
