"""`python3 .../launcher/__main__.py --run-dir DIR` (in a container) or `python -m dankserve.launcher`."""

import os
import sys

if not __package__:
    # Run by path: make the directory above importable and import this package by its own name.
    _here = os.path.dirname(os.path.abspath(__file__))
    # The script's own directory would shadow top-level modules (vLLM's imports) with ours.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))
    __package__ = os.path.basename(_here)
    __import__(__package__)

from .service import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
