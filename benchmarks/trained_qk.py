"""QK attributions of a trained model's induction heads: are the top pairs the expected (query: the current
token) x (key: the previous-token head's output at the key)?

Prompts: a random token sequence repeated twice (seeds 0..--prompts-1). At each position of the second
repeat, the induction key is the position after the current token's first occurrence. For each head asked
for (default: the two heads of layers >= 1 that attend most to the induction key), every query's QK
attribution to that key: how often the key won the softmax, the kinds of the top pair, which earlier head's
output the key side of the top pair is, and the top pair's share of the score.

    PYTHONPATH=src python benchmarks/trained_qk.py --demo runs/demo                   # `circuitlab demo`'s 2-layer model
    PYTHONPATH=src python benchmarks/trained_qk.py --checkpoint runs/graphs/model --transcoders runs/graphs/transcoders
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", default=None, help="a `circuitlab demo` output folder (its 2l model and heads)")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--transcoders", default=None, help="for a model with MLPs")
    p.add_argument("--heads", default=None, help="heads to look at, e.g. L1H0,L1H3 (default: found)")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--length", type=int, default=16, help="tokens in the repeated sequence")
    args = p.parse_args()
    from circuitlab.graphs import Transcoders
    from circuitlab.graphs.qk import qk_attributions
    from circuitlab.names import parse_head
    from circuitlab.training import load_checkpoint

    heads = [parse_head(h) for h in args.heads.split(",")] if args.heads else None
    if args.demo:
        two = json.loads((Path(args.demo) / "results.json").read_text())["models"]["2l"]
        print(f"the demo's labels: induction heads {two['induction_heads']}, previous-token heads "
              f"{two['previous_token_heads']}")
        heads = heads or [parse_head(h) for h in two["induction_heads"]]
        args.checkpoint = Path(args.demo) / "2l"
    model, tok, _ = load_checkpoint(args.checkpoint)
    model = model.double().eval()
    tc = Transcoders.load(model, args.transcoders).to(torch.float64) if args.transcoders else None
    L = args.length
    prompts = []
    for seed in range(args.prompts):
        seq = torch.randint(1, model.cfg.d_vocab, (L,), generator=torch.Generator().manual_seed(seed))
        prompts.append(torch.cat([seq, seq]))
    if heads is None:   # the heads of layers >= 1 attending most to the induction key
        _, cache = model.run_with_cache(torch.stack(prompts), names_filter=lambda n: n.endswith("hook_pattern"))
        q = torch.arange(L, 2 * L - 1)
        score = {(layer, h): float(cache[f"blocks.{layer}.attn.hook_pattern"][:, h, q, q - L + 1].mean())
                 for layer in range(1, model.cfg.n_layers) for h in range(model.cfg.n_heads)}
        heads = sorted(score, key=score.get, reverse=True)[:2]
        print("mean attention to the induction key: " + ", ".join(f"L{a}H{b} {score[(a, b)]:.2f}"
                                                                   for a, b in sorted(score, key=score.get, reverse=True)[:4]))
    for layer, head in heads:
        won, kinds, key_heads, shares, n, example = 0, Counter(), Counter(), [], 0, None
        for tokens in prompts:
            reqs = [(layer, head, L + i, i + 1) for i in range(L - 1)]
            for r in qk_attributions(model, tc, tokens, reqs, tokenizer=tok):
                n += 1
                won += r.key_softmax()["rank"] == 1
                top = r.top_pairs(1)[0]
                qp, kp = r.query_parts[top["q"]], r.key_parts[top["k"]]
                kinds[f"{qp['kind']} x {kp['kind']}"] += 1
                if kp["kind"] == "head":
                    key_heads[f"L{kp['layer']}H{kp['head']}"] += 1
                shares.append(top["term"] / r.raw_score if r.raw_score else float("nan"))
                example = example or r
        print(f"L{layer}H{head}: the induction key won the softmax at {won}/{n} queries; top pair "
              f"{dict(kinds.most_common(3))}; its key-side head {dict(key_heads.most_common(3))}; the top pair's "
              f"share of the score: median {torch.tensor(shares).nanmedian():.2f}")
        print("  e.g. " + " | ".join(example.summary(2)))


if __name__ == "__main__":
    main()
