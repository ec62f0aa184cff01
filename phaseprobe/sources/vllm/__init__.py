"""vLLM's own outputs: its /metrics page, the OpenAI-compatible stream, and its OTLP request
spans."""
