"""Ask a Prometheus server for PromQL results, as plain records, whatever vLLM version it scrapes.

Built on ``prometheus-api-client`` (its ``PrometheusConnect`` without the pandas extras). What
this layer adds:

- results as frozen :class:`Sample` / :class:`Series` records (unix-second timestamps, float
  values; ``NaN`` kept, it is what ``0/0`` over an idle window honestly is);
- typed errors that name the server's URL (credentials stripped): :class:`PrometheusUnreachable`,
  :class:`PromQLError` quoting the server's own message, :class:`PrometheusHTTPError`, and
  :class:`EmptyResult` showing the selector;
- a bearer token read from an environment variable (``PHASEPROBE_PROM_TOKEN`` unless told
  otherwise), kept in the request headers only: never in a message, a repr or a log line;
- version awareness: :meth:`PrometheusClient.names_map` lists the ``vllm`` metric names the
  server holds and maps each newest name to the spelling present, for ``Query.render``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests
from urllib3.util.retry import Retry

from phaseprobe.endpoint_url import EndpointUrl
from phaseprobe.errors import (
    ConfigError,
    EmptyResult,
    PrometheusHTTPError,
    PrometheusUnreachable,
    PromQLError,
)
from phaseprobe.redact import (
    header_secret_problem,
    register_secret,
)
from phaseprobe.sources.http_deadline import AnswerTooLarge, mount_deadlines, within
from phaseprobe.sources.query_catalog import Query, bare_selector, load_catalog, resolve_names

__all__ = [
    "DEFAULT_TOKEN_ENV",
    "PHASE_QUERIES",
    "NamedResult",
    "PrometheusClient",
    "Sample",
    "Series",
    "phase_means",
]

DEFAULT_TOKEN_ENV = "PHASEPROBE_PROM_TOKEN"
# Only vLLM's names matter for version detection; asking for them alone keeps the answer small
# on a fleet Prometheus holding tens of thousands of metric names.
_VLLM_NAMES_MATCH = '{__name__=~"vllm[:_].+"}'
# The per-request means an experiment summary shows beside the direct-scrape attribution.
PHASE_QUERIES = (
    "avg_queue_time",
    "avg_prefill_time",
    "avg_decode_time",
    "avg_inference_time",
    "ttft_mean",
    "e2e_mean",
    "decode_share",
)
_BASELINE_METRIC = "vllm:e2e_request_latency_seconds_count"
# A range query over a fleet for a day is a few MB of JSON; an answer past this (or one that
# expands past it: a gzip bomb from a proxy) is not read.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def _json_value(v: float) -> float | str | None:
    """JSON has no NaN/Inf: NaN (no data in the window) becomes null, infinities Prometheus'
    own spelling."""
    if math.isnan(v):
        return None
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return v


@dataclass(frozen=True)
class Sample:
    """One value of an instant vector (or a scalar: empty labels)."""

    labels: dict[str, str]
    t: float  # unix seconds
    value: float

    def to_dict(self) -> dict[str, Any]:
        """The sample as a JSON-ready dict (``t`` in unix seconds; NaN as null, infinities as
        ``+Inf``/``-Inf``)."""
        return {"labels": self.labels, "t": self.t, "value": _json_value(self.value)}


@dataclass(frozen=True)
class Series:
    """One series of a range query: ``points`` are (unix seconds, value)."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """The series as a JSON-ready dict: ``points`` as [unix seconds, value] pairs (NaN as null,
        infinities as ``+Inf``/``-Inf``)."""
        return {"labels": self.labels, "points": [[t, _json_value(v)] for t, v in self.points]}


@dataclass(frozen=True)
class NamedResult:
    """A catalog query's answer: the PromQL actually sent and its samples or series."""

    name: str
    unit: str
    expr: str
    samples: tuple[Sample, ...] = ()
    series: tuple[Series, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the query returned neither samples nor series."""
        return not self.samples and not self.series


def _sample(item: Any) -> Sample:
    t, v = item["value"]
    return Sample(labels=dict(item.get("metric", {})), t=float(t), value=float(v))


def _samples(result: Any) -> list[Sample]:
    # custom_query hands back data.result: a list of vector items, or [t, "v"] for a scalar.
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return [Sample(labels={}, t=float(result[0]), value=float(result[1]))]
    return [_sample(item) for item in result]


def _series(result: Any) -> list[Series]:
    return [
        Series(
            labels=dict(item.get("metric", {})),
            points=tuple((float(t), float(v)) for t, v in item["values"]),
        )
        for item in result
    ]


class PrometheusClient:
    """A Prometheus HTTP API client. ``session`` and ``environ`` are injectable for tests."""

    def __init__(
        self,
        url: str,
        *,
        token_env: str | None = DEFAULT_TOKEN_ENV,
        verify: bool | str = True,
        timeout_s: float = 10.0,
        retries: int = 1,
        session: requests.Session | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        base = EndpointUrl.parse(
            url,
            what="Prometheus URL",
            query_hint="pass a bearer token through the "
            f"environment (${token_env or DEFAULT_TOKEN_ENV}, --token-env)",
            example="http://127.0.0.1:9090",
        )
        self.url = str(base)
        self.shown_url = base.redacted
        self.timeout_s = timeout_s
        self.token_env = token_env
        token = environ.get(token_env) if token_env else None
        register_secret(token)  # masked wherever it comes back (an echoing error body)
        problem = header_secret_problem(token) if token else None
        if problem:
            raise ConfigError(f"the Prometheus token in ${token_env} cannot be sent: {problem}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session or requests.Session()
        self._session.verify = verify
        # The library hides the response behind an exception string; keep it to read the
        # server's own error message and status.
        self._last: requests.Response | None = None
        self._session.hooks["response"].append(self._remember)
        # Few, quick retries: an unreachable server should be reported in about a second, not
        # after the library's default 3 retries with a 1 s backoff.
        retry = Retry(
            total=retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            raise_on_status=False,
        )
        # Imported here: the library is wanted when a client is made, not when a command's
        # --help imports this module.
        from prometheus_api_client import PrometheusConnect

        self._prom = PrometheusConnect(
            url=self.url, headers=headers, retry=retry, session=self._session, timeout=timeout_s
        )
        # the library mounted its retrying adapter for this URL: the same retries, and a
        # total deadline per call (a proxy trickling an answer must not hang a query)
        mount_deadlines(self._session, self.url, retry)
        self._names: dict[str, str] | None = None

    def __repr__(self) -> str:  # the token lives in headers only; never show them
        return f"PrometheusClient({self.shown_url!r})"

    def _remember(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._last = response

    def close(self) -> None:
        """Closes the HTTP session."""
        self._session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw API -------------------------------------------------------------------------------

    def _call(self, what: str, expr: str | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from prometheus_api_client import PrometheusApiClientException

        self._last = None
        try:
            with within(max(self.timeout_s, 1.0) * 3, what, max_bytes=MAX_ANSWER_BYTES):
                return fn(*args, **kwargs)
        except RecursionError:
            raise PrometheusUnreachable(
                self.shown_url, f"{what} answered JSON nested too deeply to read"
            ) from None
        except requests.exceptions.SSLError as exc:
            raise PrometheusUnreachable(
                self.shown_url,
                f"TLS failed ({_reason(exc)}); pass a CA bundle or disable verification",
            ) from None
        except requests.Timeout as exc:
            total = "(total deadline)" in str(exc)
            raise PrometheusUnreachable(
                self.shown_url, str(exc) if total else f"no answer within {self.timeout_s:g} s"
            ) from None
        except AnswerTooLarge as exc:
            raise PrometheusUnreachable(self.shown_url, f"{what}: {exc}") from None
        except PrometheusApiClientException:
            raise self._http_error(what, expr) from None
        except requests.exceptions.JSONDecodeError:  # also a RequestException: test it first
            raise PrometheusUnreachable(
                self.shown_url, f"{what} did not answer with Prometheus API JSON"
            ) from None
        except requests.RequestException as exc:
            raise PrometheusUnreachable(self.shown_url, _reason(exc)) from None
        except (ValueError, KeyError, TypeError):
            # 200 but not the API's JSON: a proxy's login page, or vLLM's URL given by mistake.
            raise PrometheusUnreachable(
                self.shown_url, f"{what} did not answer with Prometheus API JSON"
            ) from None

    def _http_error(self, what: str, expr: str | None) -> Exception:
        response = self._last
        if response is None:
            return PrometheusUnreachable(self.shown_url, f"{what} failed without a response")
        status = response.status_code
        message, error_type = response.text.strip()[:200] or str(response.reason), ""
        try:
            body = response.json()
        except ValueError:
            body = None  # a proxy's HTML or plain text: quote its start
        if isinstance(body, dict) and body.get("error"):
            message, error_type = str(body["error"]), str(body.get("errorType", ""))
        if status in (400, 422) and error_type in ("bad_data", "execution") and expr is not None:
            return PromQLError(self.shown_url, expr, message)
        if status in (401, 403):
            hint = (
                f"the token in ${self.token_env} was refused"
                if self._has_token()
                else f"set ${self.token_env} to a bearer token"
                if self.token_env
                else "this server needs a bearer token"
            )
            return PrometheusHTTPError(self.shown_url, status, f"{message} ({hint})")
        if status == 404:
            return PrometheusUnreachable(
                self.shown_url, f"HTTP 404 for {what}: no Prometheus API at this URL"
            )
        return PrometheusHTTPError(self.shown_url, status, message)

    def _has_token(self) -> bool:
        return "Authorization" in (self._prom.headers or {})

    def instant_query(self, expr: str, *, at: float | None = None) -> list[Sample]:
        """Evaluate ``expr`` now or at unix time ``at``; an empty list when nothing matches."""
        params = {} if at is None else {"time": f"{at:.3f}"}
        result = self._call("/api/v1/query", expr, self._prom.custom_query, expr, params=params)
        return self._parse(result, _samples)

    def range_query(self, expr: str, start: float, end: float, step: float | str) -> list[Series]:
        """Evaluate ``expr`` from ``start`` to ``end`` (unix seconds) every ``step``."""
        # The library rounds start/end to whole seconds; the params override keeps milliseconds.
        params = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
        result = self._call(
            "/api/v1/query_range",
            expr,
            self._prom.custom_query_range,
            expr,
            datetime.fromtimestamp(start, UTC),
            datetime.fromtimestamp(end, UTC),
            str(step),
            params=params,
        )
        return self._parse(result, _series)

    def _parse(self, result: Any, parse: Any) -> Any:
        try:
            return parse(result)
        except (ValueError, KeyError, TypeError, AttributeError):  # items not objects, etc.
            raise PrometheusUnreachable(self.shown_url, "unexpected result shape") from None

    def metric_names(self) -> set[str]:
        """The vLLM metric names the server holds (both ``vllm:`` and ``vllm_`` spellings)."""
        values = self._call(
            "/api/v1/label/__name__/values",
            None,
            self._prom.get_label_values,
            "__name__",
            params={"match[]": _VLLM_NAMES_MATCH},
        )
        if values is None:
            return set()
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise PrometheusUnreachable(
                self.shown_url, "/api/v1/label/__name__/values did not answer with a list of names"
            )
        return set(values)

    def names_map(self, *, refresh: bool = False) -> dict[str, str]:
        """Newest vLLM name → the spelling this server holds (detected once, then cached)."""
        if self._names is None or refresh:
            self._names = resolve_names(self.metric_names())
        return dict(self._names)

    # -- catalog queries -----------------------------------------------------------------------

    def run(
        self,
        query: Query,
        *,
        selector: str = "",
        window: str = "5m",
        at: float | None = None,
        names: Mapping[str, str] | None = None,
        allow_empty: bool = False,
    ) -> NamedResult:
        """One catalog query at one instant, rendered for this server's metric names."""
        expr = query.render(selector, window, self.names_map() if names is None else names)
        samples = self.instant_query(expr, at=at)
        if not samples and not allow_empty:
            raise EmptyResult(self.shown_url, query.name, bare_selector(selector))
        return NamedResult(query.name, query.unit, expr, samples=tuple(samples))

    def run_range(
        self,
        query: Query,
        *,
        start: float,
        end: float,
        step: float | str,
        selector: str = "",
        window: str = "5m",
        names: Mapping[str, str] | None = None,
        allow_empty: bool = False,
    ) -> NamedResult:
        """One catalog query over a time range."""
        expr = query.render(selector, window, self.names_map() if names is None else names)
        series = self.range_query(expr, start, end, step)
        if not series and not allow_empty:
            raise EmptyResult(self.shown_url, query.name, bare_selector(selector))
        return NamedResult(query.name, query.unit, expr, series=tuple(series))


def phase_means(
    client: PrometheusClient,
    *,
    first_sent: float,
    end: float,
    selector: str = "",
    queries: Sequence[str] = PHASE_QUERIES,
    catalog: Mapping[str, Query] | None = None,
) -> dict[str, float | None]:
    """Per-request means over an experiment, from PromQL: the seed's
    ``increase(_sum[w]) / increase(_count[w])`` evaluated at ``end`` over a window reaching back
    exactly to the last scrape before ``first_sent`` (unix s, when the first measured request
    was sent). ``end`` must come after a scrape that followed the last request's finish.

    The window is fitted to the baseline sample (1 ms to spare) rather than padded by a scrape
    interval: a padded window can take in the sample before the baseline, and so a warm-up
    request; a fitted one leaves ``increase()`` nothing to extrapolate at the start, so the
    ratio is exact. None: no data (NaN or no series)."""
    catalog = catalog if catalog is not None else load_catalog()
    names = client.names_map()
    metric = names.get(_BASELINE_METRIC, _BASELINE_METRIC)
    bare = bare_selector(selector)
    stamps = client.instant_query(f"max(timestamp({metric}{{{bare}}}))", at=first_sent)
    if not stamps or math.isnan(stamps[0].value):
        raise EmptyResult(client.shown_url, f"a scrape of {metric} before the experiment", bare)
    window = f"{max(1, round((end - stamps[0].value) * 1000) + 1)}ms"
    means: dict[str, float | None] = {}
    for name in queries:
        result = client.run(
            catalog[name], selector=bare, window=window, at=end, names=names, allow_empty=True
        )
        value = result.samples[0].value if len(result.samples) == 1 else math.nan
        means[name] = None if math.isnan(value) else value
    return means


def _reason(exc: BaseException) -> str:
    """A short cause (``[Errno 111] Connection refused``), not urllib3's paragraph with the
    full query string in it."""
    match = _ERRNO.search(str(exc))
    return match.group(0).strip() if match else type(exc).__name__
