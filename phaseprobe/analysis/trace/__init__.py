"""Profiler traces (Nsight Systems, PyTorch/Kineto): the timeline, its streamed fold, the NVTX
layer times, and the one trace summary the CLI, probe, checklist and dashboard share."""
