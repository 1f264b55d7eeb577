"""`planner replay`: one policy steering the simulated world through a trace on simulated time,
scored against the clairvoyant oracle (the replay file, the policies, the oracle, the outputs and
the report)."""
