"""`vllm.entrypoints.cli.main:main`, the `vllm` CLI's entry point: the stand-in's CLI (`main()` reads
`sys.argv[1:]`, `serve MODEL ...`, as vLLM's does). Also `python -m vllm.entrypoints.cli.main serve ...`."""

import sys

from fake_vllm.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
