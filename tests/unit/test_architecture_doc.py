"""ARCHITECTURE.md names only what exists, and links only within the repository (issue 31).

The document drifted once (a class that was renamed, modules left out, a link outside the repo):
this test reads every name it gives and looks each one up in the code as it stands.

What counts as a name: every token in single backticks without spaces, and every ``room/`` path
in the picture (the fenced block). Literal text that is not the project's (a URL path, a TOML
key, another tool's command) goes in double backticks and is not looked up. A token resolves
when it is
- a path (``a/b.py``, ``sources/nccl/``): some file or folder of the repository ends with it;
- a dotted name (``Session.finish``, ``phaseprobe.errors.PhaseprobeError``): its first part is a
  module or a defined name, and every later part is defined inside the one before;
- a bare name (``ClientTimeline``, ``RULES``, ``playbook``): a module of the package, or a class,
  function or assignment somewhere in it (module or class level);
- a command line piece: an option (``--json``) or a phaseprobe command (``watch``).
A ``<placeholder>`` or ``*`` stands for many files: only what comes before it is checked.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "ARCHITECTURE.md"
PACKAGE = ROOT / "phaseprobe"


@cache
def repo_paths() -> tuple[str, ...]:
    """Every file and folder of the repository, relative, folders with a trailing slash."""
    out: list[str] = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith((".git/", ".git")) or "__pycache__" in rel or ".egg-info" in rel:
            continue
        out.append(rel + "/" if p.is_dir() else rel)
    return tuple(out)


@cache
def code_index() -> tuple[dict[str, set[str]], set[str]]:
    """(name -> the names defined inside it, module stems): every class, function and
    assignment of the package at module or class level, and what a class or module holds."""
    inside: dict[str, set[str]] = defaultdict(set)
    modules: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        stem = path.parent.name if path.name == "__init__.py" else path.stem
        modules.add(stem)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, body in _defined(tree.body):
            inside[stem].add(name)
            inside.setdefault(name, set())
            if body is not None:
                inside[name].update(n for n, _ in _defined(body))
    for folder in PACKAGE.rglob("*/"):
        if (folder / "__init__.py").exists():
            modules.add(folder.name)
            inside[folder.name].update(p.stem for p in folder.glob("*.py"))
            inside[folder.name].update(d.name for d in folder.iterdir() if d.is_dir())
    return inside, modules


def _defined(body: list[ast.stmt]) -> list[tuple[str, list[ast.stmt] | None]]:
    """The names one block defines, each with its own body when it is a class."""
    out: list[tuple[str, list[ast.stmt] | None]] = []
    for node in body:
        if isinstance(node, ast.ClassDef):
            out.append((node.name, node.body))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((node.name, None))
        elif isinstance(node, ast.Assign):
            out += [(t.id, None) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append((node.target.id, None))
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            out += _defined(node.body)
    return out


@cache
def command_names() -> frozenset[str]:
    """The CLI's commands, from its own table."""
    from phaseprobe.present.cli.entry import COMMANDS

    return frozenset(c.name for c in COMMANDS)


def resolves(token: str) -> bool:
    """True when the token names something that exists (see the module docstring)."""
    inside, modules = code_index()
    token = token.rstrip(".,:;")
    placeholder = re.search(r"[<*]", token)
    if placeholder:  # a template: some path continues what comes before the placeholder
        head = token[: placeholder.start()]
        return any(p.startswith(head) or ("/" + head) in p for p in repo_paths())
    token = re.sub(r"\(.*\)$", "", token)  # rule(ev) -> rule
    if token.startswith("-") or token in command_names():
        return True
    if "/" in token or re.search(r"\.(py|toml|md|sh|json|yml|yaml|promql)$", token):
        want = token.lstrip("./")
        wants = (want, want.rstrip("/") + "/")  # a folder, named with or without its slash
        return any(p in wants or p.endswith(tuple("/" + w for w in wants)) for p in repo_paths())
    parts = token.split(".")
    if parts[0] == "phaseprobe":
        parts = parts[1:] or ["phaseprobe"]
    if parts[0] not in inside and parts[0] not in modules:
        return False
    return all(b in inside.get(a, set()) for a, b in zip(parts, parts[1:]))


def doc_tokens() -> list[tuple[int, str]]:
    """(line number, token): every backticked name and every path of the picture."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out += [(n, m) for m in re.findall(r"\b[a-z_]+/(?:[a-z_]+/)*", line)]
            continue
        # single backticks only: ``double`` ones hold literal text (see the module docstring)
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
            if " " not in span.strip():
                out.append((n, span.strip()))
    return out


def test_the_document_names_things():
    assert len(doc_tokens()) > 100  # a rewrite that dropped the names would pass vacuously


@pytest.mark.parametrize("line,token", doc_tokens())
def test_every_name_exists(line: int, token: str):
    assert resolves(token), f"ARCHITECTURE.md:{line}: `{token}` names nothing in the code"


def test_links_stay_inside_the_repository():
    text = DOC.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert "://" not in target, f"link out of the repository: {target}"
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"link leaves the repository: {target}"
        assert path.exists(), f"link to nothing: {target}"
    # a path outside the repository spelled out in the text is a link in all but name
    assert "../shared" not in text


@pytest.mark.parametrize(
    "token,expected",
    [
        ("ClientTimeline", True),
        ("ClientTiming", False),  # the name the old document gave
        ("Session.finish", True),
        ("Session.no_such_method", False),
        ("phaseprobe.errors.PhaseprobeError", True),
        ("analysis/trace/summary.py", True),
        ("analysis/no_such_room.py", False),
        ("present/cli/cmd_<name>.py", True),
        ("playbooks/gpu-*", True),
        ("sources/nccl", True),
        ("sources/no_such_family", False),
        ("playbook", True),
        ("--json", True),
        ("watch", True),
    ],
)
def test_the_lookup_itself(token: str, expected: bool):
    assert resolves(token) is expected
