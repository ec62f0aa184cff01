"""GPUs: NVML (the one boundary faked in tests), the sampler that reads it, and
nvidia-smi/DCGM imports."""
