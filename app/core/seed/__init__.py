"""The seed's two modes (the reference's throughput- and load-based scaling): profile replicas, traffic
predictors, FPM regressions and the load step."""
