"""Prometheus rule files: reading them for ``phaseprobe alerts lint`` (rules are built in
``analysis/alerts``)."""
