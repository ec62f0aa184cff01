"""Run the torch benchmark in an interpreter that has torch, and keep its results.

:func:`model_shapes` turns a model's config.json into the GEMMs one of its layers runs, so
``phaseprobe calibrate --model-config`` times the kernels at the shapes the server uses.

phaseprobe never imports torch: :data:`SCRIPT` (``bench_script.py``, stdlib + torch only) runs
in a subprocess. The interpreter is the first of

1. the one given explicitly (``--python``),
2. the current one, when ``torch`` is importable here,
3. the local vLLM venv's (``phaseprobe local install``; its CPU torch is real torch),

and a :class:`~phaseprobe.errors.ConfigError` saying how to get one when there is none.

Results are stored in ``data_dir()/calibration.json``, one entry per device name (the latest
measurement of each device wins), written atomically so a crash never leaves half a file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from phaseprobe.analysis.roofline import Peaks
from phaseprobe.errors import CalibrationError, ConfigError
from phaseprobe.inputs import JSON_DOC_CAP, path_problem, read_input_text
from phaseprobe.local.venv import default_venv_dir, is_installed, venv_python
from phaseprobe.paths import data_dir, write_atomic

__all__ = [
    "SCRIPT",
    "CALIBRATION_FILE",
    "CalibrationError",
    "Calibration",
    "Completed",
    "Runner",
    "find_interpreter",
    "run_benchmark",
    "parse_output",
    "calibration_path",
    "save",
    "load_all",
    "load",
]

SCRIPT = Path(__file__).with_name("bench_script.py")
CALIBRATION_FILE = "calibration.json"
FILE_SCHEMA = 1
_TAIL_LINES = 15


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], Completed]
"""Runs an argv with a timeout in seconds; raises ``subprocess.TimeoutExpired``/``OSError``."""


def run_subprocess(argv: Sequence[str], timeout_s: float) -> Completed:
    """Default :data:`Runner`. Threads are left to torch's default (all cores).

    The benchmark runs in a process group of its own, killed whole on every way out (done,
    the timeout, SIGTERM or Ctrl-C reaching phaseprobe, any error): a worker it spawned
    would otherwise outlive the command, holding its pipes (so the wait never ends) and the
    cores the next measurement needs."""
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:
        _kill_group(proc)
    return Completed(proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to ``proc``'s process group (its leader is ``proc``), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass


@dataclass(frozen=True)
class Calibration:
    """One device's measured peaks (decimal units, like the datasheets)."""

    device: str  # "cpu" or "cuda"
    device_name: str  # torch's name for it: "NVIDIA H100 80GB HBM3", the CPU model...
    mem_bandwidth_best_gb_s: float
    mem_bandwidth_median_gb_s: float
    matmul_best_tflop_s: dict[str, float]  # dtype ("bf16", "fp32") → best of the repeats
    matmul_median_tflop_s: dict[str, float]
    measured_at: float  # unix seconds
    torch_version: str
    interpreter: str
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # the script's output

    def to_peaks(self, dtype: str = "bf16") -> Peaks:
        """Peaks for the roofline: best bandwidth, and the best matmul rate of ``dtype``, the
        dtype the model is served in (fp32 when that dtype was not measured).

        On a CPU a 16-bit product never needs more than the fp32 units it can be widened
        into (that is how AVX2 CPUs without bf16 FMA compute it, and what oneDNN or a
        compiled graph does), so the roof of bf16/fp16 there is the better of the two
        measured rates: a slow generic 16-bit path would otherwise set a roof the server
        beats. The origin names the rate used."""
        rates = self.matmul_best_tflop_s
        flops, used, why = rates.get(dtype), dtype, ""
        if flops is None and "fp32" in rates:
            flops, used = rates["fp32"], "fp32"
        elif (
            flops is not None
            and self.device == "cpu"
            and dtype in ("bf16", "fp16")
            and rates.get("fp32", 0.0) > flops
        ):
            why = f" > {dtype}'s {flops * 1e3:.3g}, served {dtype} widened"
            flops, used = rates["fp32"], "fp32"
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.measured_at))
        matmul = self.raw.get("matmul")
        section = matmul.get(used) if isinstance(matmul, dict) else None
        linear = isinstance(section, dict) and section.get("kernel") == "torch.nn.functional.linear"
        kernel = "F.linear" if linear else "matmul"
        rate = "—" if flops is None else f"{flops * 1e3:.3g} GFLOP/s"
        return Peaks(
            self.mem_bandwidth_best_gb_s * 1e9,
            None if flops is None else flops * 1e12,
            f"calibrated {self.device_name}: {used} {kernel} {rate}{why}; "
            f"{self.mem_bandwidth_best_gb_s:.3g} GB/s; {when}",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """A stored entry, every number checked (finite, positive, of the right type: a
        string or 1e308 for ``measured_at`` would crash every later reader); a bad one is a
        CalibrationError naming the key."""
        return cls(
            device=str(d["device"]),
            device_name=str(d["device_name"]),
            mem_bandwidth_best_gb_s=_rate(d, "mem_bandwidth_best_gb_s", "memory bandwidth"),
            mem_bandwidth_median_gb_s=_rate(d, "mem_bandwidth_median_gb_s", "memory bandwidth"),
            matmul_best_tflop_s=_rates(d, "matmul_best_tflop_s"),
            matmul_median_tflop_s=_rates(d, "matmul_median_tflop_s"),
            measured_at=_when(d.get("measured_at")),
            torch_version=str(d["torch_version"]),
            interpreter=str(d["interpreter"]),
            raw=dict(d.get("raw") or {}),
        )


def _torch_importable() -> bool:
    """Whether this interpreter could import torch (without importing it: that takes seconds
    and hundreds of MB, and phaseprobe must not depend on it)."""
    return importlib.util.find_spec("torch") is not None


def find_interpreter(explicit: str | None = None, *, venv: Path | None = None) -> str:
    """The Python that will run the benchmark (see the module docstring for the order)."""
    if explicit:
        problem = path_problem(explicit)  # missing, '-', a loop, a directory, a FIFO, a device
        if problem:
            raise ConfigError(f"--python {explicit}: {problem}")
        # absolute: a bare name ('dir', 'python') would be looked up on PATH, not run from here
        return str(Path(explicit).absolute())
    if _torch_importable():
        return sys.executable
    venv = venv or default_venv_dir()
    if is_installed(venv):
        return str(venv_python(venv))
    raise ConfigError(
        f"calibrate needs torch: it is not importable by {sys.executable} and the local vLLM "
        f"venv ({venv}) is not installed; `pip install torch`, run `phaseprobe local install`, "
        f"or pass --python PATH to an interpreter that has torch"
    )


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-_TAIL_LINES:])


