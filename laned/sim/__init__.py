"""The vLLM-compatible simulated engine (standard library only)."""
