"""One OpenAI-compatible endpoint in front of every deployment (docs/GATEWAY.md)."""
