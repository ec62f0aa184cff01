"""Span stores that can only hand back spans (Jaeger; Tempo's search): the window's request
spans are fetched once, as records, and summarized here with the same arithmetic as the SQLite
store (:func:`phaseprobe.sources.span_stores.model.aggregate_spans`). Their HTTP calls share one
error mapping, so every store words an unreachable address or refused credentials the same way.

One read (a public method: ``check``, ``span_summary``…) may take many requests (Jaeger asks
each service in turn; Tempo adds TraceQL metric queries to a search at its limit). Each answer
has its own deadline, and the whole read has one more (``?deadline_s=``, by default
:data:`READ_TIMEOUTS` timeouts): a Jaeger knowing 3,000 services was asked about each, one after
another, for over 300 s. Past it the read ends in a SpanStoreError naming the store.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import SplitResult

import requests

from phaseprobe.errors import (
    ConfigError,
    PhaseprobeError,
    SpanStoreAuthError,
    SpanStoreError,
    SpanStoreSchemaError,
    SpanStoreUnreachable,
)
from phaseprobe.records import RequestSpan
from phaseprobe.sources.http_deadline import AnswerTooLarge, bounded_request
from phaseprobe.sources.span_stores import model
from phaseprobe.sources.span_stores.model import SpanAggregate

__all__ = [
    "FetchedSpans",
    "get_json",
    "one_read",
    "query_number",
    "shaped",
    "DEFAULT_LOOKBACK_S",
    "LOOKBACK_LIMIT_S",
    "MAX_ANSWER_BYTES",
]

# A window with no start reads this far back (these stores search a time range, always).
DEFAULT_LOOKBACK_S = 3600.0
LOOKBACK_LIMIT_S = 30 * 86400.0  # ?lookback_s= at most: a month of spans is no window
# One answer of a span store, decompressed: a window of 100,000 request spans in OTLP JSON is
# about 150 MB. Past this, the store is asked for a shorter window (lookback_s) or fewer traces.
MAX_ANSWER_BYTES = 256 << 20
# A whole answer, from the connection to its last byte, within this many timeouts.
_DEADLINE_TIMEOUTS = 6
# A whole read (every answer one public method asks for) within this many timeouts, unless
# ?deadline_s= says otherwise: 90 s with the 10 s timeout.
READ_TIMEOUTS = 9

_T = TypeVar("_T")


def query_number(
    query: Mapping[str, str],
    key: str,
    default: float,
    where: str,
    *,
    low: float,
    high: float,
    integer: bool = False,
) -> float:
    """The URL option ``?key=`` as a finite number in [low, high] (``default`` when absent).
    Raises ConfigError naming the store and the option for anything else."""
    text = query.get(key)
    if text is None:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise ConfigError(
            f"span store {where}: ?{key}={text[:40]!r}: give {kind} in [{low:g}, {high:g}]"
        )
    return value


def get_json(
    session: requests.Session,
    url: str,
    params: dict[str, Any],
    where: str,
    timeout_s: float,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """GET ``url`` and its JSON object, read whole within ``_DEADLINE_TIMEOUTS`` timeouts (or
    ``deadline_s`` s, when sooner) and :data:`MAX_ANSWER_BYTES`. Raises SpanStoreUnreachable
    (nothing answers, or too slowly), SpanStoreAuthError (401/403) or SpanStoreError (another
    HTTP error, too large, not a JSON object), each naming ``where``."""
    whole_s = timeout_s * _DEADLINE_TIMEOUTS
    try:
        resp = bounded_request(
            session,
            "GET",
            url,
            params=params,
            max_bytes=MAX_ANSWER_BYTES,
            timeout_s=timeout_s,
            deadline_s=whole_s if deadline_s is None else min(whole_s, deadline_s),
            what=f"span store {where}",
        )
    except AnswerTooLarge as e:
        raise SpanStoreError(
            where, f"{e}: ask for a shorter window (?lookback_s=) or fewer traces (?limit=)"
        ) from None
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
        doc = resp.json()
    except ValueError:
        raise SpanStoreError(
            where, f"{resp.url.split('?')[0]} answered with no JSON: {resp.text[:120]!r}"
        ) from None
    if not isinstance(doc, dict):
        raise SpanStoreSchemaError(
            where,
            f"{resp.url.split('?')[0]} answered JSON that is not an object ({type(doc).__name__})",
        )
    return doc


def shaped(method: Callable[..., _T]) -> Callable[..., _T]:
    """A method that reads a store's JSON answers (``self.where`` names the store): an answer
    of another shape than the API documents (a list where an object belongs, a number that is
    text) raises SpanStoreSchemaError instead of a Python error from deep in the parsing."""

    @functools.wraps(method)
    def read(self: Any, *args: Any, **kwargs: Any) -> _T:
        try:
            return method(self, *args, **kwargs)
        except PhaseprobeError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
            raise SpanStoreSchemaError(
                self.where,
                f"an answer is not shaped as the store's API documents "
                f"({type(e).__name__}: {str(e)[:160]})",
            ) from None

    return read


def one_read(method: Callable[..., _T]) -> Callable[..., _T]:
    """A public method of a :class:`FetchedSpans`: every answer it asks for (through
    ``_get``) shares one deadline, the reader's ``deadline_s`` from its start. A read inside
    another (``span_summary`` calling ``check``'s fetch) keeps the outer one's."""

    @functools.wraps(method)
    def read(self: Any, *args: Any, **kwargs: Any) -> _T:
        with self._one_read():
            return method(self, *args, **kwargs)

    return read


class FetchedSpans:
    """The :class:`~phaseprobe.sources.span_stores.model.SpanReader` methods over
    :meth:`_fetch` (the request spans that finished in a window, with their attributes)."""

    def __init__(
        self,
        scheme: str,
        url: SplitResult,
        query: Mapping[str, str],
        *,
        default_port: int,
        default_limit: int,
        timeout_s: float,
        session: requests.Session | None,
    ) -> None:
        """A store at ``scheme://host:port`` (``url``'s, ``default_port`` unless given) read over
        HTTP(S): ``?secure=1`` for https, ``?lookback_s=`` in s, ``?limit=`` (``default_limit``)
        the store's own cap on what one search returns. Raises ConfigError naming the option
        when ``lookback_s`` or ``limit`` is not a number in range."""
        host = f"{url.hostname}:{url.port or default_port}"
        http = "https" if query.get("secure", "").lower() in ("1", "true") else "http"
        self._base = f"{http}://{host}"
        self._where = f"{scheme}://{host}"
        self._lookback_s = query_number(
            query, "lookback_s", DEFAULT_LOOKBACK_S, self._where, low=1, high=LOOKBACK_LIMIT_S
        )
        self._limit = int(
            query_number(
                query, "limit", default_limit, self._where, low=1, high=10**7, integer=True
            )
        )
        self._timeout_s = timeout_s
        self._deadline_s = query_number(
            query,
            "deadline_s",
            timeout_s * READ_TIMEOUTS,
            self._where,
            low=1,
            high=LOOKBACK_LIMIT_S,
        )
        self._http = session or requests.Session()
        self._notes: tuple[str, ...] = ()
        self._clock = time.monotonic
        self._reading = threading.local()  # .until: the read's deadline (monotonic s)

    @contextmanager
    def _one_read(self) -> Iterator[None]:
        if getattr(self._reading, "until", None) is not None:
            yield
            return
        self._reading.until = self._clock() + self._deadline_s
        self._reading.answers = 0
        try:
            yield
        finally:
            self._reading.until = None

    def _late(self) -> SpanStoreError:
        progress = self._progress()
        return SpanStoreError(
            self._where,
            f"no complete read within {self._deadline_s:g} s (the whole read's deadline, "
            f"after {getattr(self._reading, 'answers', 0)} answer(s)"
            + (f"; {progress}" if progress else "")
            + "): ask for less (a shorter ?lookback_s=, fewer traces with ?limit=), or allow "
            "more with ?deadline_s=",
        )

    def _progress(self) -> str:
        """What the read had done when its deadline passed, in words (none by default)."""
        return ""

    def _get(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        """One answer, within what is left of the read's deadline (when inside one)."""
        until = getattr(self._reading, "until", None)
        if until is None:
            return get_json(self._http, self._base + path, params, self._where, self._timeout_s)
        left = until - self._clock()
        if left <= 0:
            raise self._late()
        try:
            doc = get_json(
                self._http, self._base + path, params, self._where, self._timeout_s, left
            )
        except SpanStoreUnreachable:
            if self._clock() >= until - 0.05:  # the read's deadline cut this answer
                raise self._late() from None
            raise
        self._reading.answers += 1
        return doc

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

    @one_read
    def check(self) -> None:
        """Returns None once the last ``lookback_s`` seconds could be fetched. Raises what the
        fetch raises: :class:`~phaseprobe.errors.SpanStoreUnreachable`, ``SpanStoreAuthError``,
        ``NoRequestSpans`` (Jaeger) or ``SpanStoreError`` (HTTP error, not the store's JSON)."""
        since, until = self._bounds(None, None)
        self._fetch(since, until)

    @one_read
    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """The window's summary (counts, token sums, p50/p90/p99 in s) per ``by`` group,
        computed here from the fetched records; a window without start reads the last
        ``lookback_s`` s. Raises what :meth:`check` raises."""
        agg = model.aggregate_spans(
            self._spans(since_ns, until_ns),
            self._where,
            since_ns=since_ns,
            until_ns=until_ns,
            by=by,
        )
        if self._notes:
            agg = SpanAggregate(**{**agg.__dict__, "notes": agg.notes + self._notes})
        return agg

    @one_read
    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` requests that finished last in the window, oldest first. Raises what
        :meth:`check` raises."""
        return model.newest_finished(self._spans(since_ns, until_ns), n)

    @one_read
    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` longest requests of the window (by e2e, else span duration, in s),
        slowest first. Raises what :meth:`check` raises."""
        return model.slowest(self._spans(since_ns, until_ns), n)

    @one_read
    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """Every request that finished in the window, by start. Raises what :meth:`check`
        raises."""
        return sorted(self._spans(since_ns, until_ns), key=lambda sp: (sp.start_ns, sp.span_id))

    @one_read
    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose request id is or contains ``request_id``, with its attributes, found
        by the search of the last ``lookback_s`` s only; None if none. Raises what
        :meth:`check` raises."""
        since, until = self._bounds(None, None)
        return model.by_request_id(self._fetch(since, until), request_id)

    @one_read
    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        """The spans of ``span``'s service and instance that started from
        :data:`~phaseprobe.sources.span_stores.model.NEIGHBOUR_HORIZON_NS` before it up to its
        end, ``span`` included, by start. Raises what :meth:`check` raises."""
        fetched = self._fetch(
            span.start_ns - model.NEIGHBOUR_HORIZON_NS, span.end_ns + model.NEIGHBOUR_HORIZON_NS
        )
        return model.overlapping((sp for sp, _ in fetched), span)

    @one_read
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
