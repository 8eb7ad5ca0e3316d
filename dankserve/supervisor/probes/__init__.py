"""Loopback HTTP edges to a deployment's server and their verdicts: health, liveness, sleep routes, warm-up,
the observatory."""
