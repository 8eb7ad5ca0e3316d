#!/usr/bin/env python3
"""`vllm` of the stand-in image (installed as /usr/local/bin/vllm); also `python3 vllm.py serve MODEL ...`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from fake_vllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
