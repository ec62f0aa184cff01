"""The quoting of a served model's name in a selector, checked against a real Prometheus
(issue 33 item 7): a label value holding ``"``, ``\\``, a newline or a would-be injection,
exposed on a ``/metrics`` page and scraped, is found by the selector phaseprobe builds
(``model_name=`` + :func:`~phaseprobe.sources.query_catalog.promql_string`) and by nothing
else. promtool (in the hostile suite) says the query parses; this says it means the value.
No vLLM: a canned ``/metrics`` page and the Debian Prometheus (a few seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from phaseprobe.sources.prometheus import PrometheusClient
from phaseprobe.sources.query_catalog import promql_string
from phaseprobe.testing.prometheus_server import DEFAULT_BINARY, PrometheusServer
from tests.hostile.cases import CannedServer, Reply

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(DEFAULT_BINARY).exists(), reason="prometheus not installed"),
]

NAMES = ['a"b', "a\\b", "x\ny", 'm"} or vector(1) or up{x="', "plain"]


def _exposition_value(value: str) -> str:
    """The text format's label-value escapes (\\\\, \\", \\n): how vLLM's client writes them."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    lines = ["# TYPE phaseprobe_quoting gauge"]
    lines += [
        f'phaseprobe_quoting{{model_name="{_exposition_value(n)}"}} {i}'
        for i, n in enumerate(NAMES)
    ]
    page = ("\n".join(lines) + "\n").encode()
    routes = {"q": {"/metrics": Reply(200, page, "text/plain; version=0.0.4")}}
    with CannedServer(routes) as target, PrometheusServer([target.url("q/metrics")]) as prom:
        prom.wait_for_scrapes(2)
        yield prom


@pytest.mark.parametrize("name", NAMES, ids=["quote", "backslash", "newline", "injection", "plain"])
def test_the_quoted_name_selects_exactly_its_series(prometheus, name):
    with PrometheusClient(prometheus.url) as client:
        samples = client.instant_query(f"phaseprobe_quoting{{model_name={promql_string(name)}}}")
    assert [(s.labels.get("model_name"), s.value) for s in samples] == [
        (name, float(NAMES.index(name)))
    ]
