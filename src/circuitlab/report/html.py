"""One self-contained HTML file from report sections: plotly.js inlined once (from the installed plotly
package), every figure as its compact JSON (viz.plotly_render.compact_json: what repeats written once), unpacked by
the page's clUnpack and drawn by Plotly.newPlot, plain CSS, no network access at all.

    sections = [Section("card", "Model card", [table_html(rows)]), Section("curves", "Training", [fig])]
    write_html_report("runs/x", sections, title="my run")     # -> runs/x/report.html
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from circuitlab.atomic import atomic_write_text, json_text
# Section and the fragments live with the views (viz/fragments.py), below the methods that build sections.
from circuitlab.viz.fragments import (Section, bullet_list, details, esc, heading, json_block,  # noqa: F401
                                      key_value_table, markdown_lite, paragraph, table_html)

REPORT_FILE = "report.html"


CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dee7; --bg: #ffffff; --soft: #f5f7fa; --accent: #2a5db0; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: var(--fg);
       background: var(--bg); }
header { padding: 1.5rem 2rem 1rem; border-bottom: 1px solid var(--line); background: var(--soft); }
header h1 { margin: 0 0 .25rem; font-size: 1.6rem; }
header p { margin: 0; color: var(--muted); }
.layout { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; flex: 0 0 14rem; padding: 1rem 1rem 1rem 2rem; max-height: 100vh; overflow-y: auto; }
nav h2 { font-size: .8rem; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); margin: 0 0 .5rem; }
nav ol { margin: 0; padding-left: 1.2rem; }
nav li { margin: .2rem 0; }
nav a { color: var(--accent); text-decoration: none; }
nav a:hover { text-decoration: underline; }
main { flex: 1 1 auto; min-width: 0; padding: 0 2rem 4rem 1rem; max-width: 72rem; }
section { padding-top: 1rem; border-bottom: 1px solid var(--line); padding-bottom: 1.5rem; }
section h2 { font-size: 1.3rem; margin: .8rem 0 .4rem; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 .4rem; }
.intro { color: var(--muted); margin: 0 0 .8rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid var(--line); padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.ok { color: #1b7f3a; } td.fail { color: #b3261e; }
.label { display: inline-block; padding: 0 .4rem; margin: 0 .2rem .1rem 0; border-radius: .6rem; background: #e3ecfa;
         color: #1f4a8f; font-size: .8rem; white-space: nowrap; }
.evidence { font-size: .8rem; color: var(--muted); }
.figure { margin: .5rem 0 1.2rem; overflow-x: auto; }
ul.summary { margin: .3rem 0 1rem; padding-left: 1.3rem; }
details { margin: .4rem 0 1rem; } summary { cursor: pointer; color: var(--accent); }
pre { background: var(--soft); padding: .6rem; overflow-x: auto; font-size: .8rem; }
@media (max-width: 900px) { .layout { display: block; } nav { position: static; max-height: none; } }
"""


# ---------------------------------------------------------------------------- figures and pages


CONFIG = {"responsive": True, "displaylogo": False}
UNSAFE_LT = re.compile(r"<(?=/|!--|script)", re.IGNORECASE)


def figure_html(fig, div_id: str, templates: list[str] | None = None) -> str:
    """A figure (a viz FigureSpec or a plotly figure) as a div plus the script that draws it (plotly.js and
    page_js(templates) must be on the page; templates: the page's list, see viz.plotly_render.compact_json)."""
    from circuitlab.viz.plotly_render import compact_json  # plotly: imported when a page has figures

    data = script_safe(json_text(compact_json(fig, templates), separators=(",", ":")))
    config = json_text(CONFIG, separators=(",", ":"))
    return (f'<div class="figure"><div id="{div_id}"></div></div>\n'
            f'<script>(function () {{ var f = clUnpack({data}); Plotly.newPlot("{div_id}", f.data, f.layout, {config}); }})();'
            "</script>")


def page_js(templates: list[str]) -> str:
    """The page's unpacking helper (clUnpack) and its templates, once."""
    from circuitlab.viz.plotly_render import UNPACK_JS

    return script_safe(UNPACK_JS.replace("@TEMPLATES@", "[" + ",".join(templates) + "]"))


def script_safe(text: str) -> str:
    """JSON (or script) text safe inside <script>: a "<" that could end the element or open a comment or another
    script ("</", "<!--", "<script", as in a token's text) written as \\u003c, which JSON and JavaScript read back
    as "<". The other "<" (plotly's "<br>" in hovers) stay as they are: plotly's own to_json escapes every one."""
    return UNSAFE_LT.sub(r"\\u003c", text)


def plotly_js() -> str:
    """plotly.js as shipped inside the plotly package (no network)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().replace("</script", "<\\/script")


def render_html(sections: Sequence[Section], title: str = "circuitlab report", subtitle: str = "") -> str:
    """The whole page as a string; sections without parts are left out."""
    sections = [s for s in sections if s is not None and s.parts]
    toc = "".join(f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in sections)
    body, n_fig = [], 0
    templates: list[str] = []
    for s in sections:
        out = [f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>']
        if s.intro:
            out.append(f'<p class="intro">{esc(s.intro)}</p>')
        for part in s.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                n_fig += 1
                out.append(figure_html(part, f"fig-{n_fig}", templates))
        out.append("</section>")
        body.append("\n".join(out))
    generated = time.strftime("%Y-%m-%d %H:%M")
    sub = f"{esc(subtitle)} · " if subtitle else ""
    scripts = f"<script>{plotly_js()}</script>\n<script>{page_js(templates)}</script>" if n_fig else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n{scripts}\n</head>\n<body>\n"
            f"<header><h1>{esc(title)}</h1><p>{sub}generated by circuitlab on {generated}</p></header>\n"
            f'<div class="layout"><nav><h2>Contents</h2><ol>{toc}</ol></nav>\n<main>\n'
            + "\n".join(body) + "\n</main></div>\n</body>\n</html>\n")


def write_html_report(out: str | Path, sections: Sequence[Section], title: str = "circuitlab report",
                      subtitle: str = "") -> Path:
    """Write the report; out is a directory (-> out/report.html) or a file path ending in .html."""
    out = Path(out)
    path = out if out.suffix == ".html" else out / REPORT_FILE
    atomic_write_text(path, render_html(sections, title, subtitle))
    return path
