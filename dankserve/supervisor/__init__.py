"""The supervisor: pure policy, learning and lifecycle decisions, and the daemon that runs them."""
