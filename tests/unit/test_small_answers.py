"""/version and /tokenize are optional extras read at their boundary: a server answering odd
shapes, huge bodies or deep JSON there means "not available", never a traceback, and nothing
but a version string is kept (issue 18)."""

from __future__ import annotations

import json

import pytest
import requests

from phaseprobe.collect.connection import server_info
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.sources.vllm.openai_stream import MAX_SMALL_ANSWER_BYTES, small_json
from tests.hostile.cases import CannedServer, Reply, deep_json, json_reply, stream_bytes

ROUTES = {
    "ok": {
        "/version": json_reply({"version": "0.6.3.post1+cpu"}),
        "/tokenize": json_reply({"count": 5, "tokens": [1, 2, 3, 4, 5]}),
    },
    "list": {"*": json_reply(["0.6.3"])},
    "dict": {"*": json_reply({"version": {"major": 0}, "count": {"n": 5}})},
    "long": {"*": json_reply({"version": "9" * 5000, "count": 10**12})},
    "escape": {"*": json_reply({"version": "\x1b[2J0.1", "count": "5"})},
    "bool": {"*": json_reply({"version": True, "count": True})},
    "negative": {"*": json_reply({"version": "", "count": -1})},
    "deep": {"*": Reply(200, deep_json(100_000))},
    "huge": {"*": Reply(200, stream_bytes(b" " * 65536, 8 << 20), length=8 << 20)},
    "html": {"*": Reply(200, b"<html>sign in</html>", "text/html")},
    "e500": {"*": Reply(500, b"boom", "text/plain")},
}


@pytest.fixture(scope="module")
def server():
    with CannedServer(ROUTES) as srv:
        yield srv


def test_a_sane_server_gives_its_version_and_token_count(server):
    session = requests.Session()
    info = server_info(server.url("ok"), session, {}, [], None)
    assert info["vllm_version"] == "0.6.3.post1+cpu"
    builder = PromptBuilder(server.url("ok"), "m", session=session, headers={})
    assert builder._count("a b c") == 5 and builder.tokenize_available


@pytest.mark.parametrize("scenario", [s for s in ROUTES if s != "ok"])
def test_odd_answers_mean_not_available(server, scenario):
    session = requests.Session()
    info = server_info(server.url(scenario), session, {}, [], None)
    assert info["vllm_version"] is None
    json.dumps(info)
    builder = PromptBuilder(server.url(scenario), "m", session=session, headers={})
    assert builder._count("a b c") is None and builder.tokenize_available is False
    built = builder.build(8, 0)  # falls back to words: the run still gets its prompt
    assert built.tokens is None and len(built.text.split()) == 8


def test_small_json_reads_no_more_than_its_cap(server):
    doc = small_json(
        requests.Session(), "GET", server.url("huge") + "/version", headers={}, timeout_s=5
    )
    assert doc is None and MAX_SMALL_ANSWER_BYTES == 64 * 1024
    assert (
        small_json(requests.Session(), "GET", "http://127.0.0.1:9/version", headers={}, timeout_s=1)
        is None
    )
