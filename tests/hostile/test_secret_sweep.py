"""The secret sweep (issue 33 item 3): every command, with every kind of secret set.

phaseprobe holds secrets of six kinds: the API key (``OPENAI_API_KEY``), the Prometheus token
(``PHASEPROBE_PROM_TOKEN``), the Grafana token (``GRAFANA_TOKEN``), the OTLP receiver's token
(``watch --token-env``), URL passwords (one with ``/`` and ``@`` in it, as people paste them,
and its percent-encoded form; a ``clickhouse://`` URL's, and ``PHASEPROBE_CLICKHOUSE_PASSWORD``)
and a launch-env value in a playbook. Each command runs in-process against a server that
echoes the request's ``Authorization``, ``X-ClickHouse-*`` headers and its path back in every
error body (the careless proxy), or against a port where nothing listens. Then stdout,
stderr, every file under the test's directory (the store, its -wal, saved JSON, the default
data and cache directories) are grepped for each secret and the Basic credential an HTTP
library makes of a URL's user and password: none may appear, not even cut short (its first
eight characters).

The one file not grepped is the launched server's own log (``cache/ab/logs``): it is what that
server wrote (its environment, by design of this test), not what phaseprobe wrote; what
phaseprobe shows of it (the tail in the error) is grepped with the console.
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from phaseprobe.present.cli import main
from phaseprobe.redact import MASK, PREFIX_CHARS, forget_secrets
from tests.hostile.cases import dead_url
from tests.hostile.test_secret_echo import _Echo as SecretEchoHandler

API_KEY = "sk-SWEEP-apikey-31337"
PROM_TOKEN = "prom-SWEEP-token-27182"
GRAFANA_TOKEN = "glsa_SWEEP-token-16180"
OTLP_TOKEN = "otlp-SWEEP-token-32384"
URL_PASSWORD = "pa/ss@w0rd-SWEEP5"  # '/' and '@': urlsplit alone does not see it as a password
URL_PASSWORD_QUOTED = quote(URL_PASSWORD, safe="")
CH_URL_PASSWORD = "CHurl-SWEEP-26535"
CH_ENV_PASSWORD = "CHenv-SWEEP-89793"
QUERY_TOKEN = "qtok-SWEEP-57721"  # a secret-named query value (?password=, ?token=)
LAUNCH_SECRET = "hf_SWEEP-launch-17320"
USER = "sweeper"
INPUTS = "inputs"  # the directory of the files the commands read


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


# Every form a secret may come back in: as given, and as the Basic credential requests and
# clickhouse-connect build of a URL's (decoded) user and password.
SECRETS: tuple[str, ...] = (
    API_KEY,
    PROM_TOKEN,
    GRAFANA_TOKEN,
    OTLP_TOKEN,
    URL_PASSWORD,
    URL_PASSWORD_QUOTED,
    CH_URL_PASSWORD,
    CH_ENV_PASSWORD,
    QUERY_TOKEN,
    LAUNCH_SECRET,
    _basic(USER, URL_PASSWORD),
    _basic(USER, URL_PASSWORD_QUOTED),
    _basic(USER, CH_ENV_PASSWORD),
    _basic("default", CH_ENV_PASSWORD),
)
METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="m"} 0\n'
    b"# TYPE vllm:request_success_total counter\n"
    b'vllm:request_success_total{finished_reason="stop",model_name="m"} 3\n'
)
ECHOED = ("authorization", "x-clickhouse-user", "x-clickhouse-key", "x-api-key")


class _Echo(SecretEchoHandler):
    """vLLM's ``/v1/models`` and ``/metrics`` answered; every other request refused with a
    401 whose body quotes the credentials headers and the path (query included) back."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())
        elif path == "/metrics":
            self._send(200, METRICS, "text/plain; version=0.0.4")
        else:
            self._refuse()

    status = 401  # of the refusals

    def _refuse(self) -> None:
        said = {h: self.headers.get(h) for h in ECHOED if self.headers.get(h)}
        body = {
            "status": "error",
            "error": f"bad credentials {said} for {self.path}",
            "message": f"invalid {said} for {self.path}",
        }
        self._send(self.status, json.dumps(body).encode())

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._answer()

    do_POST = do_GET  # noqa: N815


