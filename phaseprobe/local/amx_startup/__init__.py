"""A start-up hook for the vLLM processes phaseprobe starts (see :mod:`.sitecustomize`)."""
