"""The straggler alert on the real thing: the session's two-replica fleet with one replica
slowed (duty-cycle SIGSTOP), scraped by Debian's Prometheus with `phaseprobe alerts build`'s
rules (windows compressed 30x): VllmStragglerReplica fires for that replica and not the other.

Kept apart from test_alerts_live_real.py, which starts only a server of its own: that module
runs in a second pytest process beside the modules that share the session's servers.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phaseprobe.testing.prometheus_server import PrometheusServer
from phaseprobe.testing.throttle import Throttle
from tests.compressed_rules import compress_rules
from tests.integration.test_alerts_live_real import COMPRESS, _load, _states

pytestmark = pytest.mark.integration


def test_a_slowed_replica_fires_the_straggler_alert_for_it_alone(
    local_fleet, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yml"
    built = subprocess.run(
        [sys.executable, "-m", "phaseprobe", "alerts", "build", "--out", str(rules)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    rules = compress_rules(rules, tmp_path / "compressed.yml", COMPRESS)
    slow = local_fleet.replicas["r2"].removeprefix("http://")
    fast = local_fleet.replicas["r1"].removeprefix("http://")
    body = {"model": local_fleet.model, "prompt": "hi", "max_tokens": 24, "ignore_eos": True}
    stop, answered = threading.Event(), []
    states: dict[str, list[str]] = {slow: [], fast: []}
    with (
        PrometheusServer(list(local_fleet.replicas.values()), rule_files=[rules]) as prom,
        Throttle(local_fleet.replica_pids["r2"], stopped_fraction=0.8) as throttle,
    ):
        feeder = threading.Thread(
            target=_load, args=(local_fleet.router_url, body, 4.0, stop, answered)
        )
        feeder.start()
        try:
            deadline = time.monotonic() + 150
            while "firing" not in states[slow] and time.monotonic() < deadline:
                for instance in states:
                    states[instance] += _states(prom.url, "VllmStragglerReplica", instance=instance)
                time.sleep(1.0)
        finally:
            stop.set()
            feeder.join()
    figures = (states, throttle.measured_fraction, answered.count(200), len(answered))
    assert "firing" in states[slow], figures
    assert states[fast] == [], figures
