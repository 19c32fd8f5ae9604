"""circuitlab generate: sample text from a trained or imported model."""
from __future__ import annotations

import argparse

HELP = "sample text from a checkpoint (KV-cached decoding)"
EXAMPLE = 'circuitlab generate --checkpoint runs/demo/2l --prompt "Once upon a" --max-tokens 40 --temperature 0.8'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True,
                   help="a run or checkpoint directory")
    p.add_argument("--prompt", default="", help="text to continue")
    p.add_argument("--max-tokens", type=int, default=60)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num", type=int, default=1, help="number of samples")


def run(args: argparse.Namespace) -> int:
    import torch

    from circuitlab.errors import CircuitlabError
    from circuitlab.training import load_checkpoint

    if args.max_tokens <= 0:
        raise CircuitlabError("--max-tokens must be positive")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise CircuitlabError("--top-p must be in (0, 1]")
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    if tokenizer is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    ids = tokenizer.encode(args.prompt) if args.prompt else [tokenizer.eos_id]
    if len(ids) >= model.cfg.n_ctx:
        raise CircuitlabError(f"the prompt is {len(ids)} tokens; the model's context is {model.cfg.n_ctx}")
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.tensor([ids] * args.num)
    out = model.generate(prompt, args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, eos_id=tokenizer.eos_id, generator=gen)
    for row in out:
        new = row[len(ids):].tolist()
        if tokenizer.eos_id in new:
            new = new[: new.index(tokenizer.eos_id)]
        print(args.prompt + tokenizer.decode(new))
        if args.num > 1:
            print("---")
    return 0