class _LoudEcho(_Echo):
    """The echo, and worse: its successful answers quote the credentials too (the model's
    ``root`` and ``owned_by``, a ``/metrics`` label and HELP text, ``/version``), and
    completions stream them back as the generated text."""

    status = 500  # its refusals are server errors (retried, worded otherwise than a 401)
    served = 0  # completions streamed, for /metrics
    lock = threading.Lock()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        said = " ".join(f"{h}={self.headers.get(h)}" for h in ECHOED if self.headers.get(h))
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            model = {"id": "m", "root": f"/models/{said}", "owned_by": said, "max_model_len": 64}
            self._send(200, json.dumps({"object": "list", "data": [model]}).encode())
        elif path == "/metrics":
            label = said.replace('"', "'")
            # the e2e histogram counts the completions served, so a probe sees its request
            # observed at once (and does not wait out the 10 s it gives vLLM)
            n = _LoudEcho.served
            extra = (
                f"# HELP vllm:cache_config_info cache config of {label}\n"
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="16",echo="{label}"}} 1\n'
                "# TYPE vllm:e2e_request_latency_seconds histogram\n"
                f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {0.01 * n}\n'
                f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {n}\n'
            )
            self._send(200, METRICS + extra.encode(), "text/plain; version=0.0.4")
        elif path == "/version":
            self._send(200, json.dumps({"version": said}).encode())
        elif path == "/v1/completions":
            self._stream(said)
        else:
            self._refuse()

    def _stream(self, said: str) -> None:
        def event(doc: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(doc).encode() + b"\n\n"

        chunks = [
            event({"id": "c", "model": "m", "choices": [{"index": 0, "text": t}]})
            for t in (f"you sent {said}", " ok")
        ]
        usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
        body = b"".join([*chunks, event({"id": "c", "model": "m", "choices": [], "usage": usage})])
        self._send(200, body + b"data: [DONE]\n\n", "text/event-stream")
        with _LoudEcho.lock:
            _LoudEcho.served += 1


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    # a client that hangs up early (a cap, a deadline) is expected, not worth a trace
    httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    yield from _serve(_Echo)


@pytest.fixture(scope="module")
def loud() -> Iterator[str]:
    yield from _serve(_LoudEcho)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAKE_SERVER = """\
import os, sys
# a launched server that logs its environment (as vLLM's debug logging does) and dies
for k, v in sorted(os.environ.items()):
    if "SWEEP" in v:
        print(f"env {k}={v}", flush=True)
sys.exit(3)
"""


def _files(tmp: Path, echo: str) -> dict[str, str]:
    """The inputs the commands read, written under ``tmp`` (not grepped: the user's own files,
    the playbook holding its launch secret); their paths by name."""
    tmp.mkdir()
    (tmp / "fake_server.py").write_text(FAKE_SERVER)
    (tmp / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 2048,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (tmp / "nccl.log").write_text(
        "host:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "host:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 "
        "MNNVL 0 - Init COMPLETE\n"
    )
    (tmp / "trace.json").write_text(json.dumps({"traceEvents": []}))
    (tmp / "spans.json").write_text(json.dumps({"resourceSpans": []}))
    (tmp / "smi.csv").write_text(
        "timestamp, index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
        "2024/01/01 00:00:00.000, 0, 100 MiB, 1000 MiB, 5 %\n"
    )
    book = f"""
name = "sweep"
model = "m"
[run]
prompt = "hi"
max_tokens = 2
runs = 1
warmup = 0
[[arm]]
name = "a"
endpoint = "http://{USER}:{URL_PASSWORD_QUOTED}@{echo}"
[[arm]]
name = "b"
[arm.launch]
command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp / "fake_server.py"))}]
startup_timeout_s = 20
env = {{ HF_TOKEN = "{LAUNCH_SECRET}", NCCL_ALGO = "Ring" }}
"""
    (tmp / "book.toml").write_text(book)
    endpoints = (
        book.split("[[arm]]")[0]
        + f"""
[[arm]]
name = "a"
endpoint = "http://{USER}:{URL_PASSWORD_QUOTED}@{echo}"
[[arm]]
name = "b"
endpoint = "http://{USER}:{URL_PASSWORD_QUOTED}@{echo.replace("127.0.0.1", "localhost")}"
"""
    )
    (tmp / "endpoints.toml").write_text(endpoints)
    return {
        "fake_server": str(tmp / "fake_server.py"),
        "config": str(tmp / "config.json"),
        "nccl": str(tmp / "nccl.log"),
        "trace": str(tmp / "trace.json"),
        "spans": str(tmp / "spans.json"),
        "smi": str(tmp / "smi.csv"),
        "book": str(tmp / "book.toml"),
        "endpoints": str(tmp / "endpoints.toml"),
    }


@dataclass(frozen=True)
class Case:
    """One command line, and what shows it got where a secret would come back.

    ``argv``: ``{echo}`` (host:port of the echoing server), ``{loud}`` (one that echoes in
    its successful answers too), ``{echo_by_name}`` (the same as
    localhost), ``{dead}`` (host:port where nothing listens), ``{pw}`` (``USER:password@`` with
    the raw password), ``{qpw}`` (the same, percent-encoded), ``{listen}`` (a free port),
    ``{tmp}`` and the input names of :func:`_files` are filled in. ``shows``: a text that must
    be in the output or in a file written (``***``: the echo came back, masked). ``before``: a
    command run first (a probe that stores an experiment, for the commands that read one).
    ``otlp``: during the command an exporter posts to watch's receiver with a wrong and a right
    token (the answers are grepped too)."""

    argv: str
    shows: str
    before: tuple[str, ...] = ()
    otlp: bool = False


ONE_RUN = "--runs 1 --warmup 0 --max-tokens 2 --prompt hi --no-gpu"
PROBE = (
    "probe --endpoint http://{qpw}{echo} --prom http://{echo} --prom-wait 0 --no-spans " + ONE_RUN
)
CH = "--spans-from clickhouse://" + USER
CH_PW = CH + ":" + CH_URL_PASSWORD
CASES: dict[str, Case] = {
    # probe: the key, the Prometheus token, URL passwords, span stores
    "probe": Case(PROBE, MASK),
    "probe-json": Case(PROBE + " --json", MASK),
    "probe-raw-password": Case("probe --endpoint http://{pw}{echo} " + ONE_RUN, "unreachable"),
    "probe-prom-password": Case(
        "probe --endpoint http://{echo} --prom http://{qpw}{echo} --prom-wait 0 " + ONE_RUN, MASK
    ),
    "probe-prom-raw-password": Case(
        "probe --endpoint http://{echo} --prom http://{pw}{echo} --prom-wait 0 " + ONE_RUN,
        "127.0.0.1",
    ),
    "probe-clickhouse-url-password": Case(
        "probe --endpoint http://{echo} " + ONE_RUN + " " + CH_PW + "@{dead}/otel",
        "must not carry a password",
    ),
    "probe-clickhouse-echo": Case(
        "probe --endpoint http://{echo} " + ONE_RUN + " " + CH + "@{echo}/otel", MASK
    ),
    "probe-replica-password": Case(
        "probe --endpoint http://{echo} --replica r1=http://{qpw}{echo} --no-spans " + ONE_RUN,
        MASK,
    ),
    "probe-torch-profile": Case(PROBE + " --torch-profile {tmp}/profile", MASK),
    "probe-router-metrics": Case(
        "probe --endpoint http://{echo} --replica r1=http://{echo_by_name} "
        "--router-metrics http://{qpw}{echo}/metrics --no-spans " + ONE_RUN,
        MASK,
    ),
    "probe-pd": Case(
        "probe --prefill http://{qpw}{echo} --decode http://{qpw}{echo_by_name} " + ONE_RUN, MASK
    ),
    # a server quoting the credentials in its successful answers and generated text
    "probe-loud": Case(
        "probe --endpoint http://{loud} --prom http://{loud} --prom-wait 0 --no-spans " + ONE_RUN,
        "authorization=Bearer " + MASK,  # the model's root, stored masked
    ),
    "probe-loud-json": Case(
        "probe --endpoint http://{qpw}{loud} --no-spans --json --response-metrics on " + ONE_RUN,
        MASK,
    ),
    "check-live-loud": Case(
        "check --live --endpoint http://{qpw}{loud} --window 1 --json", '"kind": "live"'
    ),
    "grafana-lint-loud": Case("grafana lint --metrics http://{qpw}{loud} --json", "missing"),
    "plan-loud": Case(
        "plan --config {config} --gpu-mem-gb 80 --metrics http://{qpw}{loud}/metrics --json",
        "kv",
    ),
    "prefix-loud": Case(
        "prefix --endpoint http://{loud} --reps 1 --prefix-tokens 8 --suffix-tokens 4 "
        "--max-tokens 2 --json",
        "authorization=Bearer " + MASK,
    ),
    "check-stored-loud": Case(
        "check --latest --json",
        "authorization=Basic " + MASK,
        before=("probe --endpoint http://{qpw}{loud} --no-spans " + ONE_RUN,),
    ),
    "query-loud": Case("query --prom http://{loud} ttft_mean --json", MASK),
    "gpu-import-dcgm-loud": Case("gpu import --dcgm --prom http://{qpw}{loud}", MASK),
    "grafana-import-loud": Case("grafana import --url http://{loud}", MASK),
    "spans-list-loud": Case("spans list " + CH + "@{loud}/db", MASK),
    "spans-jaeger-loud": Case("spans list --spans-from jaeger://{loud} --json", "500"),
    "probe-torch-profile-loud": Case(
        "probe --endpoint http://{qpw}{loud} --no-spans --torch-profile {tmp}/p " + ONE_RUN, MASK
    ),
    # query and the Prometheus-backed import
    "query": Case("query --prom http://{echo} ttft_mean", MASK),
    "query-json-password": Case("query --prom http://{qpw}{echo} --json ttft_mean", MASK),
    "query-query-token": Case(
        "query --prom http://{echo}/?token=" + QUERY_TOKEN + " ttft_mean", "?"
    ),
    "query-raw-password": Case("query --prom http://{pw}{echo} ttft_mean", "unreachable"),
    "gpu-import-dcgm": Case("gpu import --dcgm --prom http://{qpw}{echo}", MASK),
    "gpu-import-file": Case("gpu import {smi} --json", '"found": 1'),
    "gpu-watch-fake": Case("gpu watch --fake --duration 0.3 --period 0.1 --json", "util_gpu_pct"),
    # grafana
    "grafana-import": Case("grafana import --url http://{echo}", MASK),
    "grafana-import-password": Case(
        "grafana import --url http://{qpw}{echo} --json", "drop the credentials"
    ),
    "grafana-import-raw-password": Case(
        "grafana import --url http://{pw}{echo}", "not a usable Grafana URL"
    ),
    "grafana-lint-metrics": Case(
        "grafana lint --metrics http://{qpw}{echo}/metrics", "vllm:time_to_first_token"
    ),
    "grafana-lint-raw": Case("grafana lint --metrics http://{pw}{echo}/metrics --json", "127.0"),
    "grafana-build": Case("grafana build --out {tmp}/dash.json", "panels"),
    # watch: the receiver's token, --metrics and --forward with a password, a span store
    "watch": Case(
        "watch --http {listen} --grpc off --duration 1.5 --token-env SWEEP_OTLP_TOKEN "
        "--metrics http://{qpw}{echo} --forward http://{qpw}{echo} --refresh 0.5",
        "refused",
        otlp=True,
    ),
    "watch-json": Case(
        "watch --http {listen} --grpc off --duration 1 --token-env SWEEP_OTLP_TOKEN "
        "--replica r1=http://{pw}{echo} --json",
        "unauthorized",
        otlp=True,
    ),
    "watch-spans-from": Case(
        "watch --http off --grpc off --duration 0.5 " + CH_PW + "@{dead}/db",
        "must not carry a password",
    ),
    # spans: a URL password refused unshown; the env password against a dead port and an echo
    "spans-list-url-password": Case("spans list " + CH_PW + "@{dead}/db", "must not carry"),
    "spans-show-url-password": Case(
        "spans show abc " + CH_PW + "@{dead}/db --json", "must not carry"
    ),
    "spans-list-refused": Case("spans list " + CH + "@{dead}/db", "nothing answers"),
    "spans-list-echo": Case("spans list " + CH + "@{echo}/db --json", MASK),
    "spans-show-echo": Case("spans show abc " + CH + "@{echo}/db", MASK),
    "spans-query-password": Case(
        "spans list " + CH + "@{echo}/db?password=" + QUERY_TOKEN + "&table=t", MASK
    ),
    "spans-tempo-password": Case("spans list --spans-from tempo://{pw}{dead}", "not a usable"),
    "spans-jaeger-echo": Case("spans list --spans-from jaeger://{echo}", "401"),
    "spans-import": Case("spans import {spans} --json", "request_spans"),
    "spans-list-store": Case("spans list", "spans", before=(PROBE,)),
    # check, offline and live
    "check-live": Case("check --live --endpoint http://{qpw}{echo} --window 1", "live_router"),
    "check-live-password": Case(
        "check --live --endpoint http://{qpw}{echo} --window 1 --json "
        "--replica r1=http://{qpw}{echo_by_name}",
        "live_router",
    ),
    "check-live-raw-replica": Case(
        "check --live --endpoint http://{echo} --window 1 --replica r1=http://{pw}{echo}",
        "unreachable",
    ),
    "check-live-prom": Case("check --live --prom http://{qpw}{echo} --window 5", MASK),
    "check-live-spans-from": Case(
        "check --live --endpoint http://{echo} --window 1 " + CH + "@{echo}/db", MASK
    ),
    "check-live-router-metrics": Case(
        "check --live --endpoint http://{echo} --replica r1=http://{echo_by_name} --window 1 "
        "--router-metrics http://{qpw}{echo}/metrics --markdown",
        "outer",
    ),
    "check-stored-markdown": Case(
        "check --latest --prom http://{qpw}{echo} --markdown", "#", before=(PROBE,)
    ),
    "check-stored": Case("check --latest --prom http://{qpw}{echo} --json", MASK, before=(PROBE,)),
    # ab: a launch-env secret in the log tail, an endpoint with a password
    "ab": Case("ab {book}", "HF_TOKEN=" + MASK),
    "ab-json": Case("ab {book} --json", "HF_TOKEN=" + MASK),
    "ab-endpoints": Case("ab {endpoints} --force", MASK),
    "ab-report": Case("ab report 1 --markdown", "a", before=("ab {endpoints} --force",)),
    "ab-compare": Case("ab compare 1 2 --force --json", "experiment", before=(PROBE, PROBE)),
    # the interplay probes (their error runs are in the store, masked)
    "interfere-endpoint-b": Case(
        "interfere --endpoint http://{echo} --endpoint-b http://{qpw}{echo_by_name} --reps 1 "
        "--a-tokens 4 --b-tokens 1 --at-token 2 --pause 0",
        MASK,
    ),
    "prefix": Case(
        "prefix --endpoint http://{qpw}{echo} --reps 1 --prefix-tokens 8 --suffix-tokens 4 "
        "--max-tokens 2",
        MASK,
    ),
    "batch": Case(
        "batch --endpoint http://{echo} --concurrency 1 --repeats 1 --prompt-tokens 8 "
        "--max-tokens 2 --json",
        MASK,
    ),
    "interfere": Case(
        "interfere --endpoint http://{qpw}{echo} --reps 1 --a-tokens 4 --b-tokens 1 --at-token 2",
        MASK,
    ),
    # files and the store
    "plan": Case(
        "plan --config {config} --gpu-mem-gb 80 --metrics http://{qpw}{echo}/metrics",
        "KV capacity",
    ),
    "plan-raw": Case(
        "plan --config {config} --gpu-mem-gb 80 --metrics http://{pw}{echo} --json", "127.0"
    ),
    "calibrate-show": Case("calibrate --show --json", "calibrations"),
    "calibrate-no-torch": Case(
        "calibrate --quick --python {fake_server} --timeout 10", "cannot run"
    ),
    "nccl": Case("nccl {nccl} --save {tmp}/nccl.json", "2.21.5"),
    "nsys": Case("nsys {trace}", "not an SQLite"),
    "trace": Case("trace {trace} --json", "empty trace"),
    "runs": Case("runs --latest", "error", before=(PROBE,)),
    "runs-json": Case("runs --latest --json", MASK, before=(PROBE,)),
    # a store that is not one (a missing store opens the start page: issue 43)
    "dashboard-refused": Case("dashboard --store {nccl}", "not a SQLite file"),
    "local-status": Case("local status", "local vLLM"),
    "local-stop": Case("local stop", "local vLLM"),
}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, echo: str, loud: str) -> dict[str, str]:
    forget_secrets()
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("PHASEPROBE_PROM_TOKEN", PROM_TOKEN)
    monkeypatch.setenv("GRAFANA_TOKEN", GRAFANA_TOKEN)
    monkeypatch.setenv("SWEEP_OTLP_TOKEN", OTLP_TOKEN)
    monkeypatch.setenv("PHASEPROBE_CLICKHOUSE_PASSWORD", CH_ENV_PASSWORD)
    # the default store, calibrations and server logs: under the test's directory, grepped
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)  # a file written to the working directory is grepped too
    return {
        "echo": echo,
        "loud": loud,
        "echo_by_name": echo.replace("127.0.0.1", "localhost"),  # the same server, another name
        "dead": dead_url()[1],
        "pw": f"{USER}:{URL_PASSWORD}@",
        "qpw": f"{USER}:{URL_PASSWORD_QUOTED}@",
        "tmp": str(tmp_path),
        "listen": f"127.0.0.1:{_free_port()}",
        **_files(tmp_path / INPUTS, echo),
    }


