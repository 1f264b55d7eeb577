"""The simulated world: the latency truth, the engines, the cluster and its router, the frontend's
counters, and the workloads that arrive at it."""
