"""QK attributions of a trained model's induction heads: are the top pairs the expected (query: the current
token) x (key: the previous-token head's output at the key)?

Reads a `circuitlab demo` output folder (its 2-layer attention-only model and the induction / previous-token
heads results.json names), builds prompts of a random token sequence repeated twice (seeds 0..--prompts-1),
and for every induction head takes the QK attribution from each position of the second repeat to the key
one after the current token's first occurrence (where induction attends). Prints, per head: how often that
key won the softmax, how often the top pair is (query: token) x (key: an earlier head's output), which head
that is, and the mean share of the score the top pair holds.

    PYTHONPATH=src python benchmarks/trained_qk.py runs/demo            # after `circuitlab demo --out runs/demo`
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("demo", help="a `circuitlab demo` output folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--length", type=int, default=20, help="tokens in the repeated sequence")
    args = p.parse_args()
    from circuitlab.graphs.qk import qk_attributions
    from circuitlab.names import parse_head
    from circuitlab.training import load_checkpoint

    folder = Path(args.demo)
    results = json.loads((folder / "results.json").read_text())
    two = results["models"]["2l"]
    model, tok, _ = load_checkpoint(folder / "2l")
    model = model.double().eval()
    heads = [parse_head(h) for h in two["induction_heads"]]
    print(f"induction heads {two['induction_heads']}, previous-token heads {two['previous_token_heads']}")
    for layer, head in heads:
        won, top_kinds, top_heads, shares = 0, Counter(), Counter(), []
        n = 0
        for seed in range(args.prompts):
            g = torch.Generator().manual_seed(seed)
            seq = torch.randint(1, model.cfg.d_vocab, (args.length,), generator=g)
            tokens = torch.cat([seq, seq])
            reqs = [(layer, head, args.length + i, i + 1) for i in range(args.length - 1)]
            for r in qk_attributions(model, None, tokens, reqs, tokenizer=tok):
                n += 1
                won += r.key_softmax()["rank"] == 1
                top = r.top_pairs(1)[0]
                q, k = r.query_parts[top["q"]], r.key_parts[top["k"]]
                top_kinds[(q["kind"], k["kind"])] += 1
                if k["kind"] == "head":
                    top_heads[f"L{k['layer']}H{k['head']}"] += 1
                shares.append(top["term"] / r.raw_score if r.raw_score else float("nan"))
        print(f"L{layer}H{head}: the induction key won the softmax at {won}/{n} queries; top pair kinds "
              f"{dict(top_kinds.most_common(3))}; key-side heads of the top pair {dict(top_heads.most_common(3))}; "
              f"top pair's share of the score: median {torch.tensor(shares).nanmedian():.2f}")
        print("  e.g. " + "; ".join(r.summary(2)))


if __name__ == "__main__":
    main()
