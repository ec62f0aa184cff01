"""Hostile round 4 (issue 38 item 6): the inputs that ended in a traceback.

Each case runs in-process through :func:`phaseprobe.present.cli.main`, as
``test_every_command`` does, and must end with exit 1 or 2, no traceback, and one ``error:``
line naming the input or the option (argparse's usage error names the option at parse time).

- ``ab compare N N``: the P/D likeness check unpacked two arms from a dict keyed by their
  labels, which one experiment named twice makes one key;
- ``plan`` on a config.json whose ``quantization_config`` holds a ``bits`` (or group size,
  ``config_groups``, ``mlp_only_layers``) of another type: ``int()`` raised deep in the sizing;
  a layer count of 10**30 counted its MoE layers one by one (a hang);
- ``nsys`` on exports whose kernel table has no name column, one of another type, or no
  StringIds (regression guards: these were already read);
- options that end in ``time.sleep``, a socket timeout or a C ``int``: ``probe --pause 1e11``
  (OverflowError), ``watch --max-bytes`` past 2 GiB (gRPC's C int) or at int64's max (zlib),
  and their siblings, bounded at parse time;
- ``calibrate`` saving on a full disk;
- a worker URL with a malformed IPv6 host (``http://[oops]:8000``), from ``--replica`` or a
  router's ``/list_workers``;
- ``--spans-from chdb:DIR`` on a directory chdb cannot open (its engine writes a status file
  and ``tmp/`` there), and the ``tmp/`` it leaves in a directory it was asked to read.
"""

from __future__ import annotations

import errno
import json
import signal
import sqlite3
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.present.cli import main
from phaseprobe.testing.sse_server import Script, SseServer
from tests.hostile.cases import CannedServer, dead_url, json_reply, probe_argv


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    argparse: bool


HANG_S = 30  # far above the tens of ms each case takes; a case past it hung


