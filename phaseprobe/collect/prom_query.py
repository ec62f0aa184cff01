"""The named PromQL queries (``phaseprobe/queries/*.promql``) run against one Prometheus.

:func:`named_queries` opens the client from the user's options (bearer token from the
environment, TLS verification, timeout) and asks once which vLLM metric spellings the server
holds; :class:`NamedQueries` then runs catalog queries at an instant or over a range. With
several queries an empty one is reported beside the others; a single empty query is the
caller's error. The catalog (:func:`load_catalog`, :class:`Query`) and its metric-name helpers
are the query catalog's, named here for the commands and the Grafana room that read them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from phaseprobe.errors import ConfigError, EmptyResult
from phaseprobe.inputs import require_input
from phaseprobe.sources.prometheus import DEFAULT_TOKEN_ENV, NamedResult, PrometheusClient
from phaseprobe.sources.query_catalog import (
    Query,
    load_catalog,
    metric_names,
    newest_name,
    spellings,
)

__all__ = [
    "DEFAULT_TOKEN_ENV",
    "NamedQueries",
    "NamedResult",
    "Query",
    "load_catalog",
    "metric_names",
    "named_queries",
    "newest_name",
    "spellings",
]


@dataclass(frozen=True)
class NamedQueries:
    """Catalog queries against one open Prometheus, rendered for the metric names it holds."""

    client: PrometheusClient
    names: dict[str, str]  # newest vLLM name → the spelling this server holds

    @property
    def shown_url(self) -> str:
        """The server's URL as it may be shown (no credentials)."""
        return self.client.shown_url

    def instant(
        self, queries: Sequence[Query], *, selector: str, window: str, at: float | None
    ) -> list[NamedResult | EmptyResult]:
        """Each query at ``at`` (unix s; None: now)."""
        return _each(
            queries,
            lambda q: self.client.run(q, selector=selector, window=window, at=at, names=self.names),
        )

    def ranged(
        self,
        queries: Sequence[Query],
        *,
        start: float,
        end: float,
        step: float | str,
        selector: str,
        window: str,
    ) -> list[NamedResult | EmptyResult]:
        """Each query from ``start`` to ``end`` (unix s) at ``step``."""
        return _each(
            queries,
            lambda q: self.client.run_range(
                q,
                start=start,
                end=end,
                step=step,
                selector=selector,
                window=window,
                names=self.names,
            ),
        )


@contextmanager
def named_queries(
    url: str,
    *,
    token_env: str | None = None,
    insecure: bool = False,
    ca_bundle: str | None = None,
    timeout_s: float = 10.0,
) -> Iterator[NamedQueries]:
    """NamedQueries on the Prometheus at ``url``; raises ConfigError for a bad token or CA.

    Closed on leaving. The bearer token comes from ``token_env`` (it must be set), else from
    :data:`DEFAULT_TOKEN_ENV` when set. An unset ``token_env`` or a ``ca_bundle`` that is no
    readable file or directory (said as what it is: missing, a FIFO, a symlink loop…) is
    refused before any request."""
    if token_env and token_env not in os.environ:
        raise ConfigError(f"--token-env {token_env}: that environment variable is not set")
    if ca_bundle is not None and not os.path.isdir(ca_bundle):  # a c_rehash'ed CA directory
        require_input(ca_bundle, lambda why: ConfigError(f"--ca-bundle {ca_bundle}: {why}"))
    verify: bool | str = False if insecure else (ca_bundle or True)
    with PrometheusClient(
        url, token_env=token_env or DEFAULT_TOKEN_ENV, verify=verify, timeout_s=timeout_s
    ) as client:
        yield NamedQueries(client, client.names_map())


def _each(
    queries: Sequence[Query], run: Callable[[Query], NamedResult]
) -> list[NamedResult | EmptyResult]:
    """Several queries: an empty one is reported beside the others. A single one: its
    EmptyResult is the command's error."""
    results: list[NamedResult | EmptyResult] = []
    for q in queries:
        try:
            results.append(run(q))
        except EmptyResult as exc:
            if len(queries) == 1:
                raise
            results.append(exc)
    return results
