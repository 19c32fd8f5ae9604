"""`circuitlab steer`'s pipeline: a direction from two prompt sets, a sweep of coefficients (preference, cost on
neutral text, a word counted in steered generations), and its files (steering.json, steering.png, report.html).

    result = run_steer(SteerOptions(checkpoint="runs/demo/2l", positive="dragon.txt", negative="cat.txt",
                                    layer=1, coefs=[0, 2, 4], count="dragon", out="runs/steer"))
    print(result.sweep.table())
    add_arguments(parser, SteerOptions); SteerOptions.from_args(args)    # the command's flags (circuitlab.spec)
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitlab.analysis.steering import (SteeringSweep, SteeringVector, check_kv, contrast_direction, steer_estimate,
                                         steering_sweep)
from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.checks import DEFAULT_SEED, FINITE, INT, Number
from circuitlab.errors import CircuitlabError, InputError
from circuitlab.model.sampling import TEMPERATURE, check_sampling
from circuitlab.spec import Options, option, options_of
from circuitlab.textfile import read_lines

if TYPE_CHECKING:
    import argparse

# Limits: the samples of one coefficient are generated as one batch (keys and values of every layer for each),
# every coefficient is one more sweep, every token one more forward pass.
SAMPLES = Number(int, low=1, high=1024, why="the samples are generated as one batch")
MAX_TOKENS = Number(int, low=1, high=4096, why="each new token is one more forward pass per sample")
MAX_COEFS = 64


@dataclass(frozen=True)
class SteerOptions(Options):
    """What `circuitlab steer` takes, declared once (circuitlab.spec): each flag's default, rule and help. Text
    files hold one prompt per line; neutral None: 32 built-in stories the demo did not train on; out None: no files
    written. check() adds what no field's rule holds: the temperature in check_sampling's words (shared with
    generate), one to MAX_COEFS coefficients."""

    checkpoint: str | Path = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    positive: str | Path = option(None, required=True,
                                  help="text file, one prompt per line: what to steer towards")
    negative: str | Path = option(None, required=True,
                                  help="text file, one prompt per line: what to steer away from")
    layer: int = option(None, INT, required=True, help="add the direction to the residual before this layer")
    coefs: tuple[float, ...] = option((0.0, 1.0, 2.0, 4.0), FINITE, flag="--coef", metavar="COEF", nargs="+",
                                      help="coefficients to sweep")
    neutral: str | Path | None = option(None, help="text file of neutral text for the loss cost "
                                                   "(default: 32 built-in stories the demo did not train on)")
    prompt: str = option("Once upon a time,", help="generations start from this prompt")
    samples: int = option(8, SAMPLES, help=f"generations per coefficient (at most {SAMPLES.high})")
    max_tokens: int = option(40, MAX_TOKENS, help=f"tokens per generation (at most {MAX_TOKENS.high})")
    # read as any float: check_sampling says why a value is refused
    temperature: float = option(0.8, TEMPERATURE, arg=float, help="")
    count: str | None = option(None, help="a word to count in the generations (e.g. the positive set's topic)")
    seed: int = option(DEFAULT_SEED, INT, help="")
    out: str | Path | None = option(None, help="folder for steering.json, steering.png and report.html (an earlier "
                                               "steer output there is kept, renamed; or replaced with --overwrite)")
    overwrite: bool = option(False, help="replace an earlier steer output in --out")
    progress: bool = option(True, flag="--no-progress", help="no progress bar (and no estimate before the work)")

    def check(self, error: type[Exception] = InputError) -> SteerOptions:
        """One line for a value out of range, before anything is loaded: temperature in check_sampling's words,
        the number of coefficients, then every field's rule."""
        self.check_limits(cli=False, error=error)
        for c in self.coefs:   # a coefficient named as the Python API has always named it (the rule: FINITE)
            FINITE.check(c, "coef", error)
        return super().check(error)

    def check_limits(self, cli: bool, error: type[Exception] = InputError) -> None:
        """The checks no field's rule holds, naming the options as the command line (cli) or Python spells them."""
        try:
            check_sampling(self.temperature, cli=cli)
        except InputError as e:   # a config's error class (from_dict) where one is asked for
            raise error(str(e)) from None
        if not isinstance(self.coefs, (list, tuple)):
            raise error(f"coefs must be a list of numbers, got {self.coefs!r}")
        name = "--coef" if cli else "coefs"
        if not self.coefs:
            raise error(f"{name}: give at least one coefficient")
        if len(self.coefs) > MAX_COEFS:
            raise error(f"{name}: give at most {MAX_COEFS} coefficients (each is one more sweep), got "
                        f"{len(self.coefs)}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SteerOptions:
        """The command's options, its own spellings refused first (--temperature, --coef)."""
        cls(**{f.name: getattr(args, f.name) for f, _ in options_of(cls)}).check_limits(cli=True)
        return super().from_args(args)


@dataclass
class SteerResult:
    """The sweep, its direction, and the generations of each coefficient ({str(coef): [text, ...]}, in the
    sweep's order)."""

    sweep: SteeringSweep
    vector: SteeringVector
    prompt: str
    generations: dict[str, list[str]]
    n_positive: int
    n_negative: int
    out: Path | None = None
    kept: Path | None = None  # where an earlier steer output in `out` was set aside

    def summary(self) -> list[str]:
        plural = "s" if self.n_positive + self.n_negative > 2 else ""
        lines = [f"direction: {self.n_positive} positive − {self.n_negative} negative prompt{plural} at "
                 f"{self.vector.hook_name}, norm {float(self.vector.direction.norm()):.3f}",
                 self.sweep.table()]
        lines += [f"coef {c:g}: {self.prompt}{texts[0]!r}" for c, texts in zip(self.sweep.coefs,
                                                                                self.generations.values())]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {**self.sweep.to_dict(), "prompt": self.prompt, "generations": self.generations}

    def _repr_html_(self) -> str:
        return self.sweep._repr_html_()


def read_prompts(path: str | Path, tokenizer: Any, what: str) -> list[torch.Tensor]:
    """One token tensor [pos] per non-empty line of a UTF-8 text file; an empty set is refused."""
    lines = [line.strip() for line in read_lines(path, f"{what} prompt file")]
    if not lines:
        raise CircuitlabError(f"the {what} prompt set {path} is empty: give one prompt per line")
    return [torch.tensor(tokenizer.encode(line)) for line in lines]


def _inputs(opts: SteerOptions) -> tuple[Any, Any, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The checked options' model, tokenizer and positive, negative and neutral prompts."""
    from circuitlab.data import generate_stories
    from circuitlab.training import load_checkpoint

    model, tok, _ = load_checkpoint(opts.checkpoint)
    check_kv(model, opts.samples)
    if tok is None:
        raise CircuitlabError(f"{opts.checkpoint} has no tokenizer saved with it; cannot encode prompts")
    positive, negative = read_prompts(opts.positive, tok, "positive"), read_prompts(opts.negative, tok, "negative")
    if opts.neutral:
        neutral = read_prompts(opts.neutral, tok, "neutral")
    else:
        neutral = [torch.tensor(tok.encode(s)) for s in generate_stories(32, seed=2)]
    return model, tok, positive, negative, neutral


def _estimate(opts: SteerOptions, model, tok, prompts: list[torch.Tensor]) -> Any:
    lengths = [min(len(p), model.cfg.n_ctx + 1) for p in prompts]
    return steer_estimate(model, opts.samples, max(1, len(tok.encode(opts.prompt))), opts.max_tokens,
                          len(opts.coefs) + (0 if 0.0 in opts.coefs else 1), sum(lengths), max(lengths))


def estimate_steer(opts: SteerOptions) -> Any:
    """What run_steer(opts) would hold and take (circuitlab.memory.Estimate, timed), from the model and the
    prompts; nothing is generated or written (`circuitlab steer --estimate`)."""
    opts = opts.check()
    model, tok, positive, negative, neutral = _inputs(opts)
    return _estimate(opts, model, tok, positive + negative + neutral).timed()


def run_steer(opts: SteerOptions) -> SteerResult:
    """Build the direction, sweep the coefficients, generate, and write the files when opts.out is set."""
    from circuitlab.training.outputs import check_output_folder, output_folder

    opts = opts.check()
    out = Path(opts.out) if opts.out is not None else None
    if out is not None:  # refused before the work, not after it
        check_output_folder(out, "steer", overwrite=opts.overwrite, is_previous=is_steer_output)
    model, tok, positive, negative, neutral = _inputs(opts)
    if opts.progress:   # what it will hold and take, before the work
        print(_estimate(opts, model, tok, positive + negative + neutral).timed().line(), flush=True)
    vector = contrast_direction(model, positive, negative, layer=opts.layer)
    ids = tok.encode(opts.prompt)
    if not ids:  # said, not silently replaced
        warnings.warn("--prompt is empty: generations start a new document from the end-of-text token")
    prompt = torch.tensor([ids or [tok.eos_id]] * opts.samples)
    texts_by_run: list[list[str]] = []

    def generations(m) -> float:  # run inside each coefficient's steering
        gen = torch.Generator().manual_seed(opts.seed)
        rows = m.generate(prompt, opts.max_tokens, temperature=opts.temperature, generator=gen)
        texts = [tok.decode(row[prompt.shape[1]:].tolist()) for row in rows]
        texts_by_run.append(texts)
        return sum(t.count(opts.count) for t in texts) / len(texts) if opts.count else 0.0

    sweep = steering_sweep(model, vector, opts.coefs, positive, negative, neutral, metric=generations,
                           metric_name=f"'{opts.count}' per sample" if opts.count else None,
                           progress=opts.progress)
    if not opts.count:
        sweep.metric = None
    result = SteerResult(sweep, vector, opts.prompt, {str(c): t for c, t in zip(sweep.coefs, texts_by_run)},
                         len(positive), len(negative))
    if out is not None:
        result.out = out
        result.kept = output_folder(out, "steer", overwrite=opts.overwrite, is_previous=is_steer_output)
        write_steer_outputs(result, out, f"circuitlab steer: {opts.checkpoint}")
    return result


def write_steer_outputs(result: SteerResult, out: Path, title: str) -> None:
    """out/steering.json, steering.png and report.html."""
    from circuitlab.report.inputs import write_steering_report
    from circuitlab.viz.steering import steering_figure

    data = result.to_dict()
    atomic_write_text(out / "steering.json", json_text(data, indent=1))
    steering_figure(result.sweep).save_png(out / "steering.png")
    write_steering_report(out, data, title)


def is_steer_output(folder: Path) -> bool:
    """A steer folder written before output folders were marked."""
    return (folder / "steering.json").is_file()
