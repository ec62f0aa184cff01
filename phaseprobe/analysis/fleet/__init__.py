"""Per-replica statistics of a fleet of vLLM replicas behind a router (pure; no I/O).

One role per module: ``frame`` (spans and runs → one frame tagged by replica, identity),
``table`` (per-replica percentiles), ``compare`` (each replica against the rest, with the A/B
engine's statistics), ``verdicts`` (straggler, imbalance), ``report`` (all of it at once).
The public names are re-exported by :mod:`phaseprobe.analysis.fleet_stats`.
"""
