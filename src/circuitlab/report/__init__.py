"""The self-contained HTML report (report.html): plotly.js inlined, no network access.

    from circuitlab.report import report_for_run
    report_for_run("runs/demo")            # -> runs/demo/report.html (a training run, demo or interpret output)

Building blocks: Section and write_html_report (circuitlab.report.html); RunData, load_run,
build_sections (circuitlab.report.build), the per-section builders (circuitlab.report.sections). See docs/report.md.
"""
from circuitlab.report.build import (RunData, build_sections, load_run, report_for_run, write_demo_report,
                                     write_interpret_report)
from circuitlab.report.html import REPORT_FILE, Section, render_html, write_html_report

__all__ = ["REPORT_FILE", "RunData", "Section", "build_sections", "load_run", "render_html", "report_for_run",
           "write_demo_report", "write_html_report", "write_interpret_report"]
