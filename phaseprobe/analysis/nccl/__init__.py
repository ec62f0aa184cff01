"""NCCL analysis: the summary of a parsed log, its warnings, and the report across files."""