def _rate(section: Any, key: str, what: str) -> float:
    value = section.get(key) if isinstance(section, dict) else None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise CalibrationError(f"benchmark result has no positive {what} ({key}={value!r})")
    return float(value)


def _rates(d: dict[str, Any], key: str) -> dict[str, float]:
    section = d.get(key)
    if not isinstance(section, dict) or not section:
        raise CalibrationError(f"{key} is not a table of dtype rates ({section!r:.60})")
    return {str(k): _rate(section, k, f"{key}.{k}") for k in section}


# measured_at: unix seconds from 1970 to 2200 (time.gmtime overflows on 1e308; a string or a
# list is no time at all)
_EARLIEST, _LATEST = 0.0, 7258118400.0


def _when(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not _EARLIEST <= value <= _LATEST
    ):  # NaN fails both comparisons
        raise CalibrationError(f"measured_at {value!r:.60} is not a time (unix seconds)")
    return float(value)


def parse_output(stdout: str, interpreter: str) -> Calibration:
    """The :class:`Calibration` in the script's stdout: its last line that is a JSON object
    (library warnings may precede it)."""
    doc: Any = None
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            break
    if not isinstance(doc, dict):
        excerpt = _tail(stdout) or "(no output)"
        raise CalibrationError(f"benchmark printed no JSON result; stdout:\n{excerpt}")
    matmul = doc.get("matmul")
    best, median = {}, {}
    for dtype, section in (matmul if isinstance(matmul, dict) else {}).items():
        if isinstance(section, dict) and "error" not in section:
            best[dtype] = _rate(section, "best_tflop_s", f"{dtype} matmul rate")
            median[dtype] = _rate(section, "median_tflop_s", f"{dtype} matmul rate")
    if not best:
        raise CalibrationError("benchmark result has no matmul measurement")
    return Calibration(
        device=str(doc.get("device", "?")),
        device_name=str(doc.get("device_name", "?")),
        mem_bandwidth_best_gb_s=_rate(doc.get("memory"), "best_gb_s", "memory bandwidth"),
        mem_bandwidth_median_gb_s=_rate(doc.get("memory"), "median_gb_s", "memory bandwidth"),
        matmul_best_tflop_s=best,
        matmul_median_tflop_s=median,
        measured_at=_when(doc["measured_at"])
        if doc.get("measured_at") is not None
        else time.time(),
        torch_version=str(doc.get("torch_version", "?")),
        interpreter=interpreter,
        raw=doc,
    )


