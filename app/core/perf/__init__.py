"""The performance model: measured profiles, their interpolation, and the engines' forward-pass records."""
