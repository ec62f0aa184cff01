"""Span stores that can only hand back spans (Jaeger; Tempo's search): the window's request
spans are fetched once, as records, and summarized here with the same arithmetic as the SQLite
store (:func:`phaseprobe.sources.span_stores.model.aggregate_spans`). Their HTTP calls share one
error mapping, so every store words an unreachable address or refused credentials the same way.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from phaseprobe.errors import SpanStoreAuthError, SpanStoreError, SpanStoreUnreachable
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores import model
from phaseprobe.sources.span_stores.model import SpanAggregate

__all__ = ["FetchedSpans", "get_json", "DEFAULT_LOOKBACK_S"]

# A window with no start reads this far back (these stores search a time range, always).
DEFAULT_LOOKBACK_S = 3600.0


def get_json(
    session: requests.Session, url: str, params: dict[str, Any], where: str, timeout_s: float
) -> Any:
    """GET ``url`` and its JSON body, or the typed error naming ``where``."""
    try:
        resp = session.get(url, params=params, timeout=timeout_s)
    except (requests.ConnectionError, requests.Timeout) as e:
        raise SpanStoreUnreachable(where, f"nothing answers ({type(e).__name__})") from None
    if resp.status_code in (401, 403):
        raise SpanStoreAuthError(
            where,
            f"HTTP {resp.status_code}: the store refused the request (credentials or permissions)",
        )
    if resp.status_code >= 400:
        raise SpanStoreError(
            where, f"HTTP {resp.status_code} from {resp.url.split('?')[0]}: {resp.text[:300]!r}"
        )
    try:
        return resp.json()
    except ValueError:
        raise SpanStoreError(
            where, f"{resp.url.split('?')[0]} answered with no JSON: {resp.text[:120]!r}"
        ) from None


class FetchedSpans:
    """The :class:`~phaseprobe.sources.span_stores.model.SpanReader` methods over
    :meth:`_fetch` (the request spans that finished in a window, with their attributes)."""

    def __init__(self, where: str, lookback_s: float = DEFAULT_LOOKBACK_S) -> None:
        self._where = where
        self._lookback_s = lookback_s
        self._notes: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """The store as the user named it (``tempo://host:port``, ``jaeger://host:port``)."""
        return self._where

    def close(self) -> None:
        """Returns None and does nothing: the HTTP session is not closed here."""
        pass

    def _fetch(self, since_ns: int, until_ns: int) -> list[tuple[RequestSpan, dict[str, Any]]]:
        raise NotImplementedError

    def _bounds(self, since_ns: int | None, until_ns: int | None) -> tuple[int, int]:
        until = until_ns if until_ns is not None else time.time_ns()
        since = since_ns if since_ns is not None else until - round(self._lookback_s * 1e9)
        return since, until

    def _spans(self, since_ns: int | None, until_ns: int | None) -> list[RequestSpan]:
        since, until = self._bounds(since_ns, until_ns)
        return [sp for sp, _ in self._fetch(since, until) if model.finished_in(sp, since, until)]

    def check(self) -> None:
        """Returns None once the last ``lookback_s`` seconds could be fetched. Raises what the
        fetch raises: :class:`~phaseprobe.errors.SpanStoreUnreachable`, ``SpanStoreAuthError``,
        ``NoRequestSpans`` (Jaeger) or ``SpanStoreError`` (HTTP error, not the store's JSON)."""
        since, until = self._bounds(None, None)
        self._fetch(since, until)

    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> SpanAggregate:
        """The window's summary (counts, token sums, p50/p90/p99 in s), computed here from the
        fetched records; a window without start reads the last ``lookback_s`` s. Raises what
        :meth:`check` raises."""
        agg = model.aggregate_spans(
            self._spans(since_ns, until_ns), self._where, since_ns=since_ns, until_ns=until_ns
        )
        if self._notes:
            agg = SpanAggregate(**{**agg.__dict__, "notes": agg.notes + self._notes})
        return agg

    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` requests that finished last in the window, oldest first. Raises what
        :meth:`check` raises."""
        return model.newest_finished(self._spans(since_ns, until_ns), n)

    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` longest requests of the window (by e2e, else span duration, in s),
        slowest first. Raises what :meth:`check` raises."""
        return model.slowest(self._spans(since_ns, until_ns), n)

    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """Every request that finished in the window, by start. Raises what :meth:`check`
        raises."""
        return sorted(self._spans(since_ns, until_ns), key=lambda sp: (sp.start_ns, sp.span_id))

    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose request id is or contains ``request_id``, with its attributes, found
        by the search of the last ``lookback_s`` s only; None if none. Raises what
        :meth:`check` raises."""
        since, until = self._bounds(None, None)
        return model.by_request_id(self._fetch(since, until), request_id)

    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        """The spans of ``span``'s service and instance that started from
        :data:`~phaseprobe.sources.span_stores.model.NEIGHBOUR_HORIZON_NS` before it up to its
        end, ``span`` included, by start. Raises what :meth:`check` raises."""
        fetched = self._fetch(
            span.start_ns - model.NEIGHBOUR_HORIZON_NS, span.end_ns + model.NEIGHBOUR_HORIZON_NS
        )
        return model.overlapping((sp for sp, _ in fetched), span)

    def spans_of_traces(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, list[RequestSpan]]:
        """Trace id (lowercase hex) → its request spans by start, for the ids given that have
        spans started from ``since_ns`` until now (without it: any the search of the last
        ``lookback_s`` s returns). Raises what :meth:`check` raises."""
        wanted = {t.lower() for t in trace_ids}
        since, until = self._bounds(since_ns, None)
        out: dict[str, list[RequestSpan]] = {}
        for sp, _ in sorted(self._fetch(since, until), key=lambda f: (f[0].start_ns, f[0].span_id)):
            if sp.trace_id in wanted and (since_ns is None or sp.start_ns >= since_ns):
                out.setdefault(sp.trace_id, []).append(sp)
        return out