def _leaks(data: bytes) -> list[str]:
    """The secrets ``data`` holds, whole or cut short (a body clipped to N characters) to
    their first PREFIX_CHARS characters."""
    return [s for s in SECRETS if s[:PREFIX_CHARS].encode() in data]


def _written(root: Path) -> list[Path]:
    """The files the commands wrote under ``root``: all but the inputs and the launched
    server's own log (module doc)."""
    skipped = (root / "cache" / "ab" / "logs", root / INPUTS)
    return [p for p in root.rglob("*") if p.is_file() and not any(d in p.parents for d in skipped)]


def _files_leak(root: Path) -> dict[str, list[str]]:
    return {
        str(p.relative_to(root)): found for p in _written(root) if (found := _leaks(p.read_bytes()))
    }


def _exporter(listen: str, stop: threading.Event, answers: list[bytes]) -> None:
    """Post OTLP/HTTP to watch's receiver with a wrong token, the right one and a bad body,
    until ``stop``: every answer's headers and body are kept for the grep."""
    url = f"http://{listen}/v1/traces"
    tries = (
        {"Authorization": f"Bearer wrong-{OTLP_TOKEN[:4]}"},
        {"Authorization": f"Bearer {OTLP_TOKEN}"},
        {"Authorization": f"Basic {_basic(USER, OTLP_TOKEN)}"},
    )
    while not stop.is_set():
        for headers in tries:
            try:
                r = requests.post(
                    url,
                    data=b"not protobuf",
                    headers={**headers, "Content-Type": "application/x-protobuf"},
                    timeout=2,
                )
            except requests.RequestException:
                continue
            answers.append(repr(dict(r.headers)).encode() + r.content)
        stop.wait(0.2)


