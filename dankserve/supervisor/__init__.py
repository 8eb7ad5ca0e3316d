"""The supervisor: deployment lifecycles, restart policy, boot learning, and the daemon loop."""
