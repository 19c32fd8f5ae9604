#!/usr/bin/env python
"""Memory benchmark: peak resident memory of importing a Hugging Face checkpoint, vs its size.

Builds a random HF model of about --size-gb (fp32; --family llama (default), gemma2, gemma3,
qwen3, olmo2, phi3, gptj or all; grouped-query attention where the family has it, untied
unembedding), saves it with save_pretrained (sharded safetensors), then imports it in a fresh
subprocess with circuitlab.pretrained.load_pretrained and reads the peak resident set size
(resource.getrusage ru_maxrss; /proc VmHWM alongside as a cross-check).

Target: what the import adds to the process's peak (growth, below) at most 1.5x the checkpoint's
size; the whole process's peak is printed too. Printed for each loader:
- import peak: the whole process (Python, torch and all) at the end of the import, / checkpoint;
- growth: that peak minus the resident size just before the import (torch imported and warmed
  up, the floor of any process that runs a model), / checkpoint: what the import itself costs;
- after one forward pass, which touches every weight: a loader that memory-maps the file lazily
  (transformers does) only pays for its weights here.

Both the build and the imports run in subprocesses and this parent never imports torch: on
Linux a child's ru_maxrss starts from its parent's peak at fork time, so a fat parent would
inflate the figures.

    .venv/bin/python benchmarks/bench_import_memory.py                     # ~0.5 GB, ~30 s on 2 cores
    .venv/bin/python benchmarks/bench_import_memory.py --size-gb 1 --compare-hf --json mem.json
    .venv/bin/python benchmarks/bench_import_memory.py --family all --size-gb 0.3
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run in a fresh interpreter ({imports} and {loader} filled in); prints one JSON line.
CHILD = r"""
import json, resource, time
import torch
{imports}

def rss_mb():
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:")][0]

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux

# Warm torch's runtime up (thread pools, kernels: ~20 MB that any process running a model pays).
x = torch.ones(1, 2, 8, 4)
torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
torch.nn.functional.layer_norm(torch.nn.Linear(4, 4)(x), (4,))
torch.nn.functional.rms_norm(torch.nn.Embedding(4, 4)(torch.zeros(1, 8, dtype=torch.long)), (4,))
before = rss_mb()
start = time.perf_counter()
{loader}
seconds = time.perf_counter() - start
peak_import = peak_mb()
with torch.no_grad():
    model(torch.zeros(1, 8, dtype=torch.long))
