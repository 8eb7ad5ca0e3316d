"""The deployments together: swap groups (pure decisions, roster, fit, bound, checks and their verification)
and the GPUs' boot slots and start-up claims."""
