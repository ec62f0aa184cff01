"""The user documentation holds together (issue 43 item 5): README.md, CONTRIBUTING.md and the
task pages under docs/.

- The README stays short (under 15 KB) and its test command is the one ``.ci/run`` calls.
- Every relative link of every page resolves (file, and ``#anchor`` when it names one), no link
  leaves the repository, and every docs page is reachable from the README.
- Every ``phaseprobe ...`` line of a code block names a real command (and subcommand) and only
  options that command's parser has. Checked from the parser itself, so a renamed flag fails
  here instead of in a user's terminal.
"""

from __future__ import annotations

import argparse
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from phaseprobe.present.cli.entry import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))]
README_LIMIT_BYTES = 15 * 1024


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# -- the README's size and its test command ----------------------------------------------------


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes (limit {README_LIMIT_BYTES})"


def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def test_ci_runs_exactly_the_readme_test_command():
    """The README's second command is the test command, and CI runs it and nothing else."""
    blocks = [b.strip() for b in _fenced_blocks(README.read_text(encoding="utf-8"))]
    assert "bash tests/run_all.sh" in blocks, "the README lost its test command"
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "bash tests/run_all.sh" in ci


def test_readme_first_command_runs_the_main_job():
    blocks = [b.strip() for b in _fenced_blocks(README.read_text(encoding="utf-8"))]
    assert "pip install . && phaseprobe probe" in blocks


# -- links ---------------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(page: Path) -> frozenset[str]:
    fenced = False
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(_anchor(line.lstrip("#")))
    return frozenset(out)


def _links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # code is not linked
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_there_are_pages_and_links():
    assert len(PAGES) > 10
    assert sum(len(_links(p)) for p in PAGES) > 30  # a rewrite without links passes vacuously


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path):
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, anchor = _resolve(page, target)
        assert path.is_relative_to(ROOT), f"{_rel(page)}: link leaves the repository: {target}"
        assert path.exists(), f"{_rel(page)}: link to nothing: {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{_rel(page)}: no heading #{anchor} in {target}"


def test_every_docs_page_is_reachable_from_the_readme():
    seen: set[Path] = set()
    todo = [README.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        for target in _links(page):
            if not re.match(r"[a-z]+:", target):
                todo.append(_resolve(page, target)[0])
    missing = [_rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in seen]
    assert not missing, f"docs pages no link from README.md leads to: {missing}"


# -- commands in code blocks --------------------------------------------------------------


@cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_lines(page: Path) -> list[str]:
    """Every ``phaseprobe ...`` command of the page: in code blocks (continuation lines joined,
    comments dropped) and in inline code (the README's table)."""
    text = page.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    out = re.findall(r"(?<!`)`(phaseprobe [^`]+)`", prose)
    for block in _fenced_blocks(text):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = line.split(" # ")[0].split("  #")[0].strip()
            m = re.search(r"(?:^|&& |\$ |=\S+ )(phaseprobe\s.*)$", line)
            if m and not line.startswith("#"):
                out.append(m.group(1))
    return out


def _check_command(line: str) -> list[str]:
    """What in one command line the CLI would not know: an unknown command or option."""
    try:
        words = shlex.split(line.replace("…", "X"))
    except ValueError as e:
        return [f"cannot split: {e}"]
    parser = _parser()
    problems = []
    words = words[1:]  # "phaseprobe"
    chain = ["phaseprobe"]
    while words and not words[0].startswith("-"):
        subs = _subparsers(parser)
        if not subs:
            break
        if words[0] not in subs:
            problems.append(f"{' '.join(chain)}: no command {words[0]!r}")
            return problems
        parser = subs[words[0]]
        chain.append(words.pop(0))
    options = {s for a in parser._actions for s in a.option_strings}
    for word in words:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            if flag not in options:
                problems.append(f"{' '.join(chain)}: no option {flag}")
        elif not word.startswith("-") and _subparsers(parser):
            break  # a positional after options: the options of the parent were checked
    return problems


def _all_commands() -> list[tuple[str, str]]:
    return [(_rel(p), line) for p in PAGES for line in _command_lines(p)]


def test_the_pages_show_commands():
    assert len(_all_commands()) > 80


@pytest.mark.parametrize("page,line", _all_commands())
def test_every_command_names_real_options(page: str, line: str):
    assert not _check_command(line), f"{page}: {line}: {_check_command(line)}"


@pytest.mark.parametrize(
    "line,ok",
    [
        ("phaseprobe probe --endpoint http://x:8000 --runs 3", True),
        ("phaseprobe probe --no-such-flag", False),
        ("phaseprobe nosuchcommand", False),
        ("phaseprobe spans stats --since 1h --json", True),
        ("phaseprobe spans nosuchsub", False),
    ],
)
def test_the_command_check_itself(line: str, ok: bool):
    assert (not _check_command(line)) is ok


# -- Python examples -----------------------------------------------------------------------


def _python_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        out += [(_rel(page), b) for b in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)]
    return out


def test_there_is_a_python_example():
    assert _python_blocks()


@pytest.mark.parametrize("page,code", _python_blocks())
def test_python_examples_run(page: str, code: str, tmp_path, monkeypatch, capsys):
    """Each Python example runs as shown (it brings its own server: the shipped SSE one)."""
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} (example)", "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out, f"{page}: the example printed nothing"
