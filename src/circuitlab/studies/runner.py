"""Run studies on a checkpoint: `circuitlab study NAME --checkpoint DIR` (NAME "all": every study in turn).

Each study writes OUT/NAME/results.json, OUT/NAME/report.md and its PNG figures; OUT/report.html holds a section
for every finished study and OUT/report.md all their reports. A study whose results.json is there, made with the
same checkpoint and options, is reused with --resume (a stopped `study all` goes on with the next study).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuitlab.atomic import atomic_write_text, json_text
from circuitlab.errors import InputError
from circuitlab.spec import Options, option
from circuitlab.studies.base import Study, StudyResult, claims_markdown

if TYPE_CHECKING:
    from circuitlab.model import Transformer


def _studies() -> dict[str, Study]:
    from circuitlab.studies.registry import STUDIES

    return STUDIES


@dataclass(frozen=True)
class StudyRunOptions(Options):
    """What `circuitlab study` reads besides each study's own options."""

    study: str | None = option(None, required=True, flag="study", metavar="NAME",
                               help="the study to run: induction, ioi, facts, lens, or all (every study in turn)")
    checkpoint: str | None = option(None, required=True, aliases=("--model",), help="a run or checkpoint directory")
    out: str | None = option(None, help="output directory (default: <checkpoint>/studies)")
    resume: bool = option(False, help="reuse the studies already finished in --out with the same checkpoint and "
                                      "options (a stopped `study all` goes on with the next one)")
    progress: bool = option(True, flag="--no-progress", help="no progress bars")

    def check(self, error: type[Exception] = InputError) -> "StudyRunOptions":
        checked = super().check(error)
        names = list(_studies())
        if checked.study not in names + ["all"]:
            raise error(f"unknown study {checked.study!r}: choose one of {', '.join(names)}, or all")
        return checked

    def names(self) -> list[str]:
        return list(_studies()) if self.study == "all" else [str(self.study)]


def study_out(opts: StudyRunOptions) -> Path:
    return Path(opts.out) if opts.out else Path(str(opts.checkpoint)) / "studies"


def estimates(model: "Transformer", opts: StudyRunOptions, study_options: dict[str, Options]) -> list[str]:
    """One line per study: what it holds and roughly how long it takes here, and at 150 GFLOP/s."""
    from circuitlab.perf import REFERENCE_GFLOPS, matmul_gflops

    gflops = matmul_gflops(seconds=0.2)
    lines, total, scaled = [], 0.0, 0.0
    for name in opts.names():
        est = _studies()[name].estimate(model, study_options[name]).timed(gflops)
        seconds = est.seconds() or 0.0
        total += seconds
        scaled += seconds * gflops / REFERENCE_GFLOPS
        lines.append(f"{name}: {est.line()} (~{seconds * gflops / REFERENCE_GFLOPS:.0f} s at "
                     f"{REFERENCE_GFLOPS:.0f} GFLOP/s)")
    if len(lines) > 1:
        lines.append(f"all: ~{total / 60:.1f} min here, ~{scaled / 60:.1f} min at {REFERENCE_GFLOPS:.0f} GFLOP/s")
    return lines


def _finished(folder: Path, checkpoint: str, options: dict[str, Any]) -> StudyResult | None:
    """The study's results in folder when made from this checkpoint with these options, else None."""
    path = folder / "results.json"
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        made = d.get("made_with", {})
        if made.get("checkpoint") != checkpoint or made.get("options") != options:
            return None
        return StudyResult.from_dict(d)
    except (ValueError, KeyError, TypeError):
        return None   # damaged or of another version: run again


