"""The planner: SLA-driven autoscaling for disaggregated LLM inference."""

__version__ = "0.2.0"
