"""Run by every Python process of a vLLM that phaseprobe starts: its directory is put first on
their ``PYTHONPATH`` (:func:`phaseprobe.local.server.build_env`), so Python imports this file at
start-up, in the API server, the engine core and each worker alike.

It asks Linux for permission to use AMX tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``). On a CPU with AMX, vLLM 0.32's CPU attention runs AMX instructions
without asking; the permission is asked only by oneDNN's brgemm, which a linear layer reaches
only for more than 4 tokens at once. A server whose first request has a prompt of 2-4 tokens
then dies of SIGILL ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)"): seen here
on 4 of 28 starts, and every time a 2-token prompt came first. Asking at start-up costs one
system call; where there is no AMX (or no Linux, or no x86-64) it fails quietly and changes
nothing.
"""

from __future__ import annotations


def _request_amx_permission() -> None:
    import platform
    import sys

    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return
    import ctypes

    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        ctypes.CDLL(None, use_errno=True).syscall(
            sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata
        )
    except (OSError, AttributeError):  # no libc symbol: nothing to ask
        pass


_request_amx_permission()
