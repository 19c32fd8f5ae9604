"""What `circuitlab import` takes, declared once: ImportOptions (its flags, and load_pretrained's and load_gguf's
keyword defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from circuitlab.checks import COUNT
from circuitlab.spec import Options, option

IMPORT_DTYPES = ("float32", "bfloat16", "float16")  # storage dtypes of the written model.safetensors


@dataclass(frozen=True)
class ImportOptions(Options):
    """What `circuitlab import` takes, declared once (circuitlab.spec): each flag's default, rule and help (its
    flags are these fields, in this order); load_pretrained's keyword defaults read it."""

    source: str | Path = option(None, required=True, flag="source", metavar="NAME_OR_PATH",
                                help="a local Hugging Face checkpoint folder, a .gguf file, a built-in model "
                                     "(smollm2-135m-instruct), or a hub name (local cache first, then the network)")
    out: str | Path = option(None, required=True, help="folder to write (model.safetensors, config.json, tokenizer/)")
    dtype: str = option("float32", choices=IMPORT_DTYPES,
                        help="storage dtype of the written weights (default {default}); bfloat16 halves the file and "
                             "the memory of every command that loads it, which still computes in float32 on a CPU "
                             "(--compute-dtype there)")
    n_ctx: int | None = option(None, COUNT, help="keep a shorter context than the checkpoint's")
    tokenizer: bool = option(True, flag="--no-tokenizer", help="do not import the tokenizer")
    revision: str | None = option(None, help="hub revision (branch, tag or commit)")
    cache_dir: str | Path | None = option(None, help="Hugging Face cache folder (default: the usual one)")
