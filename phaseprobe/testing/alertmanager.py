"""A real Alertmanager (Debian's ``prometheus-alertmanager``) and a webhook receiver, for the
end-to-end alert test: Prometheus → Alertmanager → an HTTP POST this process receives.

    with WebhookReceiver() as hook, Alertmanager(hook.url) as am:
        PrometheusServer(..., alertmanager=am.address)
        hook.wait_for(lambda alert: alert["labels"]["alertname"] == "X", timeout_s=60)

Alertmanager binds 127.0.0.1 on a free port, with clustering off (no gossip port) and its
state in a temporary directory; it groups nothing and waits 1 s before sending, so a test does
not sit through the production defaults (30 s group_wait).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Self

import requests

from phaseprobe.errors import PrometheusServerError
from phaseprobe.local.process import free_port, log_tail, stop_process_group

__all__ = ["Alertmanager", "WebhookReceiver", "ALERTMANAGER_BINARY"]

ALERTMANAGER_BINARY = "/usr/bin/prometheus-alertmanager"  # Debian's name (upstream: alertmanager)
_HOST = "127.0.0.1"


class WebhookReceiver:
    """An HTTP server on a free loopback port keeping every alert Alertmanager POSTs."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner._cond:
                    owner.alerts.extend(json.loads(body or b"{}").get("alerts", []))
                    owner._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass  # quiet: the test says what it received

        self._server = ThreadingHTTPServer((_HOST, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self._server.server_address[1]}/alerts"

    def wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any] | None:
        """The first received alert ``match`` accepts, waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for alert in self.alerts:
                    if match(alert):
                        return alert
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class Alertmanager:
    """One Alertmanager process sending every alert to ``webhook_url``."""

    def __init__(self, webhook_url: str, *, binary: str | Path = ALERTMANAGER_BINARY) -> None:
        self.webhook_url = webhook_url
        self.binary = Path(binary)
        self.port: int | None = None
        self.pid: int | None = None
        self.workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port``, as Prometheus' alerting config names it."""
        return f"{_HOST}:{self.port}"

    def start(self) -> Self:
        if not self.binary.is_file():
            found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
            if found is None:
                raise PrometheusServerError(
                    str(self.binary),
                    "no Alertmanager binary (Debian/Ubuntu: apt-get install "
                    "prometheus-alertmanager)",
                )
            self.binary = Path(found)
        self.workdir = Path(tempfile.mkdtemp(prefix="phaseprobe-am-"))
        config = self.workdir / "alertmanager.yml"
        config.write_text(
            json.dumps(
                {
                    "route": {
                        "receiver": "hook",
                        "group_by": ["..."],  # every alert its own group
                        "group_wait": "1s",
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [{"name": "hook", "webhook_configs": [{"url": self.webhook_url}]}],
                }
            )
        )
        self.port = free_port(_HOST)
        log = self.workdir / "alertmanager.log"
        self._log = open(log, "ab")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config.file={config}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",  # no gossip port: one instance
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise PrometheusServerError(self.address, f"Alertmanager exited:\n{log_tail(log)}")
            try:
                if requests.get(f"http://{self.address}/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop()
        raise PrometheusServerError(self.address, "Alertmanager not ready after 30 s")

    def stop(self) -> None:
        if self.pid is not None:
            proc = self._proc
            stop_process_group(self.pid, timeout=10.0, reap=proc.poll if proc else None)
            self.pid = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
