"""nvidia-smi CSV logs (as nvidia-smi writes them) and DCGM-exporter series through a stub
Prometheus, imported as GPU sample frames; plus ``phaseprobe gpu import``."""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from phaseprobe.errors import ConfigError, EmptyResult, ParseError
from phaseprobe.present.cli import cmd_gpu
from phaseprobe.sources.gpu.importer import (
    DCGM_METRICS,
    DEFAULT_FIELDS,
    import_dcgm,
    parse_nvidia_smi_csv,
    read_nvidia_smi_csv,
)
from phaseprobe.sources.gpu.nvml import COLUMNS
from phaseprobe.sources.prometheus import PrometheusClient
from tests.prometheus_stub import Reply, Stub

MiB = 1024**2

# `nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu,
#  utilization.memory,power.draw,clocks.sm,clocks.mem,temperature.gpu --format=csv -l 1`
# on a 2-GPU node: nvidia-smi prints clocks.sm/clocks.mem under their long names.
HEADER = (
    "timestamp, index, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
    "utilization.memory [%], power.draw [W], clocks.current.sm [MHz], "
    "clocks.current.memory [MHz], temperature.gpu"
)
CAPTURE = f"""{HEADER}
2024/05/01 12:00:00.123, 0, 1234 MiB, 81559 MiB, 0 %, 0 %, 70.21 W, 345 MHz, 2619 MHz, 31
2024/05/01 12:00:00.125, 1, 1230 MiB, 81559 MiB, 0 %, 0 %, 68.90 W, 345 MHz, 2619 MHz, 30
2024/05/01 12:00:01.130, 0, 73412 MiB, 81559 MiB, 45 %, 12 %, 250.12 W, 1980 MHz, 2619 MHz, 45
2024/05/01 12:00:01.131, 1, 73408 MiB, 81559 MiB, 44 %, 11 %, [N/A], 1980 MHz, 2619 MHz, 44
2024/05/01 12:00:02.135, 0, 73412 MiB, 81559 MiB, 97 %, 40 %, 690.50 W, 1980 MHz, 2619 MHz, 58
2024/05/01 12:00:02.136, 1, 73408 MiB, 81559 MiB, 9 %, 39 %, [Not Supported], 1980 MHz, 2619 MHz, 57
"""
T0_NS = int(datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC).timestamp()) * 10**9 + 123 * 10**6


def _parse(text: str, **kw: Any):
    kw.setdefault("tz", UTC)
    return parse_nvidia_smi_csv(text.splitlines(keepends=True), **kw)


def test_real_capture_format():
    result = _parse(CAPTURE)
    f = result.frame
    assert result.rows == 6 and result.headers == 1 and result.malformed == 0
    assert list(f.columns) == list(COLUMNS)
    assert f.t_ns[0] == T0_NS and f.t_ns[2] == T0_NS + 1_007_000_000
    assert list(f.gpu_index) == [0, 1, 0, 1, 0, 1]
    assert f.mem_used_bytes[2] == 73412 * MiB and f.mem_total_bytes[0] == 81559 * MiB
    assert f.util_gpu_pct[4] == 97 and f.util_mem_pct[4] == 40 and f.power_w[2] == 250.12
    assert f.sm_clock_mhz[2] == 1980 and f.mem_clock_mhz[2] == 2619 and f.temperature_c[4] == 58
    assert math.isnan(f.power_w[3]) and math.isnan(f.power_w[5])  # [N/A], [Not Supported]
    assert math.isnan(f.mem_reserved_bytes[0])  # not in the query


def test_timestamps_are_local_time_unless_a_zone_is_given():
    local = parse_nvidia_smi_csv(CAPTURE.splitlines()).frame
    expected = int(datetime(2024, 5, 1, 12, 0, 0, 123000).astimezone().timestamp() * 1e6) * 1000
    assert local.t_ns[0] == expected


def test_repeated_and_changed_headers():
    # Two captures appended to one file, the second with another field order and `name`.
    second = (
        "timestamp, name, index, memory.used [MiB], power.draw [W]\n"
        "2024/05/01 12:00:05.000, NVIDIA H100 80GB HBM3, 0, 100 MiB, 80.00 W\n"
    )
    result = _parse(CAPTURE + HEADER + "\n" + CAPTURE.splitlines()[1] + "\n" + second)
    assert result.headers == 3 and result.rows == 8 and result.malformed == 0
    last = result.frame.iloc[-1]
    assert last.mem_used_bytes == 100 * MiB and last.power_w == 80.0
    assert last["name"] == "NVIDIA H100 80GB HBM3"  # unknown column kept as text
    assert result.unknown_columns == ("name",)
    assert math.isnan(last.util_gpu_pct)  # not in that capture's query


