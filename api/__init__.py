"""The OpenAI-compatible HTTP layer: request schemas, validation, SSE streaming."""
