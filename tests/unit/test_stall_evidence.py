"""The stalled-engine evidence: a --pid that is not vLLM is refused, a server off this machine
or not vLLM is said, the log tail leaves our own scrapes out, py-spy reads a real process
(paused, and stopped with --nonblocking), and nothing here raises for a missing piece."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phaseprobe.analysis.engine_stall import StallReading
from phaseprobe.collect.stall_evidence import (
    _log_tail,
    check_vllm_pid,
    keep_stall_evidence,
    local_vllm_pids,
    py_spy_dump,
)
from phaseprobe.errors import ConfigError
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store

STALLED = StallReading("stalled", "1 request(s) running and nothing moved for 9.0 s", 9.0, 1.0)


def test_a_pid_that_is_not_vllm_is_refused_naming_what_it_is() -> None:
    with pytest.raises(ConfigError, match=r"is not a vLLM process \(python"):
        check_vllm_pid(os.getpid())
    with pytest.raises(ConfigError, match="no such process"):
        check_vllm_pid(2**22 + 12345)


def test_a_server_off_this_machine_or_not_vllm_is_said() -> None:
    said = local_vllm_pids("http://vllm.example:8000")
    assert isinstance(said, str) and "not on this machine's loopback" in said
    with socket.socket() as s:  # this test process listens: it is not vLLM
        s.bind(("127.0.0.1", 0))
        s.listen()
        said = local_vllm_pids(f"http://127.0.0.1:{s.getsockname()[1]}")
    assert isinstance(said, str) and "is not vLLM" in said


def test_the_log_tail_leaves_the_scrapes_out(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    lines = ['INFO: 127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK' for _ in range(500)]
    log.write_text("\n".join(["ERROR engine core hung", *lines, "WARNING last words"]))
    tail = _log_tail(log)
    assert tail["lines"] == ["ERROR engine core hung", "WARNING last words"]
    assert tail["scrape_lines_left_out"] == 500


@pytest.fixture()
def sleeper():
    code = "import time\ndef waiting_here():\n    time.sleep(600)\nwaiting_here()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.5)
    yield proc
    proc.kill()
    proc.wait()


def test_py_spy_reads_a_running_and_a_stopped_process(sleeper) -> None:
    got = py_spy_dump(sleeper.pid, "sleeper")
    assert got.get("mode") == "paused" and "waiting_here" in got["dump"], got
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        got = py_spy_dump(sleeper.pid, "sleeper")
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    assert got.get("mode") == "nonblocking" and "waiting_here" in got["dump"], got
    assert "could not be paused" in got["note"]


def test_evidence_without_a_store_or_a_local_server_says_why(tmp_path: Path) -> None:
    page = parse_exposition('vllm:num_requests_running{engine="0"} 1\n')
    said = keep_stall_evidence("r1", "http://vllm.example:8000", STALLED, [page], store_path=None)
    assert said.startswith("not kept (no store)") and "not on this machine" in said
    store = tmp_path / "s.sqlite"
    said = keep_stall_evidence("r1", "http://vllm.example:8000", STALLED, [page], store_path=store)
    assert "kept as analysis #1" in said
    with Store(store, readonly=True) as s:
        doc = s.analysis(1)
    assert doc["reading"]["frozen_s"] == 9.0
    assert doc["pages"][0]["lines"] == ['vllm:num_requests_running{engine="0"} 1']
    assert "not on this machine" in doc["stacks_missing"] and "missing" in doc["log"]
