"""circuitlab steer: a direction from two prompt sets, added to the residual stream, measured."""
from __future__ import annotations

import argparse

HELP = "steer a model with the difference of two prompt sets' mean activations; measure effect and cost"
EXAMPLE = ("circuitlab steer --checkpoint runs/demo/2l --positive dragon.txt --negative cat.txt --layer 1 "
           "--coef 0 2 4 8 --count dragon --out runs/steer")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import finite_float, positive_int

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--positive", required=True, help="text file, one prompt per line: what to steer towards")
    p.add_argument("--negative", required=True, help="text file, one prompt per line: what to steer away from")
    p.add_argument("--layer", type=int, required=True, help="add the direction to the residual before this layer")
    p.add_argument("--coef", type=finite_float, nargs="+", default=[0.0, 1.0, 2.0, 4.0], help="coefficients to sweep")
    p.add_argument("--neutral", default=None, help="text file of neutral text for the loss cost "
                                                   "(default: 32 built-in stories the demo did not train on)")
    p.add_argument("--prompt", default="Once upon a time,", help="generations start from this prompt")
    p.add_argument("--samples", type=positive_int, default=8, help="generations per coefficient")
    p.add_argument("--max-tokens", type=positive_int, default=40)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--count", default=None, help="a word to count in the generations (e.g. the positive set's topic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for steering.json, steering.png and report.html")


def _prompts(path: str, tok, what: str) -> list:
    from pathlib import Path

    import torch

    from circuitlab.errors import CircuitlabError

    if not Path(path).is_file():
        raise CircuitlabError(f"{what} prompt file not found: {path}")
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise CircuitlabError(f"the {what} prompt set {path} is empty: give one prompt per line")
    return [torch.tensor(tok.encode(line)) for line in lines]


def run(args: argparse.Namespace) -> int:
    import json
    import warnings
    from pathlib import Path

    import torch

    from circuitlab.analysis.steering import contrast_direction, steering_sweep
    from circuitlab.atomic import atomic_write_text
    from circuitlab.data import generate_stories
    from circuitlab.errors import CircuitlabError
    from circuitlab.model.sampling import check_sampling
    from circuitlab.training import load_checkpoint

    check_sampling(args.temperature, cli=True)  # before the model is loaded
    model, tok, _ = load_checkpoint(args.checkpoint)
    if tok is None:
        raise CircuitlabError(f"{args.checkpoint} has no tokenizer saved with it; cannot encode prompts")
    positive, negative = _prompts(args.positive, tok, "positive"), _prompts(args.negative, tok, "negative")
    if args.neutral:
        neutral = _prompts(args.neutral, tok, "neutral")
    else:
        neutral = [torch.tensor(tok.encode(s)) for s in generate_stories(32, seed=2)]
    vector = contrast_direction(model, positive, negative, layer=args.layer)
    ids = tok.encode(args.prompt)
    if not ids:  # said, not silently replaced
        warnings.warn("--prompt is empty: generations start a new document from the end-of-text token")
    prompt = torch.tensor([ids or [tok.eos_id]] * args.samples)
    samples: dict[str, list[str]] = {}

    def generations(m) -> float:  # run inside each coefficient's steering
        gen = torch.Generator().manual_seed(args.seed)
        out = m.generate(prompt, args.max_tokens, temperature=args.temperature, generator=gen)
        texts = [tok.decode(row[prompt.shape[1]:].tolist()) for row in out]
        samples[str(len(samples))] = texts
        return sum(t.count(args.count) for t in texts) / len(texts) if args.count else 0.0

    sweep = steering_sweep(model, vector, args.coef, positive, negative, neutral, metric=generations,
                           metric_name=f"'{args.count}' per sample" if args.count else None)
    if not args.count:
        sweep.metric = None
    print(f"direction: {len(positive)} positive − {len(negative)} negative prompts at {vector.hook_name}, "
          f"norm {float(vector.direction.norm()):.3f}")
    print(sweep.table())
    for c, texts in zip(sweep.coefs, samples.values()):
        print(f"coef {c:g}: {args.prompt}{texts[0]!r}")
    if args.out:
        from circuitlab.report.inputs import write_steering_report
        from circuitlab.viz.steering import steering_figure

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {**sweep.to_dict(), "prompt": args.prompt,
                  "generations": {str(c): t for c, t in zip(sweep.coefs, samples.values())}}
        atomic_write_text(out / "steering.json", json.dumps(result, indent=1))
        steering_figure(sweep).save_png(out / "steering.png")
        write_steering_report(out, result, f"circuitlab steer: {args.checkpoint}")
        print(f"wrote {out / 'steering.json'}, {out / 'steering.png'} and {out / 'report.html'}")
    return 0
