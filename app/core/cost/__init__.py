"""What a deployment's engines cost: GPU-hours and cost billed, the idle share, and the saving
against a static allocation for the same history (docs/operations.md, "Cost").

- `account`: the rule. Per tick, the engines billed per role (`billed_engines`) and those ready
  with no work (`idle_engines`) as a `CostSample`; `advance` bills the interval since the previous
  sample at that sample's counts and keeps the running `CostTotals` the tick record stores.
- `report`: a window of samples as the figures `/diagnostics/cost` and the dashboard show: per
  role, per hour and per day, the idle share, the history's peak and the static allocation's cost.

Pure: times are seconds on the caller's clock (a tick's `now`), never read here.
"""