def _hung(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the command did not return within {HANG_S} s")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``phaseprobe ARGV`` in-process; a traceback (or a hang, past :data:`HANG_S`) fails the
    test with the exception's."""
    capsys.readouterr()
    parse_error = False
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(HANG_S)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 2
        parse_error = True
    except BaseException:
        _, err = capsys.readouterr()
        pytest.fail(
            f"traceback from phaseprobe {' '.join(argv)[:300]}:\n"
            f"{traceback.format_exc()[-3000:]}\nstderr: {err[-500:]}"
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return Outcome(code, out, err, parse_error)


def refused(
    argv: list[str], capsys: pytest.CaptureFixture[str], name: str, *, at_parse: bool = False
) -> str:
    """The command ends with exit 2 and one ``error:`` line, the last one, naming ``name``
    (``at_parse``: argparse's usage error, before anything runs). Returns that line."""
    o = run_cli(argv, capsys)
    text = o.out + o.err
    assert "Traceback" not in text, text[-2000:]
    assert o.code == 2, f"exit {o.code}\nstdout: {o.out[-800:]}\nstderr: {o.err[-800:]}"
    assert o.argparse == at_parse, f"argparse={o.argparse}, wanted {at_parse}: {o.err[-800:]}"
    lines = [line for line in o.err.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], f"{len(errors)} errors: {o.err[-1500:]}"
    assert name in errors[0], f"{name!r} not in: {errors[0][:600]}"
    return errors[0]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in ("OPENAI_API_KEY", "VLLM_API_KEY", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


# -- ab compare N N -----------------------------------------------------------------------------


def test_ab_compare_an_experiment_with_itself_is_refused(
    experiment_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was ``ValueError: not enough values to unpack`` in analysis/ab/pd.py:pd_unlike."""
    line = refused(["ab", "compare", "1", "1", "--store", experiment_store], capsys, "1 1")
    assert "itself" in line
    # --force compares unlike experiments; it does not make one experiment two
    refused(["ab", "compare", "1", "1", "--force", "--store", experiment_store], capsys, "1 1")


def test_ab_compare_two_experiments_still_compares(
    experiment_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is for one id twice only: the same probe stored twice compares."""
    from phaseprobe.records import Experiment, RunSpec
    from phaseprobe.store import Store
    from tests.unit.test_checklist_rules import T0, make_run

    with Store(experiment_store) as store:
        spec = RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="", max_tokens=32)
        second = store.create_experiment(
            Experiment(name="probe", kind="probe", spec=spec, server_info={}, created_wall_ns=T0)
        )
        for i in range(3):
            store.add_run(second, make_run(i))
        store.finish_experiment(second)
    o = run_cli(["ab", "compare", "1", str(second), "--store", experiment_store], capsys)
    assert o.code == 0, o.err[-800:]
    assert f"experiment 1 (probe) vs {second} (probe)" in o.out


# -- plan: a quantization_config (and a MoE config) of the wrong types ---------------------------

LLAMA = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "intermediate_size": 14336,
    "model_type": "llama",
}
QWEN_MOE = {
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "vocab_size": 151936,
    "intermediate_size": 5632,
    "model_type": "qwen2_moe",
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408,
    "mlp_only_layers": [],
}
DEEPSEEK = {
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "vocab_size": 129280,
    "intermediate_size": 18432,
    "model_type": "deepseek_v3",
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
}


def _gptq(**q: Any) -> dict[str, Any]:
    return {**LLAMA, "quantization_config": {"quant_method": "gptq", **q}}


def _ct(weights: Any = None, groups: Any = None) -> dict[str, Any]:
    groups = {"group_0": {"weights": weights}} if groups is None else groups
    return {
        **LLAMA,
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": groups},
    }


PLAN_CASES = [
    pytest.param(_gptq(bits="four"), "bits", id="bits-text"),
    pytest.param(_gptq(bits=None), "bits", id="bits-null"),
    pytest.param(_gptq(bits=[4]), "bits", id="bits-list"),
    pytest.param(_gptq(bits={}), "bits", id="bits-object"),
    pytest.param(_gptq(bits=1e300), "bits", id="bits-1e300"),
    pytest.param(_gptq(bits=4.5), "bits", id="bits-4.5"),
    pytest.param(_gptq(bits=0), "bits", id="bits-0"),
    pytest.param(_gptq(bits=-4), "bits", id="bits-negative"),
    pytest.param(_gptq(bits=True), "bits", id="bits-true"),
    pytest.param(_gptq(bits=10**8), "bits", id="bits-huge"),
    pytest.param(
        {**LLAMA, "quantization_config": {"quant_method": "awq", "w_bit": "4"}},
        "w_bit",
        id="awq-w_bit-text",
    ),
    pytest.param(_gptq(bits=4, group_size="x"), "group_size", id="group_size-text"),
    pytest.param(_gptq(bits=4, group_size=[128]), "group_size", id="group_size-list"),
    pytest.param(_ct(groups=[1, 2]), "config_groups", id="ct-groups-list"),
    pytest.param(_ct(groups="g"), "config_groups", id="ct-groups-text"),
    pytest.param(_ct(weights="x"), "weights", id="ct-weights-text"),
    pytest.param(_ct(weights=[8]), "weights", id="ct-weights-list"),
    pytest.param(_ct(weights={"num_bits": "x"}), "num_bits", id="ct-num_bits-text"),
    pytest.param(_ct(weights={"num_bits": 1e300}), "num_bits", id="ct-num_bits-1e300"),
    pytest.param(_ct(weights={"num_bits": [8]}), "num_bits", id="ct-num_bits-list"),
    pytest.param(
        _ct(weights={"num_bits": 8, "group_size": "x"}), "group_size", id="ct-group_size-text"
    ),
    pytest.param({**QWEN_MOE, "mlp_only_layers": 5}, "mlp_only_layers", id="moe-dense-int"),
    pytest.param({**QWEN_MOE, "mlp_only_layers": [[1]]}, "mlp_only_layers", id="moe-dense-nested"),
    pytest.param(
        {**DEEPSEEK, "num_hidden_layers": 10**30}, "num_hidden_layers", id="layers-10e30-moe"
    ),
]


@pytest.mark.parametrize(("config", "key"), PLAN_CASES)
def test_plan_on_a_config_of_the_wrong_types_names_the_file_and_the_key(
    config: dict[str, Any], key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    line = refused(["plan", "--config", str(path), "--gpu-mem-gb", "80"], capsys, str(path))
    assert key in line


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(_gptq(bits=4, group_size=128), id="gptq"),
        pytest.param(_gptq(bits=8, group_size=-1), id="gptq-per-channel"),
        pytest.param(_gptq(bits=4, group_size=None), id="gptq-group-null"),
        pytest.param(_ct(weights={"num_bits": 4, "group_size": 128, "type": "int"}), id="ct"),
        pytest.param(
            _ct(weights={"num_bits": 8, "group_size": None, "type": "float"}), id="ct-fp8"
        ),
        pytest.param({**QWEN_MOE, "mlp_only_layers": [0, 3]}, id="moe-dense-layers"),
        pytest.param(DEEPSEEK, id="deepseek"),
    ],
)
def test_plan_still_sizes_the_configs_it_knows(
    config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    argv = ["plan", "--config", str(path), "--gpu-mem-gb", "80", "--gpus", "64", "--json"]
    o = run_cli(argv, capsys)
    assert o.code == 0, o.err[-800:]
    assert json.loads(o.out)["weights"]


# -- nsys: a kernel table without a usable name column -----------------------------------------


def _export(path: Path, name_column: str | None, *, string_ids: bool = True) -> Path:
    """A small export: one runtime call, one NVTX range, two kernels; the kernel table's name
    column as ``name_column`` gives it (None: no name column at all)."""
    conn = sqlite3.connect(path)
    if string_ids:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "gemm"), (2, "cudaLaunch")])
    else:  # one Nsight table for the file to be taken as an export at all
        conn.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT)")
    tid = 100 << 24
    conn.execute(
        'CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, "end" INT, nameId INT, '
        "globalTid INT, correlationId INT)"
    )
    conn.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 2, ?, ?)",
        [(0, 1, tid, 5), (2, 3, tid, 6)],
    )
    conn.execute(
        'CREATE TABLE NVTX_EVENTS (start INT, "end" INT, text TEXT, textId INT, '
        "globalTid INT, eventType INT)"
    )
    conn.execute("INSERT INTO NVTX_EVENTS VALUES (0, 10, 'prefill', NULL, ?, 59)", (tid,))
    cols = 'start INT, "end" INT, deviceId INT, streamId INT, globalPid INT, correlationId INT'
    rows: list[tuple[Any, ...]] = [(1, 2, 0, 7, tid, 5), (3, 4, 0, 7, tid, 6)]
    if name_column is None:
        conn.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({cols})")
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?)", rows)
    else:
        conn.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({cols}, shortName {name_column})")
        value: Any = {"INT": 1, "TEXT": "gemm_kernel", "REAL": 1.5}[name_column]
        conn.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?)",
            [r + (value,) for r in rows],
        )
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("name_column", "string_ids"),
    [
        pytest.param(None, True, id="no-name-column"),
        pytest.param("TEXT", True, id="name-column-text"),
        pytest.param("REAL", True, id="name-column-real"),
        pytest.param("INT", False, id="no-StringIds"),
    ],
)
def test_nsys_on_a_kernel_table_without_usable_names_summarises_it(
    name_column: str | None, string_ids: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression guards (these exports were read before round 4 too): the two kernels are
    counted, under a placeholder name when none can be read, and nothing is raised."""
    path = _export(tmp_path / "k.sqlite", name_column, string_ids=string_ids)
    o = run_cli(["nsys", "--json", str(path)], capsys)
    assert o.code == 0, o.err[-800:]
    assert json.loads(o.out)["kernels"]["count"] == 2


# -- options that end in a sleep, a timeout or a C int: bounded at parse time ------------------

_DEAD = dead_url()[0]
SLEEPS = [
    pytest.param(["probe", "--endpoint", _DEAD, "--pause", "1e11"], "--pause", id="probe-pause"),
    pytest.param(
        ["probe", "--endpoint", _DEAD, "--prom-wait", "1e11"], "--prom-wait", id="probe-prom-wait"
    ),
    pytest.param(
        ["probe", "--endpoint", _DEAD, "--span-wait", "1e11"], "--span-wait", id="probe-span-wait"
    ),
    pytest.param(
        ["interfere", "--endpoint", _DEAD, "--pause", "1e11"], "--pause", id="interfere-pause"
    ),
    pytest.param(["watch", "--duration", "1e11"], "--duration", id="watch-duration"),
    pytest.param(["watch", "--refresh", "1e11"], "--refresh", id="watch-refresh"),
    pytest.param(["watch", "--window", "1e11"], "--window", id="watch-window"),
    pytest.param(["watch", "--demo", "--rate", "1e-11"], "--rate", id="watch-rate-one-in-1e11-s"),
    pytest.param(["watch", "--retain", "99999999999w"], "--retain", id="watch-retain"),
    pytest.param(
        ["spans", "prune", "--older-than", "99999999999w"], "--older-than", id="prune-older-than"
    ),
]


@pytest.mark.parametrize(("argv", "option"), SLEEPS)
def test_a_wait_too_long_for_the_os_is_refused_at_parse_time(
    argv: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """time.sleep, Event.wait and socket timeouts take at most ~9.2e9 s (a C time_t of ns);
    a nanosecond cut-off must fit SQLite's INTEGER. Each bound is said at the command line."""
    refused([*argv, "--store", str(tmp_path / "s.sqlite")], capsys, option, at_parse=True)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        pytest.param(["probe", "--pause", "3600"], "pause", id="probe-pause-an-hour"),
        pytest.param(["watch", "--duration", "2592000"], "duration", id="watch-duration-30d"),
        pytest.param(["watch", "--retain", "3650d"], "retain", id="watch-retain-10y"),
        pytest.param(["watch", "--demo", "--rate", "0.01"], "rate", id="watch-rate-low"),
    ],
)
def test_long_but_sane_waits_are_still_taken(argv: list[str], option: str) -> None:
    from phaseprobe.present.cli.entry import build_parser

    args = build_parser([argv[0]]).parse_args(argv)
    assert vars(args)[option] > 0


