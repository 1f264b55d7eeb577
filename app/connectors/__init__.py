"""Adapters out: how a decision reaches the cluster (virtual: orchestrators long-poll SQL-backed
decisions; kubernetes: the DynamoGraphDeployment's replicas are patched; none: advisory)."""
