"""The one URL type (issue 43 item 9): a base URL is normalised once, by one set of rules,
shown redacted once, and joined by path. The cases come from the checkers it replaces
(``normalize_base_url``'s endpoints as newcomers type them, ``check_base_url``'s query tokens,
the span stores' and the fleet's malformed ports and hosts)."""

from __future__ import annotations

import pytest

from phaseprobe.endpoint_url import EndpointUrl, UrlError, host_of, host_port_of
from phaseprobe.errors import ConfigError
from phaseprobe.redact import forget_secrets, redact_urls_in


@pytest.fixture(autouse=True)
def _no_secrets_left():
    yield
    forget_secrets()


@pytest.mark.parametrize(
    "typed, url",
    [
        ("http://host:8000/", "http://host:8000"),
        ("host:8000", "http://host:8000"),  # as vLLM's log prints it
        ("  http://host:8000  ", "http://host:8000"),
        ("HTTPS://gw.example/vllm/", "https://gw.example/vllm"),  # behind a path prefix
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://host:8000/v1", "http://host:8000/v1"),  # kept unless the caller drops it
    ],
)
def test_typed_urls_are_normalised(typed, url):
    parsed = EndpointUrl.parse(typed)
    assert parsed.url == url and str(parsed) == url and parsed.redacted == url


@pytest.mark.parametrize(
    "typed, url",
    [
        ("http://host:8000/v1", "http://host:8000"),  # the OpenAI client's base_url
        ("http://host:8000/v1/", "http://host:8000"),
        ("127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("https://gw.example/vllm/v1", "https://gw.example/vllm"),
        ("http://host:8000/v10", "http://host:8000/v10"),
    ],
)
def test_a_suffix_the_caller_names_is_dropped(typed, url):
    assert EndpointUrl.parse(typed, drop_suffix="/v1").url == url


@pytest.mark.parametrize(
    "typed, says",
    [
        ("ftp://host:8000", "the scheme must be http:// or https://"),
        ("ws://127.0.0.1:8000", "the scheme must be http:// or https://"),
        ("http:///v1", "names no host"),
        ("", "names no host"),
        ("http://", "names no host"),
        ("http://host:80x0", "not a URL"),
        ("http://host:99999", "not a URL"),
        ("http://[oops", "not a URL"),
        ("http://:8000", "names no host"),
        ("not a url", "not a URL [(]it holds a space"),
        ("http://my host:8000", "not a URL [(]it holds a space"),
        ("http://host:8000/a\tb", "not a URL [(]it holds a space or a control character"),
    ],
)
def test_unusable_urls_are_one_typed_error_saying_what_to_type(typed, says):
    with pytest.raises(UrlError, match=says) as info:
        EndpointUrl.parse(typed, what="endpoint")
    assert isinstance(info.value, ConfigError)  # exit 2, as every refused option
    assert str(info.value).startswith("endpoint ")
    assert "http://" in str(info.value)  # an example to type


@pytest.mark.parametrize(
    "typed, shown",
    [
        ("http://prom:9090/?access_token=SECRETQ", "http://prom:9090/?access_token=<redacted>"),
        ("http://prom:9090#token=SECRETQ", "http://prom:9090#token=<redacted>"),
        # a secret under a harmless name is a secret all the same
        ("http://prom:9090/api?plain=SECRETQ", "http://prom:9090/api?plain=<redacted>"),
        ("http://prom:9090/#SECRETQ", "http://prom:9090/#<redacted>"),
        ("http://u:SECRETPW@prom:9090/?x=1", "http://prom:9090/?x=<redacted>"),
        ("http://u:SECRET/PW@prom:9090/?x=1", "http://prom:9090/?x=<redacted>"),
    ],
)
def test_a_query_or_fragment_is_refused_naming_no_value(typed, shown):
    with pytest.raises(UrlError, match="takes no [?]query or #fragment; use the env") as info:
        EndpointUrl.parse(typed, what="Prometheus URL", query_hint="use the env")
    assert str(info.value).startswith(f"Prometheus URL {shown!r}: ")
    assert info.value.shown == shown


def test_credentials_are_sent_but_shown_redacted_and_registered():
    parsed = EndpointUrl.parse("http://user:SECRETPW@host:8000/")
    assert str(parsed) == "http://user:SECRETPW@host:8000"  # what the HTTP library sends
    assert parsed.redacted == "http://host:8000"
    assert "SECRETPW" not in repr(parsed)  # a traceback's locals, a log line
    assert parsed.has_userinfo and parsed.sends_basic_auth
    user_only = EndpointUrl.parse("http://user@host:8000")
    assert user_only.has_userinfo and not user_only.sends_basic_auth  # requests sends none
    # registered when read: a server echoing the password back is masked wherever it goes
    assert "SECRETPW" not in redact_urls_in("bad password SECRETPW")
    # a raw '/' in the password ends urllib's authority early: still parsed and redacted
    slashed = EndpointUrl.parse("http://user:pa/ss@host:8000")
    assert slashed.redacted == "http://host:8000" and slashed.port == 8000
    with pytest.raises(UrlError) as info:
        EndpointUrl.parse("ftp://user:SECRETPW@host")
    assert "SECRETPW" not in str(info.value) and info.value.shown == "ftp://host"


def test_join_appends_a_path_with_its_redacted_form():
    base = EndpointUrl.parse("http://user:SECRETPW@host:8000/vllm/")
    metrics = base.join("/metrics")
    assert str(metrics) == "http://user:SECRETPW@host:8000/vllm/metrics"
    assert metrics.redacted == "http://host:8000/vllm/metrics"
    assert base.join("v1/models").url == "http://user:SECRETPW@host:8000/vllm/v1/models"
    query = base.join("/api/v1/query?query=up&token=T0KENVALUE")
    assert "T0KENVALUE" not in query.redacted and "query=up" in query.redacted


def test_a_known_url_is_kept_and_redacted_once():
    known = EndpointUrl.known("http://u:SECRETPW@host:8000/")
    assert str(known) == "http://u:SECRETPW@host:8000" and known.redacted == "http://host:8000"
    assert known.join("/v1/completions").redacted == "http://host:8000/v1/completions"


def test_parts_are_read_once_from_the_redacted_form():
    parsed = EndpointUrl.parse("https://[::1]/x")
    assert (parsed.scheme, parsed.host, parsed.port) == ("https", "::1", 443)
    assert EndpointUrl.parse("host").port == 80
    assert not parsed.has_userinfo and not parsed.sends_basic_auth
    with pytest.raises(AttributeError):
        parsed.url = "http://elsewhere"  # type: ignore[misc]  # immutable


@pytest.mark.parametrize(
    "stored, host",
    [
        ("http://host:8000", "host"),
        ("host:8000", "host"),
        ("http://u:p@[::1]:8000/x", "::1"),
        ("http://[oops", None),
        ("", None),
    ],
)
def test_host_of_a_stored_endpoint_is_read_leniently(stored, host):
    assert host_of(stored) == host


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://u:p@host:8000/x", "host:8000"),
        ("http://[::1]:8000", "[::1]:8000"),
        ("http://[oops/x", None),
        ("http://[::1:8000", None),
        ("no url", None),
        ("[oops]:8000", None),
    ],
)
def test_host_port_leaves_the_credentials_out(url, shown):
    assert host_port_of(url) == shown
