"""Real services for the tests: a private Podman service, stand-in GPUs, a local registry, images.

Each piece is a context manager that sets itself up and removes what it made, so the pytest
fixtures (tests/conftest.py) and the benchmarks (bench/) share them. Everything needs root on a
Debian 12 host with the packages of scripts/apt-packages.txt; `missing_requirements()` says what
is absent so the fixtures can skip instead of failing elsewhere.
"""
