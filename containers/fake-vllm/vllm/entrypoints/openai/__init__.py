"""vLLM's OpenAI server (see vllm/__init__.py)."""
