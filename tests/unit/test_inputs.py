"""phaseprobe/inputs.py: FIFOs and devices refused by os.stat, whole-file reads capped."""

from __future__ import annotations

import os

import pytest

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import input_problem, output_problem, read_input, read_input_text


def _fail(reason: str) -> ConfigError:
    return ConfigError(f"x: {reason}")


def test_regular_missing_and_special_files(tmp_path):
    f = tmp_path / "a.json"
    f.write_bytes(b"{}")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert input_problem(f) is None and input_problem(tmp_path / "missing") is None
    assert input_problem(fifo) == "not a regular file: it is a FIFO (named pipe)"
    assert input_problem("/dev/zero") == "not a regular file: it is a character device"
    assert input_problem(tmp_path) == "not a regular file: it is a directory"
    assert input_problem(f, cap=1) == (
        "too large: it is 2 bytes; the limit for this input is 1 bytes"
    )


def test_read_input_caps_and_never_opens_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="x: not a regular file: it is a FIFO"):
        read_input(fifo, 10, _fail)  # would block forever if it were opened
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(20 << 30)
    with pytest.raises(ConfigError, match=r"too large: it is 20\.0 GiB"):
        read_input(big, 1 << 20, _fail)
    small = tmp_path / "s.txt"
    small.write_bytes(b"\xef\xbb\xbfa\r\nb\rc\n")
    assert read_input_text(small, 100, _fail, encoding="utf-8-sig") == "a\nb\nc\n"
    with pytest.raises(ConfigError, match="x: no such file"):  # said like the others
        read_input(tmp_path / "missing", 10, _fail)


def test_output_targets(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert output_problem(fifo) == "not a regular file: it is a FIFO (named pipe)"
    assert output_problem(tmp_path) == "not a regular file: it is a directory"
    assert output_problem(tmp_path / "new.json") is None
    assert output_problem("/dev/null") is None  # a character device never blocks a write


def test_directory_problem_says_what_a_path_is_instead(tmp_path):
    from phaseprobe.inputs import SYMLINK_LOOP, directory_problem

    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert directory_problem(tmp_path) is None
    assert directory_problem(tmp_path / "file") == "a file, not a directory"
    assert directory_problem(tmp_path / "fifo") == "a FIFO (named pipe)"
    assert directory_problem("/dev/zero") == "a character device"
    assert directory_problem(tmp_path / "loop") == SYMLINK_LOOP
    assert directory_problem(tmp_path / "missing") == "no such directory"
    assert "dangling symlink" in (directory_problem(tmp_path / "dangling") or "")
    assert "standard input" in (directory_problem("-") or "")