with open("/proc/self/status") as f:
    vmhwm = [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")][0]
print(json.dumps({{"before_mb": before, "import_peak_mb": peak_import, "forward_peak_mb": peak_mb(),
                   "vmhwm_mb": vmhwm, "seconds": seconds,
                   "n_params": sum(p.numel() for p in model.parameters())}}))
"""

LOADERS = {
    "circuitlab": ("from circuitlab.pretrained import load_pretrained",
                   "model, _ = load_pretrained({folder!r}, tokenizer=False)"),
    "transformers": ("from transformers import AutoModelForCausalLM",
                     "model = AutoModelForCausalLM.from_pretrained({folder!r}, dtype=torch.float32)"),
}


FAMILIES = ("llama", "gemma2", "gemma3", "qwen3", "olmo2", "phi3", "gptj")


def family_config(family: str, size_gb: float):
    """A random-checkpoint config of `family` whose fp32 weights take about size_gb (d_model 1024,
    grouped-query attention where the family has it)."""
    import transformers

    d_model, d_mlp, vocab, kv_dim = 1024, 2816, 32000, 256  # 8 heads of 128, 2 kv heads
    per_layer = d_model * (2 * d_model + 2 * kv_dim) + 3 * d_model * d_mlp + 2 * d_model
    embeddings = 2 * vocab * d_model + d_model
    n_layers = max(1, round((size_gb * 1e9 / 4 - embeddings) / per_layer))
    if family == "gptj":  # plain multi-head attention, a non-gated MLP of 4 d_model
        per_layer = 4 * d_model * d_model + 8 * d_model * d_model
        n_layers = max(1, round((size_gb * 1e9 / 4 - embeddings) / per_layer))
        return transformers.GPTJConfig(n_embd=d_model, n_layer=n_layers, n_head=8, rotary_dim=32, vocab_size=vocab,
                                       n_positions=2048)
    common = dict(hidden_size=d_model, intermediate_size=d_mlp, num_hidden_layers=n_layers, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=2048, tie_word_embeddings=False)
    cls = {"llama": "LlamaConfig", "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig", "qwen3": "Qwen3Config",
           "olmo2": "Olmo2Config", "phi3": "Phi3Config"}[family]
    extra = {"head_dim": 128} if family in ("gemma2", "gemma3", "qwen3") else {}
    extra |= {"pad_token_id": 0} if family == "phi3" else {}
    return getattr(transformers, cls)(**common, **extra)


def build_checkpoint(folder: Path, size_gb: float, family: str = "llama") -> None:
    """Save a random model of `family` into folder (runs in a subprocess, see run_build)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(family_config(family, size_gb))
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(folder, max_shard_size="200MB")


def run_build(folder: Path, size_gb: float, family: str = "llama") -> int:
    """Build the checkpoint in a subprocess; returns the weight files' total bytes."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import bench_import_memory as b; from pathlib import Path; "
            f"b.build_checkpoint(Path({str(folder)!r}), {size_gb!r}, {family!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"building the checkpoint failed:\n{proc.stderr}")
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def measure(loader: str, folder: Path, size: int) -> dict:
    imports, load = LOADERS[loader]
    code = CHILD.format(imports=imports, loader=load.format(folder=str(folder)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{loader} import failed:\n{proc.stderr}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = size / 2**20
    r["import_peak_ratio"] = r["import_peak_mb"] / mib
    r["import_growth_ratio"] = (r["import_peak_mb"] - r["before_mb"]) / mib
    r["forward_peak_ratio"] = r["forward_peak_mb"] / mib
    return r


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=0.5, help="checkpoint size to build (fp32)")
    parser.add_argument("--family", choices=FAMILIES + ("all",), default="llama",
                        help="the architecture of the random checkpoint (all: each in turn)")
    parser.add_argument("--folder", type=Path, default=None, help="keep the checkpoint here (default: a temp dir)")
    parser.add_argument("--compare-hf", action="store_true", help="also measure transformers' from_pretrained")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    families = FAMILIES if args.family == "all" else (args.family,)
    results, ok = {}, True
    for family in families:
        results[family] = one_family(family, args)
        ok = ok and results[family]["circuitlab"]["import_growth_ratio"] <= 1.5
    if args.json:
        args.json.write_text(json.dumps(results if len(families) > 1 else results[families[0]], indent=2))
    return 0 if ok else 1


def one_family(family: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / family
        start = time.perf_counter()
        size = run_build(folder, args.size_gb, family)
        shards = len(list(folder.glob("*.safetensors")))
        print(f"{family} checkpoint: {size / 2**20:.0f} MiB in {shards} safetensors shards "
              f"({time.perf_counter() - start:.0f} s to build)")
        results = {"checkpoint_mib": size / 2**20, "shards": shards}
        for loader in ["circuitlab"] + (["transformers"] if args.compare_hf else []):
            r = results[loader] = measure(loader, folder, size)
            print(f"{loader:>12}: import peak {r['import_peak_mb']:.0f} MiB = {r['import_peak_ratio']:.2f}x the "
                  f"checkpoint, growth {r['import_peak_mb'] - r['before_mb']:.0f} MiB = "
                  f"{r['import_growth_ratio']:.2f}x (over {r['before_mb']:.0f} MiB of warmed-up Python + torch); "
                  f"after one forward pass {r['forward_peak_mb']:.0f} MiB = {r['forward_peak_ratio']:.2f}x "
                  f"(VmHWM {r['vmhwm_mb']:.0f}); {r['n_params'] / 1e6:.1f}M parameters in {r['seconds']:.1f} s")
    ours = results["circuitlab"]
    ok = ours["import_growth_ratio"] <= 1.5
    print(f"target: the import's added peak memory <= 1.5x the checkpoint: {'met' if ok else 'NOT met'} "
          f"({ours['import_growth_ratio']:.2f}x growth; {ours['import_peak_ratio']:.2f}x with the interpreter's "
          f"own {ours['before_mb']:.0f} MiB)")
    return results


if __name__ == "__main__":
    sys.exit(main())
