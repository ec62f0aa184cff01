"""NVTX marks of phaseprobe's own client runs (domain ``phaseprobe``), so a probe run under
``nsys profile`` shows each run's phases on the timeline beside the server's kernels, with
the names :mod:`phaseprobe.sources.nsys.export` maps back to phases. A light module: the
probe's run loop imports it (no pandas), and every call is a no-op without the ``nvtx``
package or without a profiler attached."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["NVTX_DOMAIN", "nvtx_range", "NvtxPhases"]

NVTX_DOMAIN = "phaseprobe"


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range in domain ``phaseprobe`` (names the analysis maps to phases: ``run``,
    ``request``, ``first token`` → prefill, ``decode``), so a client run under ``nsys profile``
    shows the experiment on the timeline. Without the optional ``nvtx`` package (or without
    a profiler attached, where NVTX calls are no-ops) it costs nothing."""
    try:
        import nvtx
    except ImportError:
        yield
        return
    with nvtx.annotate(name, domain=NVTX_DOMAIN):
        yield


class NvtxPhases:
    """One streamed request's client-side phases as NVTX ranges in domain ``phaseprobe``:
    ``first token`` from the send to the first token event (what the analysis maps to
    prefill), then ``decode`` to the end of the stream. Start/end ranges, not push/pop: the
    token event is seen inside the stream's read loop. Feed it the raw SSE events
    (``StreamClient.stream(on_events=…)``); :meth:`end` closes what is open. Without the
    ``nvtx`` package, or without a profiler attached, every call is a no-op."""

    def __init__(self, chat: bool) -> None:
        from phaseprobe.sources.vllm.openai_stream import TokenEventCounter

        try:
            import nvtx
        except ImportError:
            nvtx = None
        self._nvtx = nvtx
        self._tokens = TokenEventCounter(chat)
        self._open = self._start("first token")
        self._decoding = False

    def _start(self, name: str) -> object | None:
        return None if self._nvtx is None else self._nvtx.start_range(name, domain=NVTX_DOMAIN)

    def on_events(self, raw: list[bytes]) -> None:
        """Ends the ``first token`` range and opens ``decode`` at the first token event among
        ``raw`` (raw SSE events); later calls do nothing."""
        if not self._decoding and self._tokens.feed(raw) > 0:
            self._decoding = True
            self.end()
            self._open = self._start("decode")

    def end(self) -> None:
        """Closes the open range, if any."""
        if self._open is not None and self._nvtx is not None:
            self._nvtx.end_range(self._open)
        self._open = None