@pytest.fixture(scope="module")
def sse() -> Iterator[SseServer]:
    with SseServer(Script(n_tokens=2, first_delay_s=0.001, gap_s=0.001)) as srv:
        yield srv


def test_probe_pause_1e11_is_refused_before_any_run(
    sse: SseServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was OverflowError from time.sleep after the first run (collect/experiment.py)."""
    store = tmp_path / "s.sqlite"
    argv = probe_argv(sse.base_url, store, "--pause", "1e11")
    argv[argv.index("--runs") + 1] = "2"
    refused(argv, capsys, "--pause", at_parse=True)
    assert not store.exists()


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(str(2**31), id="2GiB"),
        pytest.param(str(3 << 30), id="3GiB"),
        pytest.param(str(2**63 - 1), id="int64-max"),
    ],
)
def test_watch_max_bytes_past_a_c_int_is_refused_at_parse_time(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gRPC's max_receive_message_length is a C int (OverflowError when the server starts) and
    zlib's max_length a C ssize_t (OverflowError when a gzip request arrives)."""
    argv = ["watch", "--max-bytes", value, "--duration", "0.3", "--http", "off"]
    line = refused(
        [*argv, "--grpc", "127.0.0.1:0", "--store", str(tmp_path / "s.sqlite")],
        capsys,
        "--max-bytes",
        at_parse=True,
    )
    assert "2,147,483,647" in line


def test_watch_options_refuse_max_bytes_past_a_c_int_too(tmp_path: Path) -> None:
    from phaseprobe.collect.watch.options import WatchOptions
    from phaseprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="--max-bytes"):
        WatchOptions(str(tmp_path / "s.sqlite"), max_bytes=2**31)


