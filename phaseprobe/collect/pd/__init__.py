"""Disaggregated prefill/decode: a request served by a prefill instance and a decode instance.

``topology`` names the pair (and the router in front); ``sender`` sends one request over it:
through a router in P/D mode, or as the two legs vLLM's example proxies send; ``collector``
measures probe runs on it, each keeping both legs, the hand-over and whether its KV was
transferred or recomputed (:mod:`phaseprobe.analysis.pd.legs`). The interplay probes (``prefix``,
``batch``, ``interfere``) send their requests through the same sender.
"""
