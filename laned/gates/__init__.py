"""The acceptance gates and the benchmark, run against a lane's OpenAI-compatible API."""
