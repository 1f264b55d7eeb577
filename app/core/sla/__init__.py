"""SLA scaling, the planner's own algorithm: settings, learned state, demand forecast, capacity
formulas and the step."""
