"""One NCCL document from log lines, nccl-tests tables and problem lines; the diff leads with
busbw and names the log changes that explain it (issue 19)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from phaseprobe.analysis.nccl.report import diff_reports
from phaseprobe.collect.nccl_files import build_report
from phaseprobe.present.cli import main
from phaseprobe.present.cli.cmd_nccl import bar

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
HEALTHY, DEGRADED = str(DATA / "pair_healthy.log"), str(DATA / "pair_degraded.log")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_one_file_holds_log_lines_and_a_table_and_both_are_read():
    r = build_report([HEALTHY])
    assert r.doc["evidence"] == ["nccl log", "nccl-tests"]
    assert r.doc["channels"]["coll"] == {"min": 16, "max": 16}
    (res,) = r.doc["nccl_tests"]
    (table,) = res["tables"]
    assert table["label"] == "AllReduce" and table["n_rows"] == 4
    assert [row["oop_busbw_GBps"] for row in table["rows"]] == [30.0, 80.0, 150.0, 190.0]
    assert table["avg_busbw_GBps_printed"] == 112.5
    assert r.doc["problems"] == {"count": 0, "by_category": {}, "items": []}
    json.dumps(r.doc)


def test_diff_leads_with_busbw_and_links_it_to_the_channel_and_network_change():
    d = diff_reports(build_report([HEALTHY]), build_report([DEGRADED]))
    assert d["headline"][0] == "AllReduce: avg busbw 112 → 17.5 GB/s, −84 %"
    assert d["headline"][1] == "  64 MiB: busbw 190 → 22 GB/s, −88 %"
    why = d["headline"][-1]
    assert why.startswith("explained by: collective channels dropped from 16 to 2")
    assert "network changed from ['IB'] to ['Socket']" in why
    assert "GPUDirect RDMA no longer used" in why
    assert d["worse"][0] == {
        "severity": "high",
        "message": "AllReduce: avg busbw 112 → 17.5 GB/s, −84 %",
    }
    by_size = d["busbw"]["tables"][0]["by_size"]
    assert [(r["size_bytes"], r["a_busbw_GBps"], r["b_busbw_GBps"]) for r in by_size] == [
        (1 << 20, 30.0, 9.0),
        (1 << 22, 80.0, 18.0),
        (1 << 24, 150.0, 21.0),
        (1 << 26, 190.0, 22.0),
    ]


def test_same_run_twice_reports_no_drop_and_no_explanation():
    d = diff_reports(build_report([HEALTHY]), build_report([HEALTHY]))
    assert d["headline"] == ["AllReduce: avg busbw 112 → 112 GB/s, ±0 %"]
    assert d["worse"] == []


def test_a_drop_the_logs_cannot_explain_says_so(tmp_path):
    # the degraded table, but the healthy log lines: the logs hold no cause
    healthy = Path(HEALTHY).read_text().splitlines()
    degraded = Path(DEGRADED).read_text().splitlines()
    mixed = [line for line in healthy if "NCCL INFO" in line] + [
        line for line in degraded if "NCCL INFO" not in line
    ]
    path = tmp_path / "slow.log"
    path.write_text("\n".join(mixed) + "\n")
    d = diff_reports(build_report([HEALTHY]), build_report([str(path)]))
    assert d["headline"][0] == "AllReduce: avg busbw 112 → 17.5 GB/s, −84 %"
    assert d["headline"][-1].startswith(
        "the NCCL logs show no channel, transport, network or algorithm change that explains it"
    )
    # and with no NCCL lines in the second file at all, it says which file lacks them
    bare = tmp_path / "bare.log"
    bare.write_text("\n".join(line for line in degraded if "NCCL INFO" not in line) + "\n")
    d = diff_reports(build_report([HEALTHY]), build_report([str(bare)]))
    assert d["headline"][-1] == (
        "no NCCL INFO lines in the second file to explain it (run with NCCL_DEBUG=INFO)"
    )


def test_cli_reads_a_file_with_only_a_table(tmp_path, capsys):
    bare = tmp_path / "bare.log"
    bare.write_text(
        "\n".join(
            line for line in Path(DEGRADED).read_text().splitlines() if "NCCL INFO" not in line
        )
        + "\n"
    )
    code, out, _ = _cli(capsys, "nccl", str(bare))
    assert code == 0
    assert "avg busbw 17.50 GB/s (printed)" in out and "busbw (GB/s)" in out and "█" in out
    code, out, _ = _cli(capsys, "nccl", str(bare), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["evidence"] == ["nccl-tests"] and not doc["found"]


def test_cli_diff_takes_options_on_either_side_and_prints_the_headline_first(capsys):
    code, out, _ = _cli(capsys, "nccl", "diff", "--json", HEALTHY, DEGRADED)
    assert code == 0 and json.loads(out)["headline"][0].startswith("AllReduce: avg busbw 112")
    code, text, _ = _cli(capsys, "nccl", "diff", HEALTHY, DEGRADED)
    assert code == 0 and text.splitlines()[0] == "AllReduce: avg busbw 112 → 17.5 GB/s, −84 %"
    assert "A busbw (GB/s)" in text and "collective channels dropped from 16 to 2" in text


def test_cli_problems_table_names_file_and_line(tmp_path, capsys):
    # A deep checkout path (as on CI) once squeezed file:line into an ellipsis: the row
    # carries the file's name and line whole, the title the full path.
    deep = tmp_path.joinpath(*[f"level-{i}-of-a-long-checkout-path" for i in range(6)])
    deep.mkdir(parents=True)
    log = deep / "warn_network.log"
    log.write_bytes((DATA / "warn_network.log").read_bytes())
    code, out, _ = _cli(capsys, "nccl", str(log), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["problems"]["count"] >= 1
    first = doc["problems"]["items"][0]
    assert first["category"] == "network" and first["line_no"] >= 1
    code, text, _ = _cli(capsys, "nccl", str(log))
    rows = [ln for ln in text.splitlines() if ln.startswith("│ network  │")]
    assert rows and f"warn_network.log:{first['line_no']} " in rows[0]
    assert str(log) in text.replace("\n", "")


def test_nothing_to_read_is_one_error_naming_the_file(tmp_path, capsys):
    empty = tmp_path / "app.log"
    empty.write_text("starting\nloading weights\ndone\n")
    code, _, err = _cli(capsys, "nccl", str(empty))
    assert code == 2 and "app.log" in err and "NCCL_DEBUG=INFO" in err


def test_bar_is_proportional_in_eighths():
    assert bar(10.0, 10.0, width=4) == "████"
    assert bar(5.0, 10.0, width=4) == "██"
    assert bar(1.0, 8.0, width=1) == "▏"
    assert bar(0.0, 10.0) == bar(None, 10.0) == bar(1.0, 0.0) == ""


def test_render_never_turns_file_text_into_emoji():
    from phaseprobe.present.cli.safe_console import SafeConsole

    buf = io.StringIO()
    SafeConsole(file=buf, width=200).print("transport/net_ib.cc:1234:")
    assert buf.getvalue().strip() == "transport/net_ib.cc:1234:"