def run_benchmark(
    device: str = "auto",
    *,
    interpreter: str | None = None,
    quick: bool = False,
    timeout_s: float = 300.0,
    runner: Runner = run_subprocess,
    script: Path = SCRIPT,
    shapes: Sequence[tuple[int, int, int]] = (),
    budget_s: float | None = None,
) -> Calibration:
    """Run :data:`SCRIPT` on ``device`` (``auto``: CUDA when torch sees one, else CPU);
    ``shapes``: a model's own (M, K, N) GEMMs, timed beside the script's generic layer;
    ``budget_s``: seconds per dtype for all GEMMs."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: use cpu, cuda or auto")
    if budget_s is not None and not budget_s > 0:
        raise ConfigError(f"--budget {budget_s:g}: must be a positive number of seconds")
    python = find_interpreter(interpreter)
    argv = [
        python,
        str(script),
        "--device",
        device,
        *(["--quick"] if quick else []),
        *[a for m, k, n in shapes for a in ("--shape", f"{m},{k},{n}")],
        *(["--budget-s", f"{budget_s:g}"] if budget_s is not None else []),
    ]
    try:
        done = runner(argv, timeout_s)
    except subprocess.TimeoutExpired:
        raise CalibrationError(
            f"benchmark did not finish within {timeout_s:g} s ({' '.join(argv)})"
        ) from None
    except OSError as exc:
        raise CalibrationError(f"cannot run {python}: {exc}") from None
    if done.returncode != 0:
        raise CalibrationError(
            f"benchmark failed with exit code {done.returncode} "
            f"({python}); last output:\n{_tail(done.stderr or done.stdout)}"
        )
    return parse_output(done.stdout, python)


def model_shapes(config: str | Path, tokens: int = 128) -> list[tuple[int, int, int]]:
    """(M, K, N) of one decoder layer's linear layers as vLLM fuses them (QKV, output,
    gate+up, down) for a prefill of ``tokens`` tokens, from a config.json or model dir."""
    from phaseprobe.analysis import model_math
    from phaseprobe.sources.model_config import read_model_config

    if tokens < 1:
        raise ConfigError(f"--tokens {tokens}: must be at least 1")
    cfg, source = read_model_config(config)
    shape = model_math.parse_shape(cfg, source)
    a, h = shape.attention, shape.hidden_size
    inter = shape.moe.expert_intermediate_size if shape.moe else shape.intermediate_size
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    up = (2 if shape.gated_mlp else 1) * inter
    found = [(tokens, h, q + 2 * kv), (tokens, q, h), (tokens, h, up), (tokens, inter, h)]
    return list(dict.fromkeys(found))  # order kept, duplicates once


def calibration_path() -> Path:
    return data_dir() / CALIBRATION_FILE


def load_all(path: Path | None = None) -> dict[str, Calibration]:
    """Every stored calibration by device name ({} when none was stored yet)."""
    path = path or calibration_path()

    def fail(reason: str) -> ConfigError:
        return ConfigError(f"calibration file {path}: {reason}")

    if not os.path.lexists(path):  # nothing stored yet (a dangling link is damage: said)
        return {}
    try:
        doc = json.loads(read_input_text(path, JSON_DOC_CAP, fail))
    except FileNotFoundError:
        return {}
    except RecursionError:
        raise ConfigError(f"calibration file {path}: input nested too deeply") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"calibration file {path} cannot be read ({exc}); {_REDO}") from None
    devices = doc.get("devices") if isinstance(doc, dict) else None
    if not isinstance(devices, dict):
        raise ConfigError(f"calibration file {path} is not a phaseprobe calibration file; {_REDO}")
    try:
        return {name: Calibration.from_dict(entry) for name, entry in devices.items()}
    except CalibrationError as exc:
        raise ConfigError(f"calibration file {path} is damaged: {exc}; {_REDO}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"calibration file {path} is damaged: malformed entry ({exc!r}); {_REDO}"
        ) from None


_REDO = "run `phaseprobe calibrate` to measure again (it replaces the file)"


def save(cal: Calibration, path: Path | None = None) -> Path:
    """Add or replace ``cal``'s device entry; the file is replaced atomically."""
    path = path or calibration_path()
    try:
        entries = load_all(path)
    except ConfigError:
        if not path.is_file():
            raise
        # a damaged file is what a new measurement replaces: kept aside, never a dead end
        entries = {}
        _file_op(path, lambda: os.replace(path, path.with_name(path.name + ".damaged")))
    entries[cal.device_name] = cal
    doc = {"schema": FILE_SCHEMA, "devices": {k: v.to_dict() for k, v in entries.items()}}
    _file_op(path, lambda: write_atomic(path, json.dumps(doc, indent=2) + "\n"))
    return path


def _file_op(path: Path, op: Callable[[], object]) -> None:
    """``op()``, its OSError (a full disk, a read-only directory) a ConfigError naming the
    calibration file: it was a traceback at the end of a 20 s measurement."""
    try:
        op()
    except OSError as exc:
        raise ConfigError(
            f"calibration file {path}: cannot be written "
            f"({exc.strerror or type(exc).__name__}); the measurement was not stored"
        ) from None


def load(device_name: str | None = None, path: Path | None = None) -> Calibration | None:
    """The stored calibration of ``device_name``, or the most recent one when None."""
    entries = load_all(path)
    if device_name is not None:
        return entries.get(device_name)
    return max(entries.values(), key=lambda c: c.measured_at, default=None)
