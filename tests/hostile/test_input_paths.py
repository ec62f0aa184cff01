"""Every command that takes an input path says what a bad one really is (issue 33 item 8).

Commands × path kinds: a directory, a FIFO, a symlink loop, ``/dev/zero``, ``-`` and a missing
file, given where a file is read. Each is refused with exit 2 and one ``error:`` line naming
the path and what it is (the words of :func:`phaseprobe.inputs.path_problem`), within a second
or two and without opening it: a FIFO would block an ``open`` until a writer comes, so a
SIGALRM turns a hang into a failure here instead of a stuck suite. ``nccl`` has its own cases
in ``test_input_files``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.present.cli import main
from phaseprobe.testing.sse_server import Script, SseServer
from tests.hostile.cases import dead_url

# what each kind of path is called in the error (phaseprobe.inputs.path_problem's words)
SAID = {
    "directory": "not a regular file: it is a directory",
    "fifo": "not a regular file: it is a FIFO (named pipe)",
    "symlink-loop": "a symlink loop",
    "dev-zero": "not a regular file: it is a character device",
    "dash": "'-' (standard input) is not read",
    "missing": "no such file",
}
LLAMA_CONFIG = Path(__file__).parent.parent / "data" / "configs" / "llama-3-8b.json"
HANG_S = 10  # far above the tens of ms a refusal takes; a blocked open never returns


def _make(kind: str, where: Path) -> str:
    """The path of ``kind`` under ``where`` (made here; /dev/zero and '-' are given as is)."""
    path = where / f"input-{kind}"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-loop":
        path.symlink_to(path)
    elif kind == "dev-zero":
        return "/dev/zero"
    elif kind == "dash":
        return "-"
    return str(path)


@dataclass(frozen=True)
class Command:
    """One input path of one command: ``argv`` with ``{p}`` for the path, ``{store}`` for a
    store with one experiment, ``{srv}`` for a streaming server, ``{dead}`` for a closed
    port; ``said`` overrides :data:`SAID` for kinds this input reads differently."""

    name: str
    argv: tuple[str, ...]
    said: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()


CONFIG_DIR = (("directory", "has no config.json"),)  # a model directory: its config.json
COMMANDS = [
    Command("trace", ("trace", "{p}"), (("directory", "no *.pt.trace.json"),)),
    Command("nsys", ("nsys", "{p}")),
    Command("gpu-import", ("gpu", "import", "{p}")),
    Command("spans-import", ("spans", "import", "--store", "{new_store}", "{p}")),
    Command("plan-config", ("plan", "--gpu-mem-gb", "80", "--config", "{p}"), CONFIG_DIR),
    Command(
        "plan-metrics",
        ("plan", "--gpu-mem-gb", "80", "--config", "{config}", "--metrics", "{p}"),
    ),
    Command("calibrate-model-config", ("calibrate", "--model-config", "{p}"), CONFIG_DIR),
    Command("calibrate-python", ("calibrate", "--python", "{p}", "--quick")),
    Command("ab-playbook", ("ab", "{p}", "--store", "{new_store}")),
    Command("grafana-lint", ("grafana", "lint", "{p}")),
    Command("grafana-lint-metrics", ("grafana", "lint", "--metrics", "{p}")),
    Command(
        "grafana-import",
        ("grafana", "import", "{p}", "--url", "{dead}"),
        env=(("GRAFANA_TOKEN", "t0ken"),),
    ),
    # a CA directory (c_rehash'ed) is what requests takes too: not refused, so not here
    Command("query-ca-bundle", ("query", "--prom", "{dead}", "--ca-bundle", "{p}", "ttft_mean")),
    Command("check-trace", ("check", "--store", "{store}", "--trace", "{p}")),
    Command("check-nsys", ("check", "--store", "{store}", "--nsys", "{p}")),
    Command("check-server-log", ("check", "--store", "{store}", "--server-log", "{p}")),
    Command(
        "check-model-config",
        ("check", "--store", "{store}", "--peaks", "h100-sxm", "--model-config", "{p}"),
        CONFIG_DIR,
    ),
    Command(
        "probe-model-config",
        ("probe", "--endpoint", "{srv}", "--runs", "1", "--warmup", "0", "--no-gpu"),
        CONFIG_DIR,
    ),
]
CASES = [
    pytest.param(c, kind, id=f"{c.name}-{kind}")
    for c in COMMANDS
    for kind in SAID
    if not (c.name == "query-ca-bundle" and kind == "directory")
]


@pytest.fixture(scope="module")
def server() -> Iterator[SseServer]:
    with SseServer(Script(n_tokens=2, first_delay_s=0.001, gap_s=0.001)) as srv:
        yield srv


@pytest.fixture
def no_hang() -> Iterator[None]:
    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the command did not return within {HANG_S} s (a blocked open?)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_a_bad_input_path_is_named_as_what_it_is(
    command: Command,
    kind: str,
    tmp_path: Path,
    experiment_store: str,
    server: SseServer,
    no_hang: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    for name, value in command.env:
        monkeypatch.setenv(name, value)
    path = _make(kind, tmp_path)
    fill: dict[str, Callable[[], str]] = {
        "{p}": lambda: path,
        "{store}": lambda: experiment_store,
        "{new_store}": lambda: str(tmp_path / "new.sqlite"),
        "{srv}": lambda: server.base_url,
        "{dead}": lambda: dead_url()[0],
        "{config}": lambda: str(LLAMA_CONFIG),
    }
    argv = [fill[a]() if a in fill else a for a in command.argv]
    if command.name == "probe-model-config":
        argv += ["--store", str(tmp_path / "new.sqlite"), "--model-config", path]
    posts_before = len([r for r in server.requests if r.method == "POST"])
    started = time.monotonic()
    code = main(argv)
    took = time.monotonic() - started
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    said = dict(command.said).get(kind, SAID[kind])
    assert code == 2, err
    assert len(lines) >= 1 and lines[-1].startswith("error:"), err
    assert said in lines[-1], f"expected {said!r} in {lines[-1]!r}"
    shown = path if kind != "dash" else " -:"
    assert shown in lines[-1], lines[-1]
    assert "Traceback" not in err and took < 5, f"{took:.1f} s"
    # nothing was sent: the path is refused before the first request
    assert len([r for r in server.requests if r.method == "POST"]) == posts_before


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink-loop", "dev-zero"])
def test_a_stored_calibration_that_is_no_file_is_named(
    kind: str, tmp_path: Path, no_hang: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """``calibrate --show`` reads the stored calibration file: one that a user (or a bad
    copy) replaced by something else is named, with how to redo it, not hung on."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(data))
    stored = data / "calibration.json"
    if kind == "dev-zero":
        stored.symlink_to("/dev/zero")
    elif kind == "symlink-loop":
        stored.symlink_to(stored)
    else:
        Path(_make(kind, tmp_path)).rename(stored)
    code = main(["calibrate", "--show"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: calibration file"), err
    assert str(stored) in err and SAID[kind] in err, err


def test_no_stored_calibration_is_said_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    assert main(["calibrate", "--show"]) == 0
    assert "no calibration stored yet" in capsys.readouterr().out


def test_a_python_that_is_no_interpreter_is_refused_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """``calibrate --python dir`` with a directory ``dir`` here once ran coreutils' ``dir``
    (a bare name is looked up on PATH); a local file of a PATH program's name is run from here
    (it is not executable: the error says so, where ``true`` from PATH would have passed)."""
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert main(["calibrate", "--python", "dir", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"error: --python dir: {SAID['directory']}"), err
    (tmp_path / "true").write_text("not a program")  # /usr/bin/true would exit 0
    assert main(["calibrate", "--python", "true", "--quick"]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path / "true") in err and "Permission denied" in err, err


STORE_SAID = {
    "directory": "it is a directory",
    "fifo": "FIFO",
    "symlink-loop": "a symlink loop",
    "dev-zero": "character device",
    "dash": "standard input is no store",
    "missing": "no experiment store at",
}


@pytest.mark.parametrize("kind", list(STORE_SAID))
@pytest.mark.parametrize("command", [("runs",), ("check",), ("spans", "list")])
def test_a_store_path_that_is_no_store_is_named(
    command: tuple[str, ...],
    kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_hang: None,
) -> None:
    """``--store`` of the commands that only read: what the path is, in words (not the OS's
    "Too many levels of symbolic links", not "no store at -"), exit 2, no traceback."""
    rc = main([*command, "--store", _make(kind, tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert STORE_SAID[kind] in err and "Traceback" not in err
