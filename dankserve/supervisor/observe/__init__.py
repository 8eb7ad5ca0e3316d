"""Pure views: telemetry, status, the daemon's /metrics, boot-time predictions, vLLM's /metrics read."""
