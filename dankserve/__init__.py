"""dankserve: plans, starts and keeps the vLLM OpenAI server serving on a GPU host."""

__version__ = "0.1.0"
