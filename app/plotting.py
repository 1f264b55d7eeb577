"""What the two HTML reports (app/reports/diagnostics_html.py, the live diagnostics; app/sim/replay/report.py,
a replay's) draw alike with plotly, so that one chart reads the same in both."""

from __future__ import annotations

from typing import Any

# A log axis labelled once per decade; the digits between are unlabelled minor ticks with a grid.
# Plotly's default labels some of them ("1000, 5, 2, 100, 5"), which read as values.
LOG_AXIS: dict[str, Any] = {"dtick": 1, "minor": {"dtick": "D1", "ticks": "outside", "showgrid": True}}
