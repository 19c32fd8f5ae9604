"""circuitlab export: a circuitlab model folder as a Hugging Face checkpoint folder."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = ("export a model to a Hugging Face folder transformers can load (LLaMA, GPT-2, GPT-NeoX, Qwen3, Gemma-2, "
        "Gemma-3, OLMo-2, GPT-J or Phi-3 style)")
EXAMPLE = "circuitlab export --checkpoint models/gpt2 --out exports/gpt2-hf   (models/gpt2 from `circuitlab import`)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True,
                   help="a circuitlab model folder (from `circuitlab import` or training) or a run folder")
    p.add_argument("--out", required=True, help="folder to write (config.json, model.safetensors, tokenizer files)")
    p.add_argument("--style", default=None, help="the Hugging Face model_type to write (default: the first that "
                   "holds the model; e.g. phi3 for a LLaMA-like model as Phi-3 with fused projections)")


def run(args: argparse.Namespace) -> int:
    from circuitlab.atomic import set_aside
    from circuitlab.pretrained import export_hf, export_style
    from circuitlab.training import load_checkpoint
    from circuitlab.training.outputs import check_writable

    check_writable(args.out, "the export")   # before the model is read
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    style = export_style(model.cfg, args.style)  # an unexportable model is refused before anything is moved
    kept = set_aside(Path(args.out), lambda p: (p / "config.json").is_file(), "export")
    out = export_hf(model, args.out, tokenizer, style=style)
    if kept:
        print(f"kept the previous export as {kept}")
    arch = json.loads((Path(out) / "config.json").read_text())["architectures"][0]
    print(f"wrote a {arch} folder to {out}/"
          f"{'' if tokenizer is not None else ' (no tokenizer: the checkpoint has none in Hugging Face form)'}")
    print(f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
