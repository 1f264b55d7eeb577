"""Stand-in for aisimulate_core (see bench/dynamo_shim/README.md): the two names ai-dynamo
1.6.1's planner imports, backed by aiconfigurator-core 0.12.0."""
