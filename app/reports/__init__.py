"""Views of what the planner stored: this room turns tick records into what people and dashboards
read, the planner's own Prometheus gauges (`metrics`) and the HTML diagnostics report of a
deployment's stored ticks (the `diagnostics` package). It may import `app.core` (the decision
types the records carry), `app.store` and `app.plotting` (what it draws alike with the replay's
report), and nothing from `app.api` or `app.workers`: those call into it."""
