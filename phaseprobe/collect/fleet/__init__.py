"""A fleet: several vLLM replicas behind one router (vllm-router, production-stack, llm-d…).

``targets`` names the replicas (``--replica NAME=URL``) and checks them before any run;
``scrape`` reads every replica's own ``/metrics`` (never the router's) and tells which replica
served a run. The statistics over replicas are in :mod:`phaseprobe.analysis.fleet_stats`.
"""
