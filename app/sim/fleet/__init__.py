"""The fleet's replay: several deployments sharing one GPU budget, their hardware variants, and
the fleet's clairvoyant bound (docs/fleet.md)."""