def run_studies(opts: StudyRunOptions, study_options: dict[str, Options] | None = None,
                model: "Transformer | None" = None, tokenizer: Any = None) -> dict[str, StudyResult]:
    """Run opts.names() on the checkpoint (or the given model and tokenizer), each into OUT/NAME; write
    OUT/report.html and OUT/report.md. study_options: each study's options (default: its defaults)."""
    from tqdm.auto import tqdm

    from circuitlab.perf import REFERENCE_GFLOPS, matmul_gflops, scaled_seconds
    from circuitlab.training.outputs import check_writable

    opts = opts.check()
    studies = _studies()
    chosen = {n: (study_options or {}).get(n) or studies[n].options() for n in opts.names()}
    chosen = {n: o.check() for n, o in chosen.items()}
    out = study_out(opts)
    check_writable(out, "the studies")
    if model is None:
        from circuitlab.training import load_checkpoint

        model, tokenizer, _ = load_checkpoint(str(opts.checkpoint))
    model.eval()
    if opts.progress:
        for line in estimates(model, opts, chosen):
            print(line, flush=True)
    results: dict[str, StudyResult] = {}
    for name in tqdm(list(chosen), desc="studies", unit="study", disable=not opts.progress or len(chosen) < 2):
        folder = out / name
        options = chosen[name].to_dict()
        made_with: dict[str, Any] = {"checkpoint": str(opts.checkpoint), "options": options}
        found = _finished(folder, str(opts.checkpoint), options) if opts.resume else None
        if found is not None:
            print(f"{name}: reusing the finished study in {folder}")
            results[name] = found
            continue
        gflops = matmul_gflops(seconds=0.2)
        t0 = time.time()
        result = studies[name].run(model, tokenizer, chosen[name], progress=opts.progress)
        wall = time.time() - t0
        result.seconds.update(wall=round(wall, 1), gflops=round(gflops, 1),
                              **{f"wall_at_{REFERENCE_GFLOPS:.0f}_gflops": round(scaled_seconds(wall, gflops), 1)})
        write_study(folder, studies[name], result, made_with)
        results[name] = result
    write_reports(out)
    return results


def study_markdown(study: Study, result: StudyResult) -> str:
    """A study's report.md: the paper, the claims and their verdicts, the study's own tables, its figures."""
    lines = [f"# {study.title}", "", f"Reproducing {study.paper}.", "", *claims_markdown(result.claims),
             *study.markdown(result), ""]
    lines += [f"![{name}]({file})" for name, file in result.figures.items()]
    if result.seconds:
        lines += ["", "Wall time: " + ", ".join(f"{k} {v}" for k, v in result.seconds.items()) + "."]
    return "\n".join(lines) + "\n"


def write_study(folder: Path, study: Study, result: StudyResult, made_with: dict[str, Any]) -> None:
    """results.json (with what made it), the PNG figures and report.md into folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, fig in study.figures(result).items():
        result.figures[name] = fig.save_png(folder / f"{name}.png").name
    atomic_write_text(folder / "report.md", study_markdown(study, result))
    atomic_write_text(folder / "results.json", json_text({**result.to_dict(), "made_with": made_with}, indent=2))


def _html(lines: list[str]) -> list[str]:
    """report.md's lines as HTML fragments: Markdown tables as tables, the rest as markdown_lite."""
    from circuitlab.viz.fragments import markdown_lite, table_html

    parts: list[str] = []
    text: list[str] = []
    table: list[list[str]] = []

    def cells(line: str) -> list[str]:
        return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]

    def flush() -> None:
        if text:
            parts.append(markdown_lite("\n".join(text)))
            text.clear()
        if table:
            head, rows = table[0], [r for r in table[1:] if not set("".join(r)) <= set("-: ")]
            parts.append(table_html([dict(zip(head, r)) for r in rows], head))
            table.clear()

    for line in lines:
        if line.strip().startswith("|"):
            if text:
                flush()
            table.append(cells(line))
        else:
            if table:
                flush()
            if not line.startswith("!["):
                text.append(line)
    flush()
    return parts


def write_reports(out: Path) -> Path | None:
    """OUT/report.html (a section per finished study, its figures interactive) and OUT/report.md, from the
    studies' results.json alone; None when no study has finished."""
    from circuitlab.report.html import write_html_report
    from circuitlab.viz.fragments import Section

    sections, markdown = [], []
    for name, study in _studies().items():
        path = out / name / "results.json"
        if not path.is_file():
            continue
        result = StudyResult.from_dict(json.loads(path.read_text()))
        md = study_markdown(study, result)
        markdown.append(md)
        body = md.splitlines()[2:]   # the heading is the section's title
        parts: list[Any] = _html(body)
        parts += list(study.figures(result).values())
        sections.append(Section(name, study.title, parts))
    if not sections:
        return None
    atomic_write_text(out / "report.md", "\n".join(markdown))
    return write_html_report(out, sections, title="circuitlab studies", subtitle=str(out))