def _run(argv: str, world: dict[str, str], capsys: Any) -> tuple[int, str, str]:
    code = main([word.format(**world) for word in argv.split()])
    got = capsys.readouterr()
    assert "Traceback" not in got.err, got.err
    return code, got.out, got.err


@pytest.mark.parametrize("name", list(CASES))
def test_no_secret_comes_back(name: str, world: dict[str, str], tmp_path: Path, capsys) -> None:
    case = CASES[name]
    shown = b""
    for before in case.before:
        _, out, err = _run(before, world, capsys)
        shown += (out + err).encode()
    answers: list[bytes] = []
    stop = threading.Event()
    exporter = threading.Thread(target=_exporter, args=(world["listen"], stop, answers))
    if case.otlp:
        exporter.start()
    started = time.monotonic()
    try:
        code, out, err = _run(case.argv, world, capsys)
    finally:
        stop.set()
        if case.otlp:
            exporter.join(5)
    took = time.monotonic() - started
    shown += (out + err).encode()
    assert took < 30, f"{name} took {took:.1f} s"
    assert _leaks(shown) == [], (code, out[-2000:], err[-2000:])
    assert _files_leak(tmp_path) == {}
    assert [_leaks(a) for a in answers if _leaks(a)] == []
    # the command got where a secret would come back (not stopped at a usage error)
    written = b"".join(p.read_bytes() for p in _written(tmp_path))
    assert case.shows.encode() in shown + written, (code, out[-2000:], err[-2000:])
    if case.otlp:
        assert answers, "the exporter never reached watch's receiver"
