"""The fleet: one GPU budget shared by several deployments' planners (docs/fleet.md). `step.py`
grants engines from their wishes (guarantees, priority, marginal value: `value.py`); `types.py`
the members, settings and decisions; `grants.py` what a grant does to one planner's decision;
`variants.py` hardware variants and how a wish splits across them."""
