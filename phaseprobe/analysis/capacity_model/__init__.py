"""A capacity model of one vLLM instance: a step cost fitted from probes (``fit``), a
simulation of vLLM v1's scheduler over a workload (``simulate``, ``workload``), and the
percentiles, stability and largest SLO rate read from it (``slo``). Pure: no I/O.
"""
