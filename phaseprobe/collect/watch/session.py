"""The one way into a watch: :func:`open_watch` wires :class:`WatchOptions` (receiving spans,
or reading a fleet's span store); :class:`~phaseprobe.collect.watch.pace.Pace` keeps the time
for either.

    with open_watch(options, notices) as watch:
        for tick in watch.ticks():      # a snapshot every refresh, until the duration ends
            draw(tick)                  # (or watch.idle(): no view, --json or a pipe)
        result = watch.finish(interrupted=False)

Ctrl-C (KeyboardInterrupt) ends ``ticks`` and ``idle`` wherever they wait; the caller then
still asks for ``finish``: the summary over the whole watch is the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phaseprobe.collect.notices import Notices
from phaseprobe.collect.watch.options import WatchOptions

if TYPE_CHECKING:
    from phaseprobe.collect.watch.read import ReadWatch
    from phaseprobe.collect.watch.receive import ReceiveWatch

__all__ = ["open_watch"]


def open_watch(options: WatchOptions, notices: Notices) -> ReceiveWatch | ReadWatch:
    """The watch ``options`` ask for, to be entered (``with``): a
    :class:`~phaseprobe.collect.watch.read.ReadWatch` with ``spans_from``, else a
    :class:`~phaseprobe.collect.watch.receive.ReceiveWatch`. Raises nothing itself: entering
    it raises what opening raises (ConfigError, MetricsUnavailable, SpanStoreError…)."""
    if options.spans_from is not None:
        from phaseprobe.collect.watch.read import ReadWatch

        return ReadWatch(options, notices)
    from phaseprobe.collect.watch.receive import ReceiveWatch

    return ReceiveWatch(options, notices)
