"""``phaseprobe model``: the measurements behind the capacity model (fit) and its check."""
