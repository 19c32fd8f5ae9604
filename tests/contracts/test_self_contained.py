"""The project stands on its own (issue 48): no tracked file names a path of a development machine, the README is a
front door of at most 15 KB, and every relative link and #anchor of README.md and docs/*.md resolves inside the
repository. Each detector is also run on a planted bad case, so that none of these checks can pass by finding
nothing."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 15 * 1024  # bytes; nanoGPT's, TransformerLens's and circuit-tracer's READMEs are 8-12 KB

# Paths of a machine the project was developed on, never of the repository: a worktree or scratch root, a sibling
# folder shared between checkouts, someone's home folder, and a design document the repository does not hold. Written
# split so that this file does not match itself.
MACHINE_PATHS = re.compile("|".join([
    r"/" + r"work/",                      # the development machine's checkouts
    r"\.\./" + r"shared\b",                # a folder beside the checkout
    r"/" + r"tmp/",                        # scratch space: say a folder of the user's instead
    r"/" + r"home/[a-z_][\w.-]*/",         # someone's home folder
    r"/" + r"Users/[A-Za-z][\w.-]*/",
    r"[A-Za-z]:\\" + r"Users\\",
]))
DESIGN = "DESIGN" + ".md"


def tracked_files() -> list[Path]:
    """The files git tracks, and the new ones it would (not ignored): a path is caught before it is committed."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def machine_paths(text: str, design_tracked: bool) -> list[str]:
    """Each line of `text` that names a development machine's path (or a design document the repository lacks)."""
    return [line.strip()[:160] for line in text.splitlines()
            if MACHINE_PATHS.search(line) or (not design_tracked and DESIGN in line)]


def test_no_tracked_file_names_a_path_of_a_development_machine():
    files = tracked_files()
    assert len(files) > 100 and any(f.name == "README.md" for f in files)  # git answered with the tree
    design_tracked = any(f.name == DESIGN for f in files)
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (figures, weights): no paths written by hand
        found += [f"{path.relative_to(ROOT)}: {line}" for line in machine_paths(text, design_tracked)]
    assert not found, "paths of a development machine (say them relative to the repository):\n" + "\n".join(found)


def test_the_path_detector_finds_planted_paths():
    for bad in ["see " + "/wor" + "k/main/src", "PYTHONPATH=../sha" + "red/lib", "out in /tm" + "p/demo",
                "cd /hom" + "e/alice/circuitlab", "the " + "DESI" + "GN.md floors"]:
        assert machine_paths(bad, design_tracked=False), bad
    for good in ["runs/demo/2l", "tests/contracts/test_layers.py", "docs/architecture.md", "a network/ folder",
                 "~/.cache/huggingface", "framework/s"]:
        assert not machine_paths(good, design_tracked=False), good
    assert not machine_paths("the " + "DESI" + "GN.md floors", design_tracked=True)


def test_the_readme_is_a_front_door_of_at_most_15_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size:,} bytes (at most {README_LIMIT:,}): move detail into docs/"


# ---- links ----------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", flags=re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", flags=re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside one is code, not a link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its words
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `doc` whose file is not in the repository, or whose #anchor is no heading there."""
    text = doc.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(CODE_SPAN.sub("", prose(text))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
            continue  # https:, mailto: ...: outside the repository by intent
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if root.resolve() not in where.parents and where != root.resolve():
            bad.append(f"{target}: outside the repository")
        elif not where.exists():
            bad.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{anchor} in {where.name}")
    return bad


def linked_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", linked_docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(doc):
    bad = broken_links(doc)
    assert not bad, f"{doc.relative_to(ROOT)}: links that do not resolve:\n" + "\n".join(bad)


def test_the_readme_links_into_docs():
    """The README is a door: it links to docs pages, and each link is checked above (not zero of them)."""
    targets = LINK.findall(prose((ROOT / "README.md").read_text()))
    assert sum(t.startswith("docs/") for t in targets) >= 5


def test_the_link_checker_finds_planted_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## Heads: which head, and why (`--qk`)\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("# Page\n\n## Local part\n\n"
                   "[ok](other.md) [ok](other.md#heads-which-head-and-why---qk) [ok](#local-part) [ok](other.md#twice-1)\n"
                   "[web](https://example.org/x.md#nope) `[code](missing.md)`\n"
                   "```\n[in a block](missing.md)\n```\n"
                   "[bad](missing.md) [bad](other.md#no-such-heading) [bad](#nowhere) [bad](../../outside.md)\n"
                   "![bad image](figures/none.png)\n")
    assert [b.split(":")[0] for b in broken_links(doc, tmp_path)] == [
        "missing.md", "other.md#no-such-heading", "#nowhere", "../../outside.md", "figures/none.png"]


def test_slugs_are_githubs():
    assert slug("Heads: which head carried an edge, and why it attended there") == \
        "heads-which-head-carried-an-edge-and-why-it-attended-there"
    assert slug("Training across ranks (`torchrun`)") == "training-across-ranks-torchrun"
    assert slug("Storage and compute dtypes: what fits where") == "storage-and-compute-dtypes-what-fits-where"
    assert slug("Run configs (`configs/`)") == "run-configs-configs"
