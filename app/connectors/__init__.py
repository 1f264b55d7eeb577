"""Adapters out: how a decision reaches the cluster (virtual: orchestrators long-poll SQL-backed
decisions; none: advisory). The Kubernetes connector arrives with throughput scaling."""
