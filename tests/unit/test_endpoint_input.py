"""What newcomers type as an endpoint or a model name: accepted when it is clear what they
meant, refused with what to type when not, and always before any run (issue 16)."""

from __future__ import annotations

import pytest

from phaseprobe.collect.ab.playbook import PlaybookError, parse_playbook
from phaseprobe.collect.target import served_model
from phaseprobe.errors import ConfigError
from phaseprobe.sources.vllm.openai_stream import normalize_base_url
from phaseprobe.testing.sse_server import Script, SseServer


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("http://host:8000/v1", "http://host:8000"),  # the OpenAI client's base_url
        ("http://host:8000/v1/", "http://host:8000"),
        ("http://host:8000/", "http://host:8000"),
        ("host:8000", "http://host:8000"),  # as vLLM's log prints it
        ("127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("HTTPS://gw.example/vllm/v1", "https://gw.example/vllm"),  # behind a path prefix
        ("  http://host:8000  ", "http://host:8000"),
    ],
)
def test_endpoints_as_typed_become_base_urls(typed, meant):
    assert normalize_base_url(typed) == meant


@pytest.mark.parametrize(
    "typed, says",
    [
        ("ftp://host:8000", "must be http:// or https://"),
        ("http:///v1", "names no host"),
        ("", "names no host"),
    ],
)
def test_unusable_endpoints_say_what_to_type(typed, says):
    with pytest.raises(ConfigError, match=says) as info:
        normalize_base_url(typed)
    assert "http://127.0.0.1:8000" in str(info.value)


def test_v1_suffix_reaches_the_server_and_a_wrong_model_lists_the_served_ones():
    with SseServer(Script(n_tokens=2)) as srv:
        # Issue 16: "--endpoint http://host:8000/v1" gave "…/v1/v1/models (HTTP 404)".
        assert served_model(srv.base_url + "/v1/", None, srv.model) == srv.model
        with pytest.raises(ConfigError) as info:
            served_model(srv.base_url, None, "llama-70b")
        assert "'llama-70b' is not served" in str(info.value)
        assert srv.model in str(info.value)
        # No request was streamed: the check is /v1/models alone.
        assert not [r for r in srv.requests if r.path.endswith("completions")]


def test_playbook_endpoints_are_normalised_or_refused_with_the_key():
    book = """
name = "x"
model = "m"
[run]
prompt = "hi"
max_tokens = 4
[[arm]]
name = "a"
endpoint = "{a}"
[[arm]]
name = "b"
endpoint = "http://127.0.0.1:9/"
"""
    pb = parse_playbook(book.format(a="127.0.0.1:8000/v1"))
    assert pb.arms[0].endpoint == "http://127.0.0.1:8000"
    with pytest.raises(PlaybookError, match=r"arm\[0\]\.endpoint: .*http:// or https://"):
        parse_playbook(book.format(a="ws://127.0.0.1:8000"))


def test_probe_with_an_unknown_model_stops_before_any_run(tmp_path, capsys):
    # Issue 16: an unknown --model ran the warm-up and every run, and stored an all-error
    # experiment with "None" in its columns.
    from phaseprobe.present.cli import main
    from phaseprobe.store import Store

    with SseServer(Script(n_tokens=2)) as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url + "/v1",
                "--model",
                "llama-70b",
                "--runs",
                "2",
                "--store",
                str(tmp_path / "s.sqlite"),
            ]
        )
        streamed = [r for r in srv.requests if r.path.endswith("completions")]
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and streamed == []
    assert "'llama-70b' is not served" in err and srv.model in err
    if (tmp_path / "s.sqlite").exists():
        with Store(tmp_path / "s.sqlite") as store:
            assert store.experiments() == []
