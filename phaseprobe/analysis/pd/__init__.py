"""Disaggregated prefill/decode: a run's two legs (KV transferred or recomputed), their spans
joined, a live window's KV path, the interplay probes on a pair, and the KV hand-over's bound."""
