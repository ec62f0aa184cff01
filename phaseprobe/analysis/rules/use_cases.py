"""What each use case calls fast enough: the latency targets the rules judge against.

Kept apart from the rules, with no imports, because the CLI names them in its help text
(``check --use-case``) and ``--help`` must not load the rules' readers to print four numbers.
"""

from __future__ import annotations

__all__ = ["USE_CASE_TTFT_S", "USE_CASE_TPOT_S"]

# TTFT a user perceives as immediate, per use case (issue 8; user-selectable with --use-case).
USE_CASE_TTFT_S: dict[str, float] = {"voice": 0.150, "code": 0.200, "chat": 0.500, "batch": 2.0}

# Time per output token a user of each use case reads as fluent (mean over the window): the
# TPOT bottleneck rule's default target, overridden with --tpot-target. Voice must keep ahead
# of speech with room for synthesis; code completion is read as it streams and wants speed;
# chat at reading speed (~10 tokens/s); batch only cares about the whole.
USE_CASE_TPOT_S: dict[str, float] = {"voice": 0.050, "code": 0.030, "chat": 0.100, "batch": 0.250}
