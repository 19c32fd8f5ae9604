"""circuitlab info: versions, devices, model presets, a preset's hook names, and a model folder's config and source."""
from __future__ import annotations

import argparse
import platform

HELP = "show versions, devices and model presets (or one preset's config and hooks, or a model folder's source)"
EXAMPLE = "circuitlab info --preset attn-only-2l --hooks   (or: circuitlab info --checkpoint models/smollm2)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="show this preset's config and parameter counts")
    p.add_argument("--hooks", action="store_true", help="with --preset: list its hook names and shapes")
    p.add_argument("--checkpoint", help="show this model folder's config and where it came from (an imported "
                                        "GGUF file: its path, name and quantization types)")


def run(args: argparse.Namespace) -> int:
    import torch

    from circuitlab import ModelConfig, Transformer, __version__, presets

    if args.checkpoint:
        _show_checkpoint(args.checkpoint)
        return 0
    if args.preset:
        cfg = ModelConfig.from_preset(args.preset)
        with torch.device("meta"):  # no memory for the weights: we only count them
            model = Transformer(cfg)
        print(cfg.to_yaml().rstrip())
        print(f"parameters: {model.num_params(False):,} without embeddings, {model.num_params(True):,} with")
        if args.hooks:
            small = Transformer(cfg.replace(n_ctx=min(cfg.n_ctx, 8), d_vocab=min(cfg.d_vocab, 64))) \
                if cfg.d_model <= 512 else None
            if small is None:
                print("\n".join(model.hook_names()))
            else:
                _, cache = small.run_with_cache(torch.zeros(1, 4, dtype=torch.long))
                for name in small.hook_names():
                    shape = tuple(cache[name].shape) if name in cache else "(not computed)"
                    print(f"{name:45s} {shape}")
        return 0
    print(f"circuitlab {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    devices = ["cpu"] + [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    print(f"devices: {', '.join(devices)}   cpu threads: {torch.get_num_threads()}")
    print("model presets (parameters without / with embeddings):")
    for name, fields in presets().items():
        with torch.device("meta"):
            model = Transformer(ModelConfig.from_preset(name))
        print(f"  {name:14s} {model.num_params(False):>12,} {model.num_params(True):>12,}  "
              f"layers={fields['n_layers']} d_model={fields['d_model']} heads={fields['n_heads']}")
    return 0


def _show_checkpoint(path: str) -> None:
    """A model folder's config and source, read from its config.json alone (no weights loaded)."""
    from circuitlab.config import ModelConfig
    from circuitlab.training.checkpoint import find_checkpoint, read_checkpoint_meta

    meta = read_checkpoint_meta(path)
    cfg = ModelConfig.from_dict(meta["model"])
    print(f"{find_checkpoint(path)}: {cfg.name or 'unnamed'}, {cfg.n_layers} layers, d_model {cfg.d_model}, "
          f"{cfg.n_heads} heads ({cfg.kv_heads} kv), d_vocab {cfg.d_vocab}, n_ctx {cfg.n_ctx}")
    source = meta.get("source") or {}
    if source:
        stored = source.get("dtype") or "the file's own dtype"  # older folders did not record it
        print(f"imported from {source.get('name_or_path')} (stored as {stored})")
    gguf = source.get("gguf")
    if gguf:
        quant = ", ".join(f"{kind} x{count}" for kind, count in gguf["quantization"].items())
        print(f"GGUF file: {gguf['file']}\nGGUF name: {gguf['name'] or '(none)'}   architecture: "
              f"{gguf['architecture']}\nquantization (tensors per type): {quant}; the weights are the dequantized "
              "values")
