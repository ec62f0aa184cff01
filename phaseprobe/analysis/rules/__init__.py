"""Checklist rules, grouped by the evidence they read; registered in
:data:`phaseprobe.analysis.checklist.RULES` (the one place that lists them)."""
