"""What the two HTML reports (app/reports/diagnostics/, the live diagnostics; app/sim/replay/report.py,
a replay's) draw alike with plotly, so that one chart reads the same in both: panels in one
column with a legend beside each, hover text, and the self-contained page around the figure.

Imports nothing from `app`: both reports import it, and they live in rooms that may not import
each other."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

# A log axis labelled once per decade; the digits between are unlabelled minor ticks with a grid.
# Plotly's default labels some of them ("1000, 5, 2, 100, 5"), which read as values.
LOG_AXIS: dict[str, Any] = {"dtick": 1, "minor": {"dtick": "D1", "ticks": "outside", "showgrid": True}}

# The page's style, around the rules a report adds of its own (see `html_page`).
_STYLE_PAGE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.6em; }
"""
_STYLE_SUMMARY = """table.summary { border-collapse: collapse; margin-bottom: 1em; }
table.summary th, table.summary td { padding: 0.25em 0.9em; border-bottom: 1px solid #ddd; text-align: left; }
table.summary th { font-weight: 600; color: #555; }
"""


def legend_name(panel: int) -> str:
    """The layout key of panel `panel`'s own legend (1-based, the subplot's row)."""
    return "legend" if panel == 1 else f"legend{panel}"


def lay_out_panels(fig: go.Figure, panels: int, *, height: int, legend_x: float) -> None:
    """The layout of a figure of `panels` subplots in one column (traces put in `legend_name` of
    their panel): `height` pixels, and one legend per panel, its top at the panel's top and its
    left at `legend_x` (paper units, right of the plot). A single legend of many entries cannot say
    which panel is which."""
    legends: dict[str, Any] = {}
    for panel in range(1, panels + 1):
        top = fig.get_subplot(panel, 1).yaxis.domain[1]
        legends[legend_name(panel)] = {
            "x": legend_x,
            "y": top,
            "yanchor": "top",
            "xanchor": "left",
            "font": {"size": 11},
        }
    fig.update_layout(
        height=height,
        margin={"l": 70, "r": 40, "t": 40, "b": 50},
        template="plotly_white",
        hovermode="closest",
        **legends,
    )


def hover_text(lines: Iterable[str], paragraph: str) -> str:
    """Hover text: `lines`, then `paragraph` wrapped at 90 characters. Plotly renders hover text as
    a small HTML subset, and its hover boxes do not wrap by themselves: every line is escaped, and
    they are joined by <br>."""
    out = [html.escape(line) for line in lines]
    out += [html.escape(line) for line in textwrap.wrap(paragraph, 90)]
    return "<br>".join(out)


def figure_html(fig: go.Figure) -> str:
    """The figure as a <div> with plotly.js inline before it: the page needs nothing else."""
    return fig.to_html(
        full_html=False, include_plotlyjs=True, config={"responsive": True, "displaylogo": False}
    )


def html_page(
    title: str, rows: Iterable[tuple[str, str]], body: str, *, style_rules: Iterable[str] = ()
) -> str:
    """A report's page as one HTML string: `title` as its title and heading, `rows` (name, value)
    as the summary table below it, then `body` as is (HTML: a `figure_html`, notes). The title and
    the rows are escaped. `style_rules` are CSS rules of the report's own, one a line."""
    summary = "\n".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>" for name, value in rows
    )
    style = _STYLE_PAGE + "".join(f"{rule}\n" for rule in style_rules) + _STYLE_SUMMARY
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<table class="summary">\n{summary}\n</table>\n'
        f"{body}\n</body>\n</html>\n"
    )
