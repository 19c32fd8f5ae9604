#!/bin/sh
# The scale benchmark on a GPU in bfloat16, every shape and method, in one command (a session with a GPU):
#   sh benchmarks/gpu_scale.sh [more bench_scale.py options]      # writes benchmarks/scale-cuda.json
# Each (shape, method) runs in its own process; the rows add cuda_peak_mib (torch's peak allocation).
set -e
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
PYTHONPATH=src "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this script is for a GPU machine')"
PYTHONPATH=src exec "$PY" benchmarks/bench_scale.py --device cuda --dtype bfloat16 \
  --shapes gpt2-small qwen3-0.6b llama-3.2-1b gemma-2-2b --peers --out benchmarks/scale-cuda.json "$@"
