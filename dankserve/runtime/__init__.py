"""Runtimes execute a workload spec: Podman containers, or plain processes."""
