"""circuitlab export: a circuitlab model folder as a Hugging Face checkpoint folder."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = ("export a model to a Hugging Face folder transformers can load (LLaMA, GPT-2, GPT-NeoX, Qwen3, Gemma-2, "
        "Gemma-3, OLMo-2, GPT-J or Phi-3 style)")
EXAMPLE = "circuitlab export --checkpoint models/gpt2 --out exports/gpt2-hf   (models/gpt2 from `circuitlab import`)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.pretrained.export import HfExportOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, HfExportOptions)   # every flag, declared once beside export_hf (pretrained/export.py)


def run(args: argparse.Namespace) -> int:
    from circuitlab.atomic import set_aside
    from circuitlab.pretrained import export_hf, export_style
    from circuitlab.pretrained.export import HfExportOptions
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_writable

    opts = HfExportOptions.from_args(args)
    check_writable(opts.out, "the export")   # before the model is read
    model, tokenizer, _ = load_checkpoint(opts.checkpoint)
    style = export_style(model.cfg, opts.style)  # an unexportable model is refused before anything is moved
    kept = set_aside(Path(opts.out), lambda p: (p / "config.json").is_file(), "export")
    out = export_hf(model, opts.out, tokenizer, style=style)
    if kept:
        print(f"kept the previous export as {kept}")
    arch = json.loads((Path(out) / "config.json").read_text())["architectures"][0]
    print(f"wrote a {arch} folder to {out}/"
          f"{'' if tokenizer is not None else ' (no tokenizer: the checkpoint has none in Hugging Face form)'}")
    print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