def test_noheader_nounits_and_nounits_with_header():
    rows = (
        "2024/05/01 12:00:00.123, 0, 1234, 81559, 45, 12, 250.12, 1980, 2619, 45\n"
        "2024/05/01 12:00:00.124, 1, 1000, 81559, 44, 11, [N/A], 1980, 2619, 44\n"
    )
    noheader = _parse(rows)  # default fields: the documented query
    assert noheader.rows == 2 and noheader.frame.mem_used_bytes[0] == 1234 * MiB
    assert noheader.frame.power_w[0] == 250.12 and math.isnan(noheader.frame.power_w[1])
    withheader = _parse(HEADER + "\n" + rows)
    assert withheader.frame.equals(noheader.frame)
    custom = _parse("2024/05/01 12:00:00.123, 3, 2\n", fields=["timestamp", "index", "memory.used"])
    assert custom.frame.gpu_index[0] == 3 and custom.frame.mem_used_bytes[0] == 2 * MiB
    assert list(DEFAULT_FIELDS)[:2] == ["timestamp", "index"]


def test_the_seed_query_without_timestamp_or_index():
    # nvidia-smi --query-gpu=memory.used --format=csv -l 1
    text = "memory.used [MiB]\n1234 MiB\n73412 MiB\n73412 MiB\n"
    result = _parse(text, start_ns=10**18, interval_s=1.0)
    assert list(result.frame.t_ns) == [10**18, 10**18 + 10**9, 10**18 + 2 * 10**9]
    assert list(result.frame.gpu_index) == [0, 0, 0]
    assert any("no timestamp" in n for n in result.notes)
    two = _parse("memory.used [MiB]\n1 MiB\n2 MiB\n3 MiB\n4 MiB\n", gpus=2)
    assert list(two.frame.gpu_index) == [0, 1, 0, 1]
    assert list(two.frame.t_ns) == [0, 0, 10**9, 10**9]


MALFORMED = f"""{HEADER}
2024/05/01 12:00:00.123, 0, 1234 MiB, 81559 MiB, 0 %, 0 %, 70.21 W, 345 MHz, 2619 MHz, 31
2024/05/01 12:00:00.125, 1, 1230 MiB, 81559 MiB, 0 %
2024/05/01 12:00:01.130, 0, lots MiB, 81559 MiB, 45 %, 12 %, 250.12 W, 1980 MHz, 2619 MHz, 45
yesterday, 1, 73408 MiB, 81559 MiB, 44 %, 11 %, 99 W, 1980 MHz, 2619 MHz, 44
2024/05/01 12:00:02.135, 0, 73412 MiB, 81559 MiB, 97 %, 40 %, 690.50 W, 1980 MHz, 2619 MHz, 58
"""


def test_malformed_lines_lenient_and_strict(tmp_path):
    lenient = _parse(MALFORMED)
    assert lenient.rows == 2 and lenient.malformed == 3
    assert lenient.first_malformed and lenient.first_malformed.startswith("line 3:")
    path = tmp_path / "gpu.csv"
    path.write_text(MALFORMED)
    with pytest.raises(ParseError) as info:
        read_nvidia_smi_csv(path, strict=True, tz=UTC)
    err = info.value
    assert err.source == str(path) and err.line_no == 3 and err.line.endswith("0 %")
    assert f"{path}:3:" in str(err) and "5 fields, the header has 10" in str(err)
    bad_number = MALFORMED.splitlines()
    del bad_number[2]
    with pytest.raises(ParseError, match="lots"):
        _parse("\n".join(bad_number), strict=True)
    with pytest.raises(ConfigError, match="cannot read"):
        read_nvidia_smi_csv(tmp_path / "missing.csv")


_LINE_PARTS = st.sampled_from(
    [
        "2024/05/01 12:00:00.123",
        "0",
        "1",
        "1234 MiB",
        "45 %",
        "[N/A]",
        "250.12 W",
        "1980 MHz",
        "memory.used [MiB]",
        "timestamp",
        "index",
        "x",
        "",
        "-1",
        "1e400",
        "²",
        "9999/99/99 99:99:99",
        "0001/01/01 00:00:00.000",
        "12 furlongs",
        "[Not Supported]",
    ]
)
_LINES = st.one_of(
    st.text(max_size=80), st.lists(_LINE_PARTS, min_size=1, max_size=12).map(", ".join)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_LINES, max_size=12), st.booleans())
