"""Views of what the planner stored: this room turns tick records into what people and dashboards
read, the planner's own Prometheus gauges (`metrics`) and the HTML diagnostics report of a
deployment's stored ticks (`diagnostics_html`). It may import `app.core` (the decision types the
records carry) and `app.store`, and nothing from `app.api` or `app.workers`: those call into it."""
