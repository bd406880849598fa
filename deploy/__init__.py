"""Scaling out: nano-vLLM replicas on Ray Serve behind a prefix-aware router."""
