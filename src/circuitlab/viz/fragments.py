"""The HTML a report section is made of: Section (a title, parts and an intro) and the fragments its parts are
written with (paragraphs, headings, lists, tables). Below the methods (circuitlab/methods/), whose report sections
are built from them, and the page (report/html.py: write_html_report), which lays sections out."""
from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from circuitlab.atomic import json_text


@dataclass
class Section:
    """A titled part of the report. parts: HTML fragments (str) and figures (viz FigureSpecs or plotly
    figures), in order; intro: a sentence or two of plain text shown under the title."""

    id: str
    title: str
    parts: list[Any] = field(default_factory=list)
    intro: str = ""



# ---------------------------------------------------------------------------- fragments


def esc(x: Any) -> str:
    return html.escape(str(x))


def paragraph(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def heading(text: str) -> str:
    return f"<h3>{esc(text)}</h3>"


def bullet_list(lines: Iterable[str], cls: str = "summary") -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f'<ul class="{cls}">{items}</ul>' if items else ""


def table_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
               raw: Sequence[str] = ()) -> str:
    """A table from dict rows; columns default to the first row's keys. Floats get 4 significant
    digits and right alignment; columns named in raw hold HTML already (not escaped)."""
    if not rows:
        return ""
    columns = list(columns or rows[0].keys())
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            if c in raw:
                cells.append(f"<td>{v}</td>")
            elif isinstance(v, float):
                cells.append(f'<td class="num">{"" if v != v else f"{v:.4g}"}</td>')
            elif isinstance(v, int) and not isinstance(v, bool):
                cells.append(f'<td class="num">{v:,}</td>')
            else:
                cells.append(f"<td>{esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def key_value_table(items: Mapping[str, Any]) -> str:
    def fmt(v: Any) -> Any:
        if isinstance(v, bool):
            return str(v)
        return f"{v:,}" if isinstance(v, int) else f"{v:.4g}" if isinstance(v, float) else v

    rows = [{"field": k, "value": fmt(v)} for k, v in items.items() if v is not None and v != ""]
    return table_html(rows).replace("<thead><tr><th>field</th><th>value</th></tr></thead>", "")


def markdown_lite(text: str) -> str:
    """The little Markdown circuitlab's own reports use: paragraphs, "- " lists, **bold**, `code`."""
    import re

    def inline(s: str) -> str:
        s = esc(s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", s)

    out: list[str] = []
    items: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append("<p>" + inline(" ".join(para)) + "</p>")
            para.clear()
        if items:
            out.append('<ul class="summary">' + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("- ", "* ")):
            if para:
                flush()
            items.append(line[2:])
        elif not line:
            flush()
        else:
            if items:
                flush()
            para.append(line.lstrip("#").strip() if line.startswith("#") else line)
    flush()
    return "\n".join(out)


def details(summary: str, body_html: str) -> str:
    return f"<details><summary>{esc(summary)}</summary>{body_html}</details>"


def json_block(data: Any) -> str:
    return f"<pre>{esc(json_text(data, indent=2, default=str))}</pre>"
