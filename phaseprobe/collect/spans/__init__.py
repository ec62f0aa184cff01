"""vLLM's request spans: the OTLP receiver, imports, where a fleet keeps them, retention,
and attaching a run's own span."""
