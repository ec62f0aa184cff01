"""Issue 33, items 2, 4 and 8: compressed inputs bounded, a server-named model root read only
inside an allowed directory, and input paths described as what they are."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest

from phaseprobe.collect.efficiency import (
    MODEL_ROOT_ENV,
    model_config_path,
    model_root_note,
    roofline_report,
)
from phaseprobe.collect.spans.importer import import_otlp_json
from phaseprobe.errors import ConfigError, OtlpError, TraceError
from phaseprobe.inputs import MAX_DECOMPRESSED_ENV, MAX_RATIO_ENV, open_stream, path_problem
from phaseprobe.present.cli.entry import main
from phaseprobe.sources.nccl.log import parse_files
from phaseprobe.sources.torch_trace import read_torch_trace
from phaseprobe.store import Store

MiB = 1 << 20
NCCL_LINE = b"node1:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"


@pytest.fixture()
def bomb(tmp_path: Path) -> Path:
    """96 MiB of zeros in about 100 KB: about 1000x, as a real gzip bomb."""
    p = tmp_path / "bomb.log.gz"
    p.write_bytes(gzip.compress(b"\0" * (96 * MiB), 9))
    return p


def _fail(reason: str) -> ValueError:
    return ValueError(reason)


# -- item 2: compressed inputs ------------------------------------------------------------------


def test_a_gzip_bomb_stops_at_the_ratio_naming_the_variable(bomb: Path) -> None:
    _, stream = open_stream(bomb, _fail)
    read = 0
    with stream, pytest.raises(ValueError, match=f"past the limit of 200x.*{MAX_RATIO_ENV}"):
        while chunk := stream.read(MiB):
            read += len(chunk)
    assert read <= 65 * MiB  # stopped soon after the 64 MiB the ratio is judged from


def test_the_ratio_limit_can_be_raised(bomb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_RATIO_ENV, "5000")
    _, stream = open_stream(bomb, _fail)
    with stream:
        assert len(stream.read()) == 96 * MiB


def test_the_decompressed_size_limit_names_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "big.log.gz"
    p.write_bytes(gzip.compress(NCCL_LINE * 40_000))  # 2.6 MB of text
    monkeypatch.setenv(MAX_DECOMPRESSED_ENV, "1M")
    with pytest.raises(ConfigError, match=f"big.log.gz: .*limit of 1 MiB.*{MAX_DECOMPRESSED_ENV}"):
        parse_files([p])
    monkeypatch.setenv(MAX_DECOMPRESSED_ENV, "4M")
    assert parse_files([p]).lines_nccl == 40_000


@pytest.mark.parametrize("value", ["x", "0", "-5", "1.5G", "99999999999999999999"])
def test_a_bad_limit_in_the_environment_is_named(
    tmp_path: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "a.log.gz"
    p.write_bytes(gzip.compress(NCCL_LINE))
    monkeypatch.setenv(MAX_DECOMPRESSED_ENV, value)
    with pytest.raises(ConfigError, match=f"{MAX_DECOMPRESSED_ENV}='{value}'"):
        parse_files([p])


def test_every_gzip_reader_is_bounded(bomb: Path, tmp_path: Path) -> None:
    """NCCL logs, nccl-tests output, NCCL warnings, torch traces, OTLP JSON: one helper."""
    from phaseprobe.collect.nccl_files import classify_file
    from phaseprobe.sources.nccl.tests_table import parse_nccl_tests_file

    for read in (
        lambda: parse_files([bomb]),
        lambda: parse_nccl_tests_file(bomb),
        lambda: classify_file(bomb),
    ):
        with pytest.raises(ConfigError, match="bomb.log.gz: it expands"):
            read()
    trace = tmp_path / "rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (96 * MiB) + b"]}", 9))
    with pytest.raises(TraceError, match="it expands"):
        read_torch_trace(trace)
    spans = tmp_path / "spans.jsonl.gz"
    spans.write_bytes(gzip.compress(b" " * (96 * MiB), 9))
    with Store(tmp_path / "s.db") as store, pytest.raises(OtlpError, match="it expands"):
        import_otlp_json(spans, store)


def test_readline_and_text_over_a_bounded_stream(tmp_path: Path) -> None:
    p = tmp_path / "t.gz"
    p.write_bytes(gzip.compress(b"one\ntwo\n" + b"x" * (3 * MiB)))
    _, stream = open_stream(p, _fail)
    with stream:
        assert stream.readline() == b"one\n"
        assert stream.readline() == b"two\n"
        assert len(stream.readline()) == 3 * MiB  # a line longer than a read piece, whole
        assert stream.readline() == b""
    _, stream = open_stream(p, _fail)
    with io.TextIOWrapper(stream, encoding="utf-8") as text:
        assert text.read(8) == "one\ntwo\n"


def test_a_plain_file_is_not_wrapped(tmp_path: Path) -> None:
    p = tmp_path / "plain.log"
    p.write_bytes(NCCL_LINE)
    raw, stream = open_stream(p, _fail)
    with raw:
        assert stream is raw


# -- item 8: what a bad path is ---------------------------------------------------------------


def _paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    return {
        "directory": (str(tmp_path), "a directory"),
        "fifo": (str(fifo), "a FIFO"),
        "loop": (str(loop), "a symlink loop"),
        "dangling": (str(dangling), "a dangling symlink"),
        "device": ("/dev/zero", "a character device"),
        "stdin": ("-", "standard input"),
        "missing": (str(tmp_path / "nope.log"), "no such file"),
    }


@pytest.mark.parametrize(
    "case", ["directory", "fifo", "loop", "dangling", "device", "stdin", "missing"]
)
def test_nccl_says_what_the_path_is(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, words = _paths(tmp_path)[case]
    assert words in (path_problem(path) or "")
    assert main(["nccl", path]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("content", [b"", b"not sqlite at all\n"])
def test_dashboard_refuses_a_corrupt_store(
    tmp_path: Path,
    content: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A missing store opens the start page (issue 43); one that is not a store is refused."""
    from phaseprobe.present.cli import cmd_dashboard

    def no_streamlit(*a: object, **k: object) -> None:
        raise AssertionError("Streamlit was started on a store that cannot be opened")

    monkeypatch.setattr(cmd_dashboard.subprocess, "Popen", no_streamlit)
    store = tmp_path / "s.db"
    store.write_bytes(content)
    assert main(["dashboard", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "s.db" in err and ("no experiment store" in err or "not a phaseprobe store" in err)


# -- item 4: a server-named root --------------------------------------------------------------

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
    "torch_dtype": "bfloat16",
}
SECRET = "do-not-quote-me-7f3a"


def _model(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**CONFIG, "secret_field": SECRET}))
    return d


