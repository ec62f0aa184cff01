"""One secret mask (issue 33 item 3): servers that echo the credential they were sent.

Every secret phaseprobe holds (the OpenAI key, the Prometheus and Grafana tokens, a URL
password, a launch env value) is registered where it is read; what comes back (an error body
"bad key Bearer …", a library's exception, a server's log tail) is masked as ``***`` at the
console, in the store and in the files written. Each command below runs against a server that
echoes its Authorization header (and its URL) into every error body; stdout, stderr, the
store's file and its -wal, and every file under the test's directory are grepped.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.present.cli import main
from phaseprobe.redact import MASK, forget_secrets, mask_secrets, register_secret
from phaseprobe.store import Store
from tests.hostile.cases import probe_argv

API_KEY = "sk-echo-KEY-4711"
PROM_TOKEN = "prom-echo-TOKEN-0815"
GRAFANA_TOKEN = "glsa_echo-TOKEN-1234"
PASSWORD = "Pw-echo-9876"
SECRETS = (API_KEY, PROM_TOKEN, GRAFANA_TOKEN, PASSWORD)
METRICS = b'vllm:num_requests_running{model_name="m"} 0\n'


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


class _Echo(BaseHTTPRequestHandler):
    """vLLM-, Prometheus- and Grafana-like answers; every error body quotes the request's
    Authorization header and path back, as a careless proxy or server does."""

    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        auth = self.headers.get("Authorization", "")
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())
        elif path == "/metrics":
            self._send(200, METRICS, "text/plain")
        elif path.startswith("/api/v1/"):  # Prometheus
            self._send(
                401,
                json.dumps(
                    {"status": "error", "errorType": "unauthorized", "error": f"bad token {auth}"}
                ).encode(),
            )
        elif path.startswith("/api/"):  # Grafana
            self._send(401, json.dumps({"message": f"invalid {auth} for {self.path}"}).encode())
        else:
            self._send(401, json.dumps({"error": {"message": f"bad key {auth}"}}).encode())

    do_GET = _answer  # noqa: N815
    do_POST = _answer  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def env(monkeypatch) -> None:
    monkeypatch.setenv("ECHO_KEY", API_KEY)
    monkeypatch.setenv("ECHO_PROM", PROM_TOKEN)
    monkeypatch.setenv("ECHO_GRAFANA", GRAFANA_TOKEN)


def _leaks(data: str | bytes) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [s for s in SECRETS if s.encode() in raw]


def _files_leak(root: Path) -> dict[str, list[str]]:
    return {
        str(p): found for p in root.rglob("*") if p.is_file() if (found := _leaks(p.read_bytes()))
    }


def _run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    got = capsys.readouterr()
    assert "Traceback" not in got.err
    return code, got.out, got.err


def _held(path: Path) -> sqlite3.Connection:
    """The store created and held open by a second connection: the command's writes stay
    in the -wal after it closes, to be grepped too."""
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return db


@pytest.mark.parametrize("fmt", [["--json"], []], ids=["json", "text"])
@pytest.mark.parametrize("password", [False, True], ids=["key", "key+url-password"])
def test_probe_against_a_server_echoing_the_key(echo, env, tmp_path, capsys, fmt, password):
    store = tmp_path / "store.sqlite"
    db = _held(store)
    endpoint = echo.replace("http://", f"http://user:{PASSWORD}@") if password else echo
    try:
        code, out, err = _run(
            probe_argv(endpoint, store, "--api-key-env", "ECHO_KEY", *fmt), capsys
        )
        stored = [row[0] for row in db.execute("SELECT error FROM runs")]
    finally:
        db.close()
    assert code == 1  # the only run is an error run
    # the echo came back and was masked, not dropped: the error still says what the server said
    assert stored and all("bad key" in e and MASK in e for e in stored), stored
    assert _leaks(out) == [] and _leaks(err) == [], (out, err)
    assert _files_leak(tmp_path) == {}


def test_query_against_a_prometheus_echoing_the_token(echo, env, capsys):
    code, out, err = _run(
        ["query", "--prom", echo, "--token-env", "ECHO_PROM", "ttft_mean"], capsys
    )
    assert code != 0 and _leaks(out + err) == [], err


def test_grafana_import_against_a_grafana_echoing_the_token(echo, env, tmp_path, capsys):
    code, out, err = _run(
        ["grafana", "import", "--url", echo, "--token-env", "ECHO_GRAFANA"], capsys
    )
    assert code != 0 and "invalid" in err and MASK in err, err
    assert _leaks(out + err) == [] and _files_leak(tmp_path) == {}


@pytest.mark.parametrize(
    "var,argv",
    [
        (
            "ECHO_KEY",
            [
                "probe",
                "--endpoint",
                "{echo}",
                "--api-key-env",
                "ECHO_KEY",
                "--no-gpu",
                "--runs",
                "1",
                "--warmup",
                "0",
            ],
        ),
        ("ECHO_PROM", ["query", "--prom", "{echo}", "--token-env", "ECHO_PROM", "ttft_mean"]),
        ("ECHO_GRAFANA", ["grafana", "import", "--url", "{echo}", "--token-env", "ECHO_GRAFANA"]),
    ],
)
@pytest.mark.parametrize(
    "bad,said",
    [
        ("\n", "whitespace or a newline"),
        ("\u201c", "outside Latin-1"),
        ("a\tb", "control character"),
    ],
)
def test_a_key_that_cannot_be_a_header_is_refused_unshown(
    echo, monkeypatch, tmp_path, capsys, var, argv, bad, said
):
    secret = {"ECHO_KEY": API_KEY, "ECHO_PROM": PROM_TOKEN, "ECHO_GRAFANA": GRAFANA_TOKEN}[var]
    value = secret + bad
    monkeypatch.setenv(var, value)
    store = ["--store", str(tmp_path / "s.sqlite")] if argv[0] == "probe" else []
    code, out, err = _run([a.replace("{echo}", echo) for a in argv] + store, capsys)
    if var == "ECHO_GRAFANA" and bad == "\n":
        # Grafana's token is stripped, as it always was: it is then sent and masked in the echo
        assert code != 0 and MASK in err
    else:
        assert code == 2 and f"${var} cannot be sent: it " in err and said in err, err
    assert _leaks(out + err) == []


def test_a_launched_servers_log_tail_is_masked(tmp_path):
    from phaseprobe.collect.ab.playbook import parse_playbook
    from phaseprobe.local.process import log_tail

    parse_playbook("""
name = "t"
model = "m"
[run]
prompt = "hi"
max_tokens = 4
[[arm]]
name = "a"
endpoint = "http://127.0.0.1:1"
[[arm]]
name = "b"
[arm.launch]
env = { HF_TOKEN = "hf_launch-SECRET-55", NCCL_ALGO = "Tree" }
""")
    log = tmp_path / "server.log"
    log.write_text("INFO env HF_TOKEN=hf_launch-SECRET-55 NCCL_ALGO=Tree\nready\n")
    tail = log_tail(log)
    assert "hf_launch-SECRET-55" not in tail and f"HF_TOKEN={MASK}" in tail
    assert "NCCL_ALGO=Tree" in tail  # an ordinary value stays


def test_the_mask_takes_the_longest_secret_and_leaves_short_values():
    register_secret("abc")  # too short to be masked without blotting out ordinary words
    register_secret("tok-123456")
    register_secret("tok-123456-long")
    assert mask_secrets("abc tok-123456-long tok-123456!") == f"abc {MASK} {MASK}!"
