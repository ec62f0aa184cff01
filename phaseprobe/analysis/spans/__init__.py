"""vLLM's request spans read together: what ran beside a request (context, interference) and
the live summary of a window of spans."""