def test_fuzz_only_parse_error_escapes(lines, strict):
    text = [HEADER + "\n", *(line + "\n" for line in lines)]
    try:
        result = parse_nvidia_smi_csv(text, strict=strict, tz=UTC)
    except ParseError:
        assert strict
        return
    assert result.rows + result.malformed <= len(lines)
    assert list(result.frame.columns)[: len(COLUMNS)] == list(COLUMNS)


# -- DCGM exporter through a stub Prometheus ---------------------------------------------------

T = 1_714_564_800.0
_DCGM_VALUES = {  # metric -> per gpu, per time
    "DCGM_FI_DEV_FB_USED": [[1000, 70000, 70000], [900, 69000, 69000]],
    "DCGM_FI_DEV_FB_FREE": [[80000, 11000, 11000], [80100, 12000, 12000]],
    "DCGM_FI_DEV_FB_RESERVED": [[559, 559, 559], [559, 559, 559]],
    "DCGM_FI_DEV_GPU_UTIL": [[0, 50, 97], [0, 49, 96]],
    "DCGM_FI_DEV_MEM_COPY_UTIL": [[0, 10, 40], [0, 9, 39]],
    "DCGM_FI_DEV_POWER_USAGE": [[70.5, 300.25, 690.0], [69.0, 299.0, 688.0]],
    "DCGM_FI_DEV_SM_CLOCK": [[345, 1980, 1980], [345, 1980, 1980]],
    "DCGM_FI_DEV_MEM_CLOCK": [[2619, 2619, 2619], [2619, 2619, 2619]],
    "DCGM_FI_DEV_GPU_TEMP": [[31, 45, 58], [30, 44, 57]],
}


def dcgm_stub(values: dict[str, list[list[float]]]) -> Stub:
    """A Prometheus query_range API answering DCGM-exporter series (two GPUs, three points)."""
    stub = Stub()

    def query_range(params: dict[str, list[str]]) -> Reply:
        metric = params.get("query", [""])[0].split("{")[0]
        result = [
            {
                "metric": {
                    "__name__": metric,
                    "gpu": str(g),
                    "Hostname": "node1",
                    "UUID": f"GPU-{g}",
                },
                "values": [[T + i, str(v)] for i, v in enumerate(per_t)],
            }
            for g, per_t in enumerate(values.get(metric, []))
        ]
        return Reply(body={"status": "success", "data": {"resultType": "matrix", "result": result}})

    stub.routes["/api/v1/query_range"] = query_range
    return stub


@pytest.fixture
def dcgm() -> Iterator[Stub]:
    stub = dcgm_stub(_DCGM_VALUES)
    yield stub
    stub.close()


def test_dcgm_series_become_gpu_samples(dcgm):
    with PrometheusClient(dcgm.url, environ={}, retries=0) as client:
        result = import_dcgm(client, start=T, end=T + 2, step="1s", selector='{Hostname="node1"}')
    f = result.frame
    assert result.rows == 6 and list(f.columns) == [*COLUMNS, "host"]
    assert list(f.gpu_index) == [0, 1, 0, 1, 0, 1] and set(f.host) == {"node1"}
    assert f.t_ns[0] == int(T * 1e9) and f.t_ns[2] == int((T + 1) * 1e9)
    assert f.mem_used_bytes[2] == 70000 * MiB
    assert f.mem_total_bytes[0] == (1000 + 80000 + 559) * MiB  # used + free + reserved
    assert f.util_gpu_pct[4] == 97 and f.util_mem_pct[4] == 40 and f.power_w[2] == 300.25
    assert f.sm_clock_mhz[2] == 1980 and f.temperature_c[5] == 57
    assert math.isnan(f.pcie_rx_bytes_per_s[0])  # PROF metrics not exported
    assert 'DCGM_FI_DEV_FB_USED{Hostname="node1"}' in dcgm.queries()


def test_dcgm_without_series_is_empty_result():
    stub = dcgm_stub({})
    try:
        with (
            PrometheusClient(stub.url, environ={}, retries=0) as client,
            pytest.raises(EmptyResult, match="DCGM"),
        ):
            import_dcgm(client, start=T, end=T + 2)
    finally:
        stub.close()


