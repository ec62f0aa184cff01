"""``watch``'s options (issue 31 item 4): building :class:`WatchOptions` registers every secret
the flags carry with the mask, and refuses what cannot work before anything starts; the
:class:`Pace` that both watch modes keep; the command's flags reach the options whole."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from phaseprobe.collect.watch.options import RECEIVER_ONLY, WatchOptions
from phaseprobe.collect.watch.pace import IDLE_TICK_S, Pace
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import cmd_watch
from phaseprobe.redact import MASK, forget_secrets, mask_secrets


@pytest.fixture(autouse=True)
def empty_secret_registry() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def _said(secret: str) -> str:
    """A line as an error or a server's echo would carry the secret."""
    return f"401 from collector: bad credentials {secret} (Bearer {secret})"


def test_the_receivers_token_is_read_from_its_variable_and_masked(monkeypatch):
    token = "otlp-T0ken-9f8e7d"
    monkeypatch.setenv("WATCH_TEST_TOKEN", token)
    assert mask_secrets(_said(token)) == _said(token)  # the fixture emptied the registry…
    options = WatchOptions(store_path="s.sqlite", token_env="WATCH_TEST_TOKEN")
    assert options.token == token
    masked = mask_secrets(_said(token))  # …building the options filled it
    assert token not in masked and masked.count(MASK) == 2
    assert token not in repr(options)


@pytest.mark.parametrize(
    ("field", "value", "password"),
    [
        ("spans_from", "clickhouse://otel:Ch-pass-4417@ch.internal:8123/otel", "Ch-pass-4417"),
        ("forward", "http://fwd:Fw-pass-5521@jaeger:4318", "Fw-pass-5521"),
        ("metrics", "http://mon:Mx-pass-6632@vllm:8000", "Mx-pass-6632"),
        ("replicas", ("r1=http://mon:Rp-pass-7743@10.0.0.5:8000",), "Rp-pass-7743"),
        ("replicas", ("http://mon:Rq-pass-8854@10.0.0.6:8000",), "Rq-pass-8854"),
    ],
)
def test_a_password_in_any_url_flag_is_masked_once_the_options_are_built(field, value, password):
    assert mask_secrets(_said(password)) == _said(password)
    WatchOptions(store_path="s.sqlite", **{field: value})
    assert password not in mask_secrets(_said(password))


def test_an_unset_or_empty_token_variable_is_refused(monkeypatch):
    monkeypatch.delenv("WATCH_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="--token-env WATCH_TEST_TOKEN: .* not set"):
        WatchOptions(store_path="s.sqlite", token_env="WATCH_TEST_TOKEN")
    monkeypatch.setenv("WATCH_TEST_TOKEN", "")
    with pytest.raises(ConfigError, match="not set"):
        WatchOptions(store_path="s.sqlite", token_env="WATCH_TEST_TOKEN")


def test_read_mode_names_every_receiving_flag_it_was_given(monkeypatch):
    monkeypatch.delenv("WATCH_TEST_TOKEN", raising=False)  # refused before it is read
    given = {
        "demo": True,
        "forward": "http://x:4318",
        "metrics": "http://x:8000",
        "replicas": ("http://x:8001",),
        "token_env": "WATCH_TEST_TOKEN",
        "retain_s": 3600.0,
        "retain_spans": 10,
    }
    assert set(given) == set(RECEIVER_ONLY)
    with pytest.raises(ConfigError) as info:
        WatchOptions(store_path="s.sqlite", spans_from="jaeger://127.0.0.1:1", **given)
    for flag in RECEIVER_ONLY.values():
        assert flag in str(info.value)
    assert "no receiver" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"demo": True, "grpc": "off"}, "--demo exports over gRPC"),
        ({"demo": True, "replicas": ("http://x:8000",)}, "--replica and --demo"),
        ({"metrics": "http://x:8000", "replicas": ("http://x:8001",)}, "--metrics reads one"),
        ({"http": "localhost"}, "--http 'localhost': give HOST:PORT"),
        ({"grpc": "h:99999"}, "--grpc 'h:99999'"),
    ],
)
def test_combinations_that_cannot_work_are_refused_when_built(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        WatchOptions(store_path="s.sqlite", **kwargs)


def test_listen_addresses_are_parsed_and_off_means_none():
    o = WatchOptions(store_path="s.sqlite", http=":4999", grpc="OFF")
    assert o.http_addr == ("127.0.0.1", 4999) and o.grpc_addr is None


def test_every_flag_reaches_the_options(monkeypatch):
    monkeypatch.setenv("WATCH_TEST_TOKEN", "otlp-T0ken-1a2b3c")
    parser = argparse.ArgumentParser()
    cmd_watch.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        "watch --http 127.0.0.1:5001 --grpc off --duration 3 --refresh 0.5 --window 30 "
        "--forward http://c:4318 --metrics http://m:8000 --token-env WATCH_TEST_TOKEN "
        "--max-bytes 1000 --retain 2h --retain-spans 50 --store w.sqlite".split()
    )
    o = cmd_watch.watch_options(args)
    assert (o.store_path, o.http_addr, o.grpc_addr) == ("w.sqlite", ("127.0.0.1", 5001), None)
    assert (o.duration_s, o.refresh_s, o.window_s) == (3.0, 0.5, 30.0)
    assert (o.forward, o.metrics, o.token) == (
        "http://c:4318",
        "http://m:8000",
        "otlp-T0ken-1a2b3c",
    )
    assert (o.max_bytes, o.retain_s, o.retain_spans) == (1000, 7200.0, 50)
    assert (o.demo, o.replicas, o.spans_from) == (False, (), None)


class FakeTime:
    """A monotonic clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_pace_ticks_at_once_then_every_refresh_and_ends_on_the_deadline():
    t = FakeTime()
    pace = Pace(2.0, 5.0, monotonic=t.monotonic, sleep=t.sleep)
    at = list(pace.ticks(lambda: t.now))
    assert at == [100.0, 102.0, 104.0, 105.0]  # the last wait cut short to end on time
    assert t.sleeps == [2.0, 2.0, 1.0]


def test_pace_idle_offers_background_work_until_the_deadline():
    t = FakeTime()
    calls: list[float] = []
    Pace(2.0, 1.0, monotonic=t.monotonic, sleep=t.sleep).idle(lambda: calls.append(t.now))
    assert len(calls) == round(1.0 / IDLE_TICK_S)
    assert t.now == pytest.approx(101.0)
