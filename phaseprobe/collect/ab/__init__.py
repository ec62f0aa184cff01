"""A/B experiments: playbooks read and checked, the engine that runs the arms interleaved
(fixed N or sequential), and P/D arms."""
