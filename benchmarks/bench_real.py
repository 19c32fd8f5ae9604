#!/usr/bin/env python
"""Speed and agreement on the real model: circuitlab against TransformerLens and nnsight on SmolLM2-135M.

Each (row, library) is one fresh process, the libraries alternating row by row and pass by pass, so that
machine load and allocator state hit every side alike; the load (1-min average) is printed before and after
each process. Every side computes the same thing on the same weights and prompt, and the results are compared:

  forward     logits of one IOI prompt                          [1, pos, d_vocab]
  cache       every hook's activation (TL: run_with_cache; nnsight: every module's output saved)
  patch       residual-stream activation patching over every (layer, position), clean -> corrupt, the
              IO - S logit difference (ours: activation_patching; TL: patching.get_act_patch_resid_pre,
              one forward per patch; nnsight: the obvious loop, one trace per patch)         [layer, pos]
  generate    50 tokens of greedy decoding with a KV cache                                   [pos + 50]

Sides: ours (the imported GGUF); TransformerLens 3.x HookedTransformer built from the same weights
(pretrained.to_hooked_transformer: TL 3 accepts a LLaMA model of this shape, GQA included); nnsight on
transformers' own GGUF-loaded model. Ratios are peer time / ours per pass; the smallest over passes is claimed.

    .venv/bin/python benchmarks/bench_real.py                         # all rows, 2 passes (~15 min idle)
    .venv/bin/python benchmarks/bench_real.py --rows forward cache --passes 3 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
ROWS = ("forward", "cache", "patch", "generate")
SIDES = ("ours", "tl", "nnsight")
TOL = 1e-4


# ------------------------------------------------------------------------------------------- one side
def _ours(checkpoint: str):
    from circuitlab.training import load_checkpoint

    model, tok, _ = load_checkpoint(checkpoint)
    return model, tok


def _tokens(tok) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    clean, corrupt = torch.tensor([tok.encode(CLEAN)]), torch.tensor([tok.encode(CORRUPT)])
    return clean, corrupt, tok.token_id(" Mary"), tok.token_id(" John")


def run_side(side: str, row: str, checkpoint: str, repeats: int, out: Path) -> dict:
    """Time `row` on `side` (median of `repeats` after a warm-up) and save its result tensor to `out`."""
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(False)  # every side runs inference only: no autograd graph kept by any library
    model, tok = _ours(checkpoint)
    clean, corrupt, io, s = _tokens(tok)
    fn = {"ours": _ours_row, "tl": _tl_row, "nnsight": _nnsight_row}[side](row, model, clean, corrupt, io, s)
    result = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    from safetensors.torch import save_file

    save_file({"result": result.detach().float().contiguous()}, str(out))
    return {"seconds": sorted(times)[len(times) // 2]}


def _diff(logits: torch.Tensor, io: int, s: int) -> torch.Tensor:
    return logits[:, -1, io] - logits[:, -1, s]


def _ours_row(row, model, clean, corrupt, io, s):
    from circuitlab.analysis.patching import activation_patching, logit_diff

    if row == "forward":
        return lambda: model(clean)
    if row == "cache":
        def cache():
            _, c = model.run_with_cache(clean)
            return torch.stack([v.float().sum() for v in c.values()])
        return cache
    if row == "patch":
        return lambda: activation_patching(model, clean, corrupt, logit_diff(io, s), target="resid_pre",
                                           progress=False).values
    return lambda: model.generate(clean, 50, temperature=0.0)[0]


def _tl_row(row, model, clean, corrupt, io, s):
    from circuitlab.pretrained import to_hooked_transformer

    tl = to_hooked_transformer(model)
    if row == "forward":
        return lambda: tl(clean)
    if row == "cache":
        def cache():
            _, c = tl.run_with_cache(clean)
            return torch.stack([v.float().sum() for v in c.values()])
        return cache
    if row == "patch":
        from transformer_lens import patching

        def patch():
            _, clean_cache = tl.run_with_cache(clean)
            return patching.get_act_patch_resid_pre(tl, corrupt, clean_cache,
                                                    lambda logits: _diff(logits, io, s).mean())
        return patch
    return lambda: tl.generate(clean, max_new_tokens=50, do_sample=False, use_past_kv_cache=True, verbose=False,
                               stop_at_eos=False)[0]


def _nnsight_row(row, model, clean, corrupt, io, s):
    from nnsight import NNsight
    from transformers import AutoModelForCausalLM

    from circuitlab.pretrained.builtin import builtin_file

    path = builtin_file("smollm2-135m-instruct")
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    nn = NNsight(hf)
    layers = nn.model.layers
    if row == "forward":
        def forward():
            with torch.no_grad(), nn.trace(clean):
                logits = nn.output.logits.save()
            return logits
        return forward
    if row == "cache":
        modules = [m for _, m in nn.named_modules() if m is not nn]  # every module's output, as hooks

        def cache():
            with torch.no_grad(), nn.trace(clean):
                saved = [m.output.save() for m in modules]
            return torch.stack([(v[0] if isinstance(v, tuple) else v).float().sum() for v in saved])
        return cache
    if row == "patch":
        def patch():
            with torch.no_grad(), nn.trace(clean):
                states = [layer.input.save() for layer in layers]  # each block's input: resid_pre
            out = torch.zeros(len(layers), clean.shape[1])
            for layer in range(len(layers)):
                for pos in range(clean.shape[1]):
                    with torch.no_grad(), nn.trace(corrupt):
                        layers[layer].input[:, pos] = states[layer][:, pos]
                        value = _diff(nn.output.logits, io, s).save()
                    out[layer, pos] = value.mean()
            return out
        return patch
    return lambda: hf.generate(clean, max_new_tokens=50, do_sample=False, min_new_tokens=50)[0]


# ------------------------------------------------------------------------------------------- the driver
def load1() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="an imported SmolLM2 folder (default: imported once into a temp folder)")
    p.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--passes", type=int, default=2, help="alternating passes over the sides (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per process after a warm-up (default 3)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in every side (default 1: equal for all, and no oversubscription when the "
                        "machine is shared)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.side:  # a child: one side, one row
        print(json.dumps(run_side(a.side, a.row, a.checkpoint, a.repeats, Path(a.result))))
        return 0
    from circuitlab.perf import REFERENCE_GFLOPS, matmul_gflops

    work = Path(tempfile.mkdtemp(prefix="bench-real-"))
    checkpoint = a.checkpoint
    if checkpoint is None:
        checkpoint = str(work / "smollm2")
        subprocess.run([sys.executable, "-m", "circuitlab.cli", "import", "smollm2-135m-instruct", "--out",
                        checkpoint], check=True, capture_output=True)
    gflops = matmul_gflops()
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1, dequantized, float32); {gflops:.0f} GFLOP/s fp32 matmul "
          f"(reference {REFERENCE_GFLOPS:.0f}); threads {a.threads or torch.get_num_threads()}")
    report: dict = {"gflops": gflops, "rows": {}}
    for row in a.rows:
        passes = []
        for k in range(a.passes):
            order = a.sides if k % 2 == 0 else list(reversed(a.sides))
            times = {}
            for side in order:
                before = load1()
                cmd = [sys.executable, __file__, "--side", side, "--row", row, "--checkpoint", checkpoint,
                       "--repeats", str(a.repeats), "--result", str(work / f"{row}-{side}.safetensors")]
                if a.threads:
                    cmd += ["--threads", str(a.threads)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"  {row} {side}: failed\n{done.stderr[-2000:]}")
                    continue
                times[side] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
                print(f"  {row:9s} pass {k + 1} {side:8s} {times[side]:8.3f} s   load {before:.1f} -> {load1():.1f}")
            passes.append(times)
        agree = _agreement(work, row, a.sides)
        ratios = {side: min(t[side] / t["ours"] for t in passes if side in t and "ours" in t)
                  for side in a.sides if side != "ours" and all(side in t and "ours" in t for t in passes)}
        report["rows"][row] = {"passes": passes, "max_abs_diff": agree, "smallest_ratio": ratios}
        said = ", ".join(f"{side} / ours >= {r:.2f}x" for side, r in ratios.items())
        print(f"{row}: {said}; largest difference from ours {agree}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


def _agreement(work: Path, row: str, sides) -> dict[str, float]:
    from safetensors.torch import load_file

    files = {side: work / f"{row}-{side}.safetensors" for side in sides}
    if not files["ours"].is_file():
        return {}
    ours = load_file(str(files["ours"]))["result"]
    out = {}
    for side, f in files.items():
        if side == "ours" or not f.is_file():
            continue
        theirs = load_file(str(f))["result"]
        if row == "cache":  # the peers' hooks are other sets of points: the sums are not comparable
            out[side] = float("nan")
            continue
        out[side] = float((theirs - ours).abs().max()) if theirs.shape == ours.shape else float("inf")
    return out


if __name__ == "__main__":
    sys.exit(main())
