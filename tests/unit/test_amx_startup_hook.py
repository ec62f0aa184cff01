"""The vLLM processes phaseprobe starts ask Linux for AMX at start-up: without it, on an AMX
CPU, a first prompt of 2-4 tokens killed vLLM 0.32's worker with SIGILL (reproduced here: a
first request "hi" answered 500, "VllmWorker-0 died unexpectedly (exit code: -4)"; with the
hook, 200)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from phaseprobe.local.server import build_env

# arch_prctl(ARCH_GET_XCOMP_PERM): the permitted extended features; bit 18 is AMX tile data
CHECK = """
import ctypes
m = ctypes.c_uint64(0)
r = ctypes.CDLL(None, use_errno=True).syscall(158, 0x1022, ctypes.byref(m))
print(r, int(bool(m.value & (1 << 18))))
"""


def _has_amx() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_tile" in flags


def test_the_hook_comes_first_on_the_path_and_keeps_the_users() -> None:
    env = build_env(base={"PYTHONPATH": "/somewhere/else"})
    first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
    assert Path(first, "sitecustomize.py").is_file()
    assert rest == "/somewhere/else"
    assert build_env(base={})["PYTHONPATH"] == first


def test_a_process_started_with_the_env_may_use_amx_where_the_cpu_has_it() -> None:
    env = build_env(base={"PATH": os.environ.get("PATH", "")})
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    bare = subprocess.run(
        [sys.executable, "-I", "-c", CHECK], capture_output=True, text=True, check=True
    ).stdout.split()
    if sys.platform == "linux" and _has_amx() and out[0] == "0":
        assert out[1] == "1", out  # asked and granted at start-up
        assert bare[1] == "0", bare  # not by Python itself: the hook did it
    else:  # no AMX (or no such call): the hook changed nothing and broke nothing
        assert out[1:] == bare[1:]
