"""The hand-over cost a prefill/decode what-if uses (``model predict --pd P:D``): the median
``hand_over_s`` of the P/D runs in the store (issue 28's ``probe --prefill URL --decode URL``),
taken from the newest experiment that has them, counting only requests whose KV was
transferred (a recomputed prompt's hand-over is no transfer), and saying where it came from.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

from phaseprobe.errors import ConfigError
from phaseprobe.store import Store

__all__ = ["measured_hand_over"]


def measured_hand_over(store_path: Path) -> tuple[float, str]:
    """(hand-over in s, where it came from in words). ConfigError when the store has no P/D
    run whose KV was transferred."""
    if not store_path.is_file():
        raise ConfigError(
            f"--pd needs a hand-over: give --hand-over-ms, or measure one with `phaseprobe probe "
            f"--prefill URL --decode URL` (no experiment store at {store_path})"
        )
    with Store(store_path, readonly=True) as store:
        for exp in reversed(store.experiments()):
            values = [
                r.pd.hand_over_s
                for r in store.runs(int(exp["id"]))
                if r.pd is not None and r.pd.hand_over_s is not None and r.pd.kv == "transferred"
            ]
            if values:
                return median(values), (
                    f"median of {len(values)} measured in experiment {exp['id']} "
                    f"({exp['name']}, KV transferred)"
                )
    raise ConfigError(
        f"--pd needs a hand-over: no P/D run with its KV transferred in {store_path}; give "
        "--hand-over-ms, or measure one with `phaseprobe probe --prefill URL --decode URL`"
    )
