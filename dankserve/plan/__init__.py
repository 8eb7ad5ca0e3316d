"""The planner: pure functions from host, deployment and vLLM capabilities to a vLLM command line."""
