"""Start and stop a real Prometheus (the Debian/upstream binary) for tests and local checks.

    with PrometheusServer(["http://127.0.0.1:8000"]) as prom:
        ...                                   # prom.url answers the HTTP API
        prom.wait_for_scrapes(2)              # every target scraped twice from now on

It binds 127.0.0.1 on a free port, keeps its TSDB in a temporary directory (the packaged default
``/var/lib/prometheus`` belongs to the prometheus user), scrapes the given targets every second
and is stopped by its process group, so no process outlives the ``with`` block.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Self
from urllib.parse import urlsplit

import requests

from phaseprobe.errors import PrometheusServerError
from phaseprobe.local.process import free_port, log_tail, stop_process_group

__all__ = ["DEFAULT_BINARY", "PrometheusServer", "scrape_config", "alerts"]

DEFAULT_BINARY = "/usr/bin/prometheus"
_HOST = "127.0.0.1"


def scrape_config(
    targets: Sequence[str],
    interval_s: float = 1.0,
    job: str = "vllm",
    *,
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
) -> dict[str, object]:
    """A Prometheus config scraping ``targets`` (``http://host:port[/path]`` or ``host:port``).
    Targets that differ in scheme or metrics path get one scrape job each. ``rule_files`` are
    evaluated at the scrape interval; ``alertmanager`` (``host:port``) receives the alerts."""
    groups: dict[tuple[str, str], list[str]] = {}
    for target in targets:
        parts = urlsplit(target if "://" in target else f"http://{target}")
        if not parts.netloc:
            raise PrometheusServerError(target, f"scrape target {target!r} has no host:port")
        path = parts.path.rstrip("/") or "/metrics"
        groups.setdefault((parts.scheme, path), []).append(parts.netloc)
    interval = f"{max(1, round(interval_s * 1000))}ms"
    jobs = [
        {
            "job_name": job if i == 0 else f"{job}_{i}",
            "scheme": scheme,
            "metrics_path": path,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": [{"targets": hosts}],
        }
        for i, ((scheme, path), hosts) in enumerate(sorted(groups.items()))
    ]
    config: dict[str, object] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": jobs,
    }
    if rule_files:
        config["rule_files"] = [str(f) for f in rule_files]
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


class PrometheusServer:
    """One Prometheus process; ``clock``/``sleep`` are injectable, the binary path too."""

    def __init__(
        self,
        targets: Sequence[str],
        *,
        binary: str | Path = DEFAULT_BINARY,
        scrape_interval_s: float = 1.0,
        workdir: Path | None = None,
        ready_timeout_s: float = 30.0,
        extra_args: Sequence[str] = (),
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.targets = list(targets)
        self.binary = Path(binary)
        self.scrape_interval_s = scrape_interval_s
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = list(extra_args)
        self.rule_files = list(rule_files)
        self.alertmanager = alertmanager
        self._given_workdir = workdir
        self._clock = clock
        self._sleep = sleep
        self.workdir: Path | None = None
        self.port: int | None = None
        self.pid: int | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owns_workdir = False

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusServerError("(not started)", "Prometheus is not running")
        return f"http://{_HOST}:{self.port}"

    def start(self) -> Self:
        if not self.binary.is_file():
            found = shutil.which(self.binary.name)
            if found is None:
                raise PrometheusServerError(
                    str(self.binary),
                    f"no Prometheus binary at {self.binary} "
                    "(Debian/Ubuntu: apt-get install prometheus)",
                )
            self.binary = Path(found)
        if self._given_workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="phaseprobe-prom-"))
            self._owns_workdir = True
        else:
            self.workdir = self._given_workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        # JSON is YAML: no YAML library needed to write the config.
        config.write_text(
            json.dumps(
                scrape_config(
                    self.targets,
                    self.scrape_interval_s,
                    rule_files=self.rule_files,
                    alertmanager=self.alertmanager,
                ),
                indent=2,
            )
        )
        self.log_path = self.workdir / "prometheus.log"
        self.port = free_port(_HOST)
        argv = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={_HOST}:{self.port}",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        # Its own session: stop() signals the group, and a Ctrl-C in pytest does not reach it
        # half-way through a write.
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = self._clock() + self.ready_timeout_s
        while self._clock() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise PrometheusServerError(
                    self.url,
                    f"Prometheus exited with code "
                    f"{self._proc.returncode}:\n{log_tail(self.log_path)}",
                )
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except requests.RequestException:
                pass  # not listening yet
            self._sleep(0.05)
        raise PrometheusServerError(
            self.url,
            f"Prometheus not ready after {self.ready_timeout_s:g} s:\n{log_tail(self.log_path)}",
        )

    def wait_for_scrapes(self, scrapes: int = 2, timeout_s: float = 30.0) -> float:
        """Block until every target has been scraped successfully ``scrapes`` times after this
        call began; returns the wall time (unix s) of the last of those scrapes. Two scrapes
        bracket anything that happened before the call, whatever the scrape phase."""
        since = time.time()
        deadline = self._clock() + timeout_s
        last: list[float] = []
        while self._clock() < deadline:
            last = self._last_scrapes()
            needed = since + (scrapes - 1) * self.scrape_interval_s
            if last and len(last) >= len(self.targets) and min(last) >= needed:
                return min(last)
            self._sleep(0.1)
        raise PrometheusServerError(
            self.url,
            f"targets not scraped {scrapes} time(s) within {timeout_s:g} s (last scrapes: {last})",
        )

    def _last_scrapes(self) -> list[float]:
        """Unix time of each healthy target's last scrape, from ``timestamp(up)``."""
        try:
            answer = requests.get(
                f"{self.url}/api/v1/query", params={"query": "timestamp(up == 1)"}, timeout=2.0
            ).json()
            return [float(item["value"][1]) for item in answer["data"]["result"]]
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return []

    def stop(self) -> None:
        """Stop the process group (SIGTERM, then SIGKILL) and remove the temporary directory."""
        if self.pid is not None:
            proc = self._proc
            try:
                stop_process_group(
                    self.pid, timeout=10.0, reap=proc.poll if proc is not None else None
                )
            except Exception as exc:
                raise PrometheusServerError(
                    self.url, f"could not stop pid {self.pid}: {exc}"
                ) from exc
            self.pid = None
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._owns_workdir = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def alerts(prom_url: str, session: requests.Session | None = None) -> list[dict[str, object]]:
    """Prometheus' active alerts (``/api/v1/alerts``): each with labels and ``state``
    (``pending`` or ``firing``)."""
    http = session or requests
    answer = http.get(f"{prom_url}/api/v1/alerts", timeout=15).json()
    found: list[dict[str, object]] = answer["data"]["alerts"]
    return found
