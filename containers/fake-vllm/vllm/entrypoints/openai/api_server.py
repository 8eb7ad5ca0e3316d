"""`vllm.entrypoints.openai.api_server`, which dankserve's launcher pre-imports: importing it pays what
importing vLLM costs (`FAKE_VLLM_IMPORT_SECONDS`, fake_vllm/imports.py), as the stand-in's CLI module does."""

import fake_vllm.cli  # noqa: F401  (the import is the point: it pays the import time once, in the zygote)
