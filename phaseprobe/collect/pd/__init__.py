"""Disaggregated prefill/decode: a request served by a prefill instance and a decode instance.

``collector`` measures probe runs on such a pair: through a router in P/D mode, or sending the
two legs itself as vLLM's example proxies do; each run keeps both legs, the hand-over and
whether its KV was transferred or recomputed (:mod:`phaseprobe.analysis.pd`).
"""
