"""vLLM's `vllm` CLI (see vllm/__init__.py)."""
