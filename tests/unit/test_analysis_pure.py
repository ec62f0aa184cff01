"""analysis/ is pure (issue 31 item 3): it reads no file and no environment.

The import-linter contract "analysis reads nothing" (pyproject.toml) forbids the modules that
do I/O (sqlite3, gzip, pathlib, subprocess, requests, the source readers ...). What needs no
import is checked here, on every module's syntax tree: the ``open`` builtin, file methods
(``Path.read_text``, ``.open()``, ``.exists()`` ...), and ``os`` calls that touch the world
(``os.environ``, ``os.stat``, ``os.path.exists`` ...); ``os.path``'s string helpers
(``commonprefix``) stay allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ANALYSIS = Path(__file__).resolve().parents[2] / "phaseprobe" / "analysis"

# Methods of pathlib.Path / file objects that read, write or look at the file system
# (``resolve`` is left out: MetricSnapshot.resolve names a metric family).
FILE_METHODS = frozenset(
    {
        "read_text",
        "read_bytes",
        "write_text",
        "write_bytes",
        "open",
        "exists",
        "is_file",
        "is_dir",
        "iterdir",
        "rglob",
        "stat",
        "lstat",
        "unlink",
        "mkdir",
        "touch",
        "expanduser",
    }
)
# os.path helpers that only work on strings.
OS_PATH_PURE = frozenset({"commonprefix", "join", "basename", "dirname", "splitext", "sep"})


def _dotted(node: ast.expr) -> str | None:
    """``os.path`` for the expression ``os.path``; None for anything but names and their
    attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def io_uses(source: str, filename: str) -> list[str]:
    """Each place in ``source`` that opens, reads or stats a file or reads the environment,
    as ``file:line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("open", "__import__"):
                what = f"{func.id}()"
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in FILE_METHODS
                and _dotted(func.value) not in ("os", "os.path")  # named below, as os.stat
            ):
                what = f".{func.attr}()"
        elif isinstance(node, ast.Attribute):
            owner = _dotted(node.value)
            if owner == "os" and node.attr != "path":
                what = f"os.{node.attr}"
            elif owner == "os.path" and node.attr not in OS_PATH_PURE:
                what = f"os.path.{node.attr}"
        if what is not None:
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")
    return found


def _modules() -> list[Path]:
    return sorted(ANALYSIS.rglob("*.py"))


def test_the_walk_sees_every_analysis_module():
    names = {p.relative_to(ANALYSIS).as_posix() for p in _modules()}
    # the modules this issue emptied of I/O are among those checked
    assert {"trace/summary.py", "model_math.py", "nccl/warnings.py", "nccl/report.py"} <= names
    assert len(names) > 40


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ANALYSIS).as_posix())
def test_analysis_module_does_no_io(path: Path):
    assert io_uses(path.read_text(encoding="utf-8"), str(path)) == []


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("open('run.log').read()", "open()"),
        ("from pathlib import Path\nPath(p).read_text()", ".read_text()"),
        ("p.read_bytes()", ".read_bytes()"),
        ("with p.open() as fh: pass", ".open()"),
        ("if p.exists(): pass", ".exists()"),
        ("import os\nos.environ.get('X')", "os.environ"),
        ("import os\nos.getenv('X')", "os.getenv"),
        ("import os\nos.path.exists(p)", "os.path.exists"),
        ("import os\nos.stat(p)", "os.stat"),
    ],
)
def test_each_kind_of_io_is_caught(code: str, what: str):
    assert [u.split(": ", 1)[1] for u in io_uses(code, "m.py")] == [what]


def test_string_helpers_pass():
    code = "import os\nos.path.commonprefix(['ab', 'ac'])\nos.path.join('a', 'b')\nx.read()"
    assert io_uses(code, "m.py") == []