def _info(root: str) -> dict:
    return {"models": [{"id": "m", "root": root}]}


@pytest.fixture()
def allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "allowed"
    d.mkdir()
    monkeypatch.setenv(MODEL_ROOT_ENV, str(d))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the local vLLM's models
    return d


def test_a_root_inside_the_allowed_directory_is_read(allowed: Path) -> None:
    model = _model(allowed / "tiny")
    assert model_config_path(_info(str(model)), None) == model.resolve()
    assert model_root_note(_info(str(model))) is None


def test_a_hub_name_is_not_a_place_and_says_nothing(allowed: Path) -> None:
    info = _info("meta-llama/Llama-2-70b-hf")
    assert model_config_path(info, None) is None
    assert model_root_note(info) is None


def test_dot_dot_out_of_the_allowed_directory_is_refused(
    allowed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model(tmp_path / "etc")
    escape = str(allowed / ".." / "etc")
    assert model_config_path(_info(escape), None) is None
    monkeypatch.chdir(allowed / "..")
    assert model_config_path(_info("../" + tmp_path.name + "/etc"), None) is None  # relative


def test_an_absolute_directory_outside_is_refused_with_a_note(
    allowed: Path, tmp_path: Path
) -> None:
    outside = _model(tmp_path / "elsewhere")
    info = _info(str(outside))
    assert model_config_path(info, None) is None
    note = model_root_note(info) or ""
    assert "outside" in note and MODEL_ROOT_ENV in note
    assert str(outside) not in note  # the server's text is not quoted


def test_symlinks_escaping_the_allowed_directory_are_refused(allowed: Path, tmp_path: Path) -> None:
    outside = _model(tmp_path / "outside")
    (allowed / "link").symlink_to(outside)  # the directory is a link out
    assert model_config_path(_info(str(allowed / "link")), None) is None
    inner = allowed / "inner"
    inner.mkdir()
    (inner / "config.json").symlink_to(outside / "config.json")  # only its config.json is
    assert model_config_path(_info(str(inner)), None) is None


def test_the_model_config_option_allows_its_directory(allowed: Path, tmp_path: Path) -> None:
    """The served model's own config, next to --model-config, is compared (not refused)."""
    from phaseprobe.collect.efficiency import model_config_mismatches

    mine = _model(tmp_path / "mine" / "m")
    assert model_config_mismatches(mine, _info(str(mine))) == []


def test_a_refused_root_is_never_read_nor_quoted_into_the_report(
    allowed: Path, tmp_path: Path
) -> None:
    outside = _model(tmp_path / "elsewhere")
    rep = roofline_report([], _info(str(outside)), peaks_choice="h100-sxm", model_config=None)
    text = json.dumps(rep)
    assert "outside" in rep["skipped"] and SECRET not in text and str(outside) not in text


# -- item 6: gpu import of many GPUs ------------------------------------------------------------


def test_gpu_summary_is_the_per_gpu_statistics_and_the_table_stops(tmp_path: Path) -> None:
    import pandas as pd
    from rich.console import Console

    from phaseprobe.present.cli import cmd_gpu

    n = cmd_gpu.TABLE_GPUS + 6
    frame = pd.DataFrame(
        {
            "gpu_index": [i % n for i in range(3 * n)],
            "t_ns": [i * 10**9 for i in range(3 * n)],
            "mem_used_bytes": [float(i) if i % 4 else float("nan") for i in range(3 * n)],
            "mem_total_bytes": 80.0,
            "util_gpu_pct": float("nan"),
            "util_mem_pct": 5.0,
            "power_w": [float(i % 7) for i in range(3 * n)],
            "sm_clock_mhz": 1400.0,
            "temperature_c": 60.0,
        }
    )
    rows = cmd_gpu.gpu_summary(frame)
    assert [r["gpu_index"] for r in rows] == list(range(n))
    for r in rows:  # against each GPU's own samples, NaN skipped
        g = frame[frame.gpu_index == r["gpu_index"]]
        mem = g.mem_used_bytes.dropna()
        assert r["samples"] == 3 and r["span_s"] == 2 * n
        assert r["mem_used_min_bytes"] == (mem.min() if len(mem) else None)
        assert r["mem_used_median_bytes"] == (mem.median() if len(mem) else None)
        assert r["power_mean_w"] == g.power_w.mean() and r["util_gpu_mean_pct"] is None
    buf = io.StringIO()
    cmd_gpu._render_summary(Console(file=buf, width=300), rows, "t", None)
    text = buf.getvalue()
    assert f"and 6 more GPUs (indices {n - 6}–{n - 1}, 18 samples" in text
    assert f"│ {n - 1} " not in text