# -- phaseprobe gpu import ---------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_gpu.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def _consoles() -> tuple[Console, Console]:
    return (Console(file=io.StringIO(), width=200), Console(file=io.StringIO(), width=200))


def test_gpu_import_command(tmp_path, dcgm):
    path = tmp_path / "gpu.csv"
    path.write_text(MALFORMED)
    out, err = _consoles()
    assert cmd_gpu.run(_args("gpu", "import", str(path), "--tz", "UTC", "--json"), out, err) == 0
    doc = json.loads(out.file.getvalue())
    assert doc["import"]["rows"] == 2 and doc["import"]["malformed"] == 3
    assert doc["samples"][0]["t_ns"] == T0_NS and doc["samples"][0]["power_w"] == 70.21
    with pytest.raises(ParseError):
        cmd_gpu.run(_args("gpu", "import", str(path), "--strict"), *_consoles())
    out, err = _consoles()
    assert cmd_gpu.run(_args("gpu", "import", str(path), "--tz", "+02:00"), out, err) == 0
    assert "2 samples" in out.file.getvalue() and "malformed" in err.file.getvalue()
    out, err = _consoles()
    assert (
        cmd_gpu.run(
            _args(
                "gpu",
                "import",
                "--dcgm",
                "--prom",
                dcgm.url,
                "--start",
                str(T),
                "--end",
                str(T + 2),
                "--json",
            ),
            out,
            err,
        )
        == 0
    )
    assert len(json.loads(out.file.getvalue())["samples"]) == 6
    for bad in (
        ("gpu", "import"),
        ("gpu", "import", "--dcgm"),
        ("gpu", "import", str(path), "--tz", "Mars/Olympus"),
    ):
        with pytest.raises(ConfigError):
            cmd_gpu.run(_args(*bad), *_consoles())


# GPU 1's lines all lost their power field to a cut (a second writer on the file): its
# samples are absent from the frame, and the account says so by GPU and by line.
GPU1_CUT = f"""{HEADER}
2024/05/01 12:00:00.123, 0, 1234 MiB, 81559 MiB, 0 %, 0 %, 70.21 W, 345 MHz, 2619 MHz, 31
2024/05/01 12:00:00.125, 1, 1230 MiB, 81559 MiB, 0 %, 0 %, 68.9
2024/05/01 12:00:01.130, 0, 73412 MiB, 81559 MiB, 45 %, 12 %, 250.12 W, 1980 MHz, 2619 MHz, 45
2024/05/01 12:00:01.131, 1, 73408 MiB, 81559 MiB, 44 %, 11
"""


def test_completeness_names_malformed_lines_and_a_gpu_with_nothing_read():
    result = _parse(GPU1_CUT)
    acc = result.summary()["completeness"]
    assert (result.rows, result.malformed) == (2, 2)
    assert (acc["unit"], acc["found"], acc["read"], acc["complete"]) == (
        "sample lines",
        4,
        2,
        False,
    )
    assert acc["missing"] == ["2 malformed line(s) (line 3, 5)", "GPU 1: every line malformed"]
    whole = _parse(CAPTURE).summary()["completeness"]
    assert (whole["found"], whole["read"], whole["complete"]) == (6, 6, True)


def test_dcgm_series_without_gpu_label_are_in_the_account():
    stub = dcgm_stub(_DCGM_VALUES)
    plain = stub.routes["/api/v1/query_range"]

    def with_unlabelled(params: dict[str, list[str]]) -> Reply:
        reply = plain(params)  # the two GPUs, and a series an exporter wrote without "gpu"
        reply.body["data"]["result"].append({"metric": {"Hostname": "node1"}, "values": [[T, "1"]]})
        return reply

    stub.routes["/api/v1/query_range"] = with_unlabelled
    try:
        with PrometheusClient(stub.url, environ={}, retries=0) as client:
            result = import_dcgm(client, start=T, end=T + 2, step="1s")
    finally:
        stub.close()
    acc = result.summary()["completeness"]
    assert (acc["unit"], acc["read"], acc["unattributed"], acc["complete"]) == (
        "samples",
        6,
        len(DCGM_METRICS),
        False,
    )  # one per metric queried
    assert acc["missing"] == [f"{len(DCGM_METRICS)} DCGM series without a numeric gpu label"]