# -- calibrate on a full disk --------------------------------------------------------------------


def _no_space(self: Path, text: str, *args: Any, **kwargs: Any) -> Any:
    """Path.write_text on a full disk: the first bytes land, then ENOSPC."""
    with open(self, "w", encoding="utf-8") as f:
        f.write(text[:8])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_calibrate_on_a_full_disk_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaseprobe.calibrate import run as calibrate_run
    from phaseprobe.present.cli import cmd_calibrate
    from tests.unit.test_calibrate import _fake_benchmark, result  # a canned measurement

    monkeypatch.setattr(cmd_calibrate, "run_benchmark", _fake_benchmark(result()))
    monkeypatch.setattr(Path, "write_text", _no_space)
    path = calibrate_run.calibration_path()
    line = refused(["calibrate", "--device", "cpu"], capsys, str(path))
    assert "No space left on device" in line
    assert not path.exists() and not path.with_name(path.name + ".tmp").exists()


def test_the_local_servers_state_on_a_full_disk_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling of calibrate's save: the other files phaseprobe writes through write_atomic
    (the detached local server's state; the install marker likewise)."""
    from phaseprobe.errors import LocalServerError
    from phaseprobe.local.detached import write_state
    from phaseprobe.local.server import ServerState

    monkeypatch.setattr(Path, "write_text", _no_space)
    path = tmp_path / "server.json"
    state = ServerState(1, 8000, "http://127.0.0.1:8000", "/m", "m", "/log", 0.0)
    with pytest.raises(LocalServerError, match="No space left on device") as e:
        write_state(path, state)
    assert str(path) in str(e.value)
    assert list(tmp_path.iterdir()) == []  # no partial server.json.tmp left


# -- a worker URL with a malformed IPv6 host ---------------------------------------------------

OOPS = "http://[oops]:8000"


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        pytest.param(["watch", "--replica", OOPS, "--duration", "0.1"], OOPS, id="watch-replica"),
        pytest.param(
            ["watch", "--replica", f"r1={OOPS}", "--duration", "0.1"], OOPS, id="watch-named"
        ),
        pytest.param(["probe", "--endpoint", _DEAD, "--replica", OOPS], OOPS, id="probe-replica"),
        pytest.param(["probe", "--endpoint", OOPS], OOPS, id="probe-endpoint"),
        pytest.param(
            ["probe", "--endpoint", "http://[::1:8000"], "http://[::1:8000", id="probe-unclosed"
        ),
        pytest.param(["probe", "--endpoint", "http://h:99999"], "http://h:99999", id="probe-port"),
    ],
)
def test_a_malformed_ipv6_worker_url_is_named(
    argv: list[str], url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """urllib's ValueError ("'oops' does not appear to be an IPv4 or IPv6 address") escaped
    from fleet/targets.py:default_name."""
    line = refused([*argv, "--store", str(tmp_path / "s.sqlite")], capsys, url)
    assert "not a URL" in line


def test_a_router_listing_a_malformed_worker_url_leaves_it_out() -> None:
    """A router's /list_workers answer is data: a worker URL that is no URL is left out and
    said, the others measured."""
    from phaseprobe.collect.fleet.targets import discover_replicas

    found, notes = discover_replicas([OOPS, "http://127.0.0.1:8001"])
    assert [t.url for t in found] == ["http://127.0.0.1:8001"]
    assert any("[oops]" in n for n in notes), notes


@pytest.mark.parametrize("worker", [OOPS, "http://[/]:8000"])
def test_probe_through_a_router_listing_a_malformed_worker(
    worker: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker left out is said as listed: the note was printed as rich markup, so
    "[oops]" vanished as a tag and "[/]" was a MarkupError (a traceback)."""
    port = dead_url()[1].rpartition(":")[2]
    routes = {
        "r": {
            "/list_workers": json_reply({"urls": [worker, f"http://127.0.0.1:{port}"]}),
            "/v1/models": json_reply({"object": "list", "data": [{"id": "m"}]}),
        }
    }
    with CannedServer(routes) as server:
        o = run_cli(probe_argv(server.url("r"), tmp_path / "s.sqlite"), capsys)
    assert "Traceback" not in o.out + o.err
    assert o.code in (0, 1), o.err[-800:]  # the runs fail (no worker answers), said
    assert f"cannot read ({worker}): left out" in o.out + o.err


@pytest.mark.parametrize("endpoint", [OOPS, "http://[::1:8000", "[oops]:8000"])
def test_a_stored_endpoint_that_is_no_url_is_no_host(endpoint: str) -> None:
    """A store phaseprobe did not write may hold any endpoint: the checklist's host look-ups
    answer "unknown" for it."""
    from phaseprobe.analysis.client_check import has_hop
    from phaseprobe.analysis.router_window import _host_port
    from phaseprobe.collect.evidence import server_host_names

    assert has_hop(endpoint) is None
    assert server_host_names(endpoint) == set()
    assert _host_port(endpoint) == endpoint


# -- chdb:DIR on a directory chdb cannot open, and the tmp/ it leaves ------------------------------

# Was: phaseprobe/sources/span_stores/chdb_store.py:ChdbSpans.__init__: chdb.session.Session
# raises RuntimeError('Failed to create connection: ... Error initializing EmbeddedServer') on a
# directory it cannot write (its engine writes a status file and tmp/ there, even to read),
# which escapes as a traceback — fix: refuse `not os.access(directory, os.W_OK)` before the
# session with SpanStoreUnreachable(where, 'not writable: chdb writes its status file and tmp/
# in its data directory even to read; copy it somewhere writable'), and wrap
# session.Session(...) in `except Exception as e: raise _error(where, e) from None`
# Was: phaseprobe/sources/span_stores/chdb_store.py:ChdbSpans.__init__: chdb's engine makes tmp/
# in the data directory it opens and leaves it there empty, so reading a chdb: directory changes
# it — fix: note `had_tmp = (directory / 'tmp').exists()` before the session and, in the close
# callback after self._session.close(), `if not had_tmp: (directory / 'tmp').rmdir()` (OSError
# ignored: not empty means chdb put something there)


def _chdb_dir(path: Path) -> Path:
    pytest.importorskip("chdb")
    from tests.unit.span_store_data import chdb_store, fleet_spans

    with chdb_store(path, fleet_spans(20)):
        pass
    tmp = path / "tmp"
    if tmp.is_dir() and not any(tmp.iterdir()):
        tmp.rmdir()  # as a collector's directory may be: without an empty tmp/
    return path


def _unwritable_chdb(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """What chdb does on a directory it cannot write (tests run as root, whom permissions do
    not stop; recorded running as root without CAP_DAC_OVERRIDE on a read-only directory):
    the session raises, and os.access says the directory is not writable."""
    import os

    from chdb import session

    def session_on(path: str, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "Failed to create connection: Code: 36. DB::Exception: Error initializing "
            "EmbeddedServer: . (BAD_ARGUMENTS)"
        )

    real_access = os.access

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if Path(path) == directory and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(session, "Session", session_on)
    monkeypatch.setattr(os, "access", access)


def test_spans_from_a_chdb_directory_chdb_cannot_write_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _chdb_dir(tmp_path / "spans")
    _unwritable_chdb(monkeypatch, directory)
    argv = ["spans", "list", "--spans-from", f"chdb:{directory}"]
    refused([*argv, "--store", str(tmp_path / "s.sqlite")], capsys, str(directory))


def test_reading_a_chdb_directory_leaves_no_tmp_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _chdb_dir(tmp_path / "spans")
    before = sorted(p.name for p in directory.iterdir())
    argv = ["spans", "list", "--spans-from", f"chdb:{directory}", "--json"]
    o = run_cli([*argv, "--store", str(tmp_path / "s.sqlite")], capsys)
    assert o.code == 0, o.err[-800:]
    assert sorted(p.name for p in directory.iterdir()) == before


# -- a store holding a text start_ns: spans prune is fixed (test_store_rows), spans list not ---

# Was: phaseprobe/store.py:Store._finished (and Store.spans, spans_of_traces, spans_overlapping,
# span_by_request_id): rows are read whatever the type of start_ns/end_ns, so a text start time
# reaches sources/span_stores/model.py:_group's min() beside integers (TypeError: '<' not
# supported between 'str' and 'int', a traceback in spans list, and in check/watch reading the
# store) — fix: read only spans with integer times, as the prune does since 5026b26: add
# "typeof(start_ns) = 'integer' AND typeof(end_ns) = 'integer'" to the WHERE of every SELECT *
# FROM request_spans (a _TIMED clause joined with the others)


def test_spans_list_on_a_store_holding_a_text_start_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaseprobe.collect.spans.sink import SpanSink
    from phaseprobe.sources.vllm.otlp_spans import decode_protobuf
    from phaseprobe.testing.otlp_payloads import export_request, vllm_span

    path = tmp_path / "s.sqlite"
    sink = SpanSink(path)
    spans = [
        vllm_span(start_ns=1_800_000_000_000_000_000 + i, request_id=f"r{i}") for i in range(5)
    ]
    sink.commit(decode_protobuf(export_request(spans).SerializeToString(), "test"))
    sink.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE request_spans SET start_ns = 'abc' WHERE request_id = 'r0'")
    db.commit()
    db.close()
    o = run_cli(["spans", "list", "--json", "--store", str(path)], capsys)
    assert o.code == 0, o.err[-800:]
    assert len(json.loads(o.out)["spans"]) == 4  # the four with a start time
