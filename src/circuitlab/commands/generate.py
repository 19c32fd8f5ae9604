"""circuitlab generate: sample text from a trained or imported model."""
from __future__ import annotations

import argparse

from circuitlab.checks import Number, DEFAULT_SEED

# the samples are drawn together: one batch of NUM rows, whose KV cache is held at once
NUM = Number(int, low=1, high=1024, why="the samples are generated as one batch, their KV cache held at once")
DEFAULT_TEMPERATURE = 0.8   # generate's own (steer's is SteerOptions.temperature)

HELP = "sample text from a checkpoint (KV-cached decoding)"
EXAMPLE = 'circuitlab generate --checkpoint runs/demo/2l --prompt "Once upon a" --max-tokens 40 --temperature 0.8'



def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import positive_int

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True,
                   help="a run or checkpoint directory")
    p.add_argument("--prompt", default="", help="text to continue (default: none, a new document from the "
                                                "end-of-text token)")
    p.add_argument("--max-tokens", type=positive_int, default=60)
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--num", type=NUM.arg, default=1, help=f"number of samples (at most {NUM.high}, drawn as one batch)")


def run(args: argparse.Namespace) -> int:
    import warnings

    import torch

    from circuitlab.errors import CircuitlabError
    from circuitlab.model.sampling import check_sampling
    from circuitlab.training import load_checkpoint

    check_sampling(args.temperature, args.top_k, args.top_p, cli=True)  # before the model is loaded
    model, tokenizer, _ = load_checkpoint(args.checkpoint)
    if tokenizer is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    ids = tokenizer.encode(args.prompt)
    if not ids:  # said, not silently replaced: the samples then start a new document
        warnings.warn("no prompt (or one that encodes to no tokens): sampling a new document from the "
                      "end-of-text token")
        ids = [tokenizer.eos_id]
    n_ctx = model.cfg.n_ctx
    if len(ids) >= n_ctx:
        raise CircuitlabError(f"the prompt is {len(ids)} tokens; the model's context is {n_ctx} (and leaves no room "
                              "to generate): shorten the prompt")
    if len(ids) + args.max_tokens > n_ctx:
        warnings.warn(f"the prompt ({len(ids)} tokens) plus --max-tokens {args.max_tokens} exceed the model's "
                      f"context of {n_ctx}: tokens past it are predicted from the last {n_ctx} tokens only")
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
