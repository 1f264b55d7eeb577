"""The diagnostics report: one deployment's stored tick records as one self-contained HTML page
(plotly.js inline), the reference's DiagnosticsRecorder report (§7.2) served by the API.

The reference's panels in its order, one above the other on one shared UTC time axis (it lays
them out 6 x 2; one column lines every panel up at the same instant and leaves room for a legend
beside each): replicas (ready, target, decisions, throughput lower bound); request rate observed
and predicted; observed TTFT and ITL against the SLA; estimated TTFT and ITL against the SLA;
per-engine prefill queues; per-engine decode KV load; the FPM regressions' sample counts (where
the reference plots engine capacity, which the records do not hold); sequence lengths observed
and predicted; the load and the throughput decisions coloured by reason.

SLA scaling (the default algorithm) fills the same panels from its own fields: the traffic the
tick observed (request rate, TTFT, ITL, lengths), the demand it sized for, the prefill wait and
service it modelled, the prompts queued, its latency models' records; and five panels of its own
below them: the wishes per role, the forecast headroom, the measured scale and capacity
correction, the lead, and its decisions by reason. A panel with no data in the range says so,
and why, instead of drawing empty axes.

All text from records and configuration is escaped: worker ids come from the engines.

The modules, each importing only those above it:

- `read`: a stored record as the few numbers the panels draw (`_Tick`), and the series' gaps;
- `panels`: the panels' layout (titles, numbers, scalar series) and the line panels;
- `decisions`: the decision panels, runs of one reason as bars with their detail on hover;
- `page`: the figure and the page (`render_diagnostics_report`).

Nothing is re-exported here: import a name from the module that defines it.
"""
