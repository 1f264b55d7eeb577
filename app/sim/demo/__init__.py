"""`planner demo`: the real service against the simulated cluster on a shared, sped-up clock (the
simulator thread, the frontend endpoint, FPM publishers, the service process, the orchestrator)."""
