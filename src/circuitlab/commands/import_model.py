"""circuitlab import: a Hugging Face checkpoint (local folder or hub name), a GGUF file or a built-in real model
into a circuitlab model folder."""
from __future__ import annotations

import argparse
from pathlib import Path

from circuitlab.pretrained.catalog import SUPPORTED

NAME = "import"
HELP = (f"import a Hugging Face checkpoint or a GGUF file of any family the catalogue reads ({SUPPORTED}), or the "
        "built-in real model smollm2-135m-instruct")
EXAMPLE = "circuitlab import smollm2-135m-instruct --out models/smollm2   (or FILE.gguf, a folder, a hub name)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.pretrained.importer import ImportOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, ImportOptions)   # every flag, declared once beside load_pretrained (pretrained/importer.py)


def run(args: argparse.Namespace) -> int:
    import torch

    from circuitlab.atomic import check_set_aside, set_aside
    from circuitlab.errors import InputError
    from circuitlab.pretrained import load_pretrained
    from circuitlab.pretrained.gguf import load_gguf
    from circuitlab.pretrained.importer import ImportOptions, gguf_source
    from circuitlab.training.checkpoint import is_checkpoint, save_checkpoint
    from circuitlab.training.outputs import check_writable

    opts = ImportOptions.from_args(args)
    check_writable(opts.out, "the model")   # before anything is downloaded or read
    check_set_aside(Path(opts.out), is_checkpoint, "model")
    source: dict = {"name_or_path": str(opts.source), "revision": opts.revision, "dtype": opts.dtype}
    gguf = gguf_source(opts.source)
    if gguf is not None:
        if opts.revision or opts.cache_dir:
            raise InputError("--revision and --cache-dir are for hub names; a GGUF file is read as it is")
        model, tokenizer, info = load_gguf(gguf[0], getattr(torch, opts.dtype), n_ctx=opts.n_ctx,
                                           tokenizer=opts.tokenizer, name=gguf[1])
        source["gguf"] = info.to_dict()
    else:
        model, tokenizer = load_pretrained(opts.source, dtype=getattr(torch, opts.dtype), n_ctx=opts.n_ctx,
                                           tokenizer=opts.tokenizer, cache_dir=opts.cache_dir,
                                           revision=opts.revision)
    cfg = model.cfg
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", 0) is None:  # checked before anything moves
        raise InputError(f"the tokenizer of {opts.source} has no end-of-text (EOS) token, which circuitlab needs to "
                         "separate documents; import the weights alone with --no-tokenizer (generate and interpret "
                         "need a tokenizer), or give the checkpoint's tokenizer an eos_token")
    kept = set_aside(Path(opts.out), is_checkpoint, "model")
    if kept:
        print(f"kept the previous model as {kept}")
    out = save_checkpoint(opts.out, model, tokenizer, extra={"source": source})
    if "gguf" in source:
        quant = ", ".join(f"{k} x{v}" for k, v in source["gguf"]["quantization"].items())
        print(f"GGUF {source['gguf']['file']} ({source['gguf']['name'] or 'unnamed'}; tensors {quant}), "
              "dequantized")
    print(f"imported {opts.source}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads"
          f"{f' ({cfg.kv_heads} kv)' if cfg.kv_heads != cfg.n_heads else ''}, "
          f"{model.num_params():,} parameters, {opts.dtype}")
    print(f"wrote {out}/ (model.safetensors, config.json{', tokenizer/' if tokenizer is not None else ''})")
    if tokenizer is None and opts.tokenizer:
        print("note: the checkpoint has no tokenizer; `generate` and `interpret` need one")
    return 0
