"""circuitlab generate: sample text from a trained or imported model."""
from __future__ import annotations

import argparse

HELP = "sample text from a checkpoint (KV-cached decoding)"
EXAMPLE = 'circuitlab generate --checkpoint runs/demo/2l --prompt "Once upon a" --max-tokens 40 --temperature 0.8'


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.model.sampling import GenerateOptions
    from circuitlab.spec import add_arguments as add_options

    add_options(p, GenerateOptions)   # every flag, declared in model/sampling.py


def run(args: argparse.Namespace) -> int:
    import warnings

    import torch

    from circuitlab.errors import CircuitlabError
    from circuitlab.model.sampling import GenerateOptions
    from circuitlab.training import load_checkpoint

    opts = GenerateOptions.from_args(args)   # before the model is loaded; --top-k etc. in the command's spellings
    model, tokenizer, _ = load_checkpoint(str(opts.checkpoint))
    if tokenizer is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot encode a prompt")
    text = opts.prompt or ""   # none given: the empty text, a new document
    ids = tokenizer.encode(text)
    if not ids:  # said, not silently replaced: the samples then start a new document
        warnings.warn("no prompt (or one that encodes to no tokens): sampling a new document from the "
                      "end-of-text token")
        ids = [tokenizer.eos_id]
    n_ctx = model.cfg.n_ctx
    if len(ids) >= n_ctx:
        raise CircuitlabError(f"the prompt is {len(ids)} tokens; the model's context is {n_ctx} (and leaves no room "
                              "to generate): shorten the prompt")
    if len(ids) + opts.max_tokens > n_ctx:
        warnings.warn(f"the prompt ({len(ids)} tokens) plus --max-tokens {opts.max_tokens} exceed the model's "
                      f"context of {n_ctx}: tokens past it are predicted from the last {n_ctx} tokens only")
    gen = torch.Generator().manual_seed(opts.seed)
    prompt = torch.tensor([ids] * opts.num)
    out = model.generate(prompt, opts.max_tokens, temperature=opts.temperature, top_k=opts.top_k,
                         top_p=opts.top_p, eos_id=tokenizer.eos_id, generator=gen)
    for row in out:
        new = row[len(ids):].tolist()
        if tokenizer.eos_id in new:
            new = new[: new.index(tokenizer.eos_id)]
        print(text + tokenizer.decode(new))
        if opts.num > 1:
            print("---")
    return 0
