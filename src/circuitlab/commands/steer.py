"""circuitlab steer: a direction from two prompt sets, added to the residual stream, measured."""
from __future__ import annotations

import argparse

from circuitlab.checks import Number

HELP = "steer a model with the difference of two prompt sets' mean activations; measure effect and cost"
EXAMPLE = ("circuitlab steer --checkpoint runs/demo/2l --positive dragon.txt --negative cat.txt --layer 1 "
           "--coef 0 2 4 8 --count dragon --out runs/steer")


# Limits: the samples of one coefficient are generated as one batch (keys and values of every layer for each),
# every coefficient is one more sweep, every token one more forward pass.
SAMPLES = Number(int, low=1, high=1024, why="the samples are generated as one batch")
MAX_TOKENS = Number(int, low=1, high=4096, why="each new token is one more forward pass per sample")
MAX_COEFS = 64
KV_BUDGET = 2 ** 28  # floats of keys and values one batch of samples may hold (1 GiB)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.checks import FINITE, INT

    p.add_argument("--checkpoint", "--model", dest="checkpoint", required=True, help="a run or checkpoint directory")
    p.add_argument("--positive", required=True, help="text file, one prompt per line: what to steer towards")
    p.add_argument("--negative", required=True, help="text file, one prompt per line: what to steer away from")
    p.add_argument("--layer", type=INT.arg, required=True, help="add the direction to the residual before this layer")
    p.add_argument("--coef", type=FINITE.arg, nargs="+", default=[0.0, 1.0, 2.0, 4.0], help="coefficients to sweep")
    p.add_argument("--neutral", default=None, help="text file of neutral text for the loss cost "
                                                   "(default: 32 built-in stories the demo did not train on)")
    p.add_argument("--prompt", default="Once upon a time,", help="generations start from this prompt")
    p.add_argument("--samples", type=SAMPLES.arg, default=8, help=f"generations per coefficient (at most {SAMPLES.high})")
    p.add_argument("--max-tokens", type=MAX_TOKENS.arg, default=40, help=f"tokens per generation (at most {MAX_TOKENS.high})")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--count", default=None, help="a word to count in the generations (e.g. the positive set's topic)")
    p.add_argument("--seed", type=INT.arg, default=0)
    p.add_argument("--out", default=None, help="folder for steering.json, steering.png and report.html (an earlier "
                                               "steer output there is kept, renamed; or replaced with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier steer output in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _prompts(path: str, tok, what: str) -> list:
    import torch

    from circuitlab.errors import CircuitlabError
    from circuitlab.textfile import read_lines

    lines = [line.strip() for line in read_lines(path, f"{what} prompt file")]
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
    from circuitlab.training.outputs import check_output_folder, output_folder

    check_sampling(args.temperature, cli=True)  # before the model is loaded
    if len(args.coef) > MAX_COEFS:
        raise CircuitlabError(f"--coef: give at most {MAX_COEFS} coefficients (each is one more sweep), got "
                              f"{len(args.coef)}")
    out = Path(args.out) if args.out else None
    if out is not None:  # refused before the work, not after it
        check_output_folder(out, "steer", overwrite=args.overwrite, is_previous=_is_steer_output)
    model, tok, _ = load_checkpoint(args.checkpoint)
    kv = args.samples * 2 * model.cfg.n_layers * model.cfg.n_ctx * model.cfg.d_model
    if kv > KV_BUDGET:
        fit = max(1, KV_BUDGET // (kv // args.samples))
        raise CircuitlabError(f"--samples {args.samples}: the keys and values of {args.samples} generations of this "
                              f"model need {kv * 4 / 2**30:.1f} GiB; give at most {fit}")
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
                           metric_name=f"'{args.count}' per sample" if args.count else None,
                           progress=not args.no_progress)
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

        kept = output_folder(out, "steer", overwrite=args.overwrite, is_previous=_is_steer_output)
        if kept:
            print(f"kept the earlier steer output as {kept}")
        result = {**sweep.to_dict(), "prompt": args.prompt,
                  "generations": {str(c): t for c, t in zip(sweep.coefs, samples.values())}}
        atomic_write_text(out / "steering.json", json.dumps(result, indent=1))
        steering_figure(sweep).save_png(out / "steering.png")
        write_steering_report(out, result, f"circuitlab steer: {args.checkpoint}")
        print(f"wrote {out / 'steering.json'}, {out / 'steering.png'} and {out / 'report.html'}")
    return 0


def _is_steer_output(folder) -> bool:
    """A steer folder written before output folders were marked."""
    return (folder / "steering.json").is_file()
