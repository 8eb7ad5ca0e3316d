"""vLLM's entry points, as far as dankserve's launcher imports them (see vllm/__init__.py)."""
