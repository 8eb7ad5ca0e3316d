"""Shared fixtures. Harness fixtures for real services live in tests/harness/."""
