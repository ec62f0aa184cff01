"""Hostile inputs through the whole CLI: every command that reads a file or talks to a server.

What this suite proves (issue 18, "How to prove it"): for every named adversarial case below,
``phaseprobe CMD ...`` run in-process through :func:`phaseprobe.present.cli.main`

- ends with exit code 1 or 2 (a few documented lenient readers may end 0: their cases say so),
- prints no traceback (an exception escaping ``main`` is a traceback),
- when phaseprobe refuses the input (exit 2, not argparse): prints exactly one non-empty line on
  stderr, ``error: ...``, naming the input (the file's name, the server's host:port or the
  option); argparse's usage errors (``SystemExit(2)``) end with a line naming the option,
- stays within a time bound (``TIME_BOUND_S`` per case; far above the normal tens of ms),
- and creates no file beside its inputs (a reader must not make what it was asked to read).

Files are written per case under ``tmp_path/in``; servers are module-scoped
(:class:`tests.hostile.cases.CannedServer`: canned replies per scenario, a port with nothing
listening, a port held busy). Cases that reveal a bug are ``xfail(strict=True)`` with the
reason ``BUG file:function: what — fix: how`` so they flip when the fix lands. The hypothesis
properties over arbitrary bytes live beside each reader (test_fuzz_parsers, test_nccl_fuzz,
test_torch_trace, test_nsys_export, test_gpu_import, test_otlp_spans, …).

The OTLP receiver/decoder, the store, faults and secrets have their own suites
(test_otlp_spans, test_span_receiver, test_span_import, test_store_damaged, test_faults,
test_secrets); ``spans import`` appears here with a few CLI-level cases only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.present.cli import main
from tests.hostile.cases import (
    TARPIT,
    CannedServer,
    Reply,
    big_models,
    dead_url,
    deep_json,
    foreign_db,
    garbage,
    gzip_bytes,
    json_reply,
    nccl_log,
    nsys_like_db,
    redirect_to,
    sparse_file,
    sqlite_bytes,
    stream_bytes,
)

TIME_BOUND_S = 10.0
Content = bytes | str | Callable[[Path], None]


# -- the case table machinery ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    files: dict[str, Content] = field(default_factory=dict)
    name: str | None = None  # what the error must name (placeholders allowed); None: an input
    codes: tuple[int, ...] = (1, 2)
    env: dict[str, str] = field(default_factory=dict)


def case(
    cid: str,
    argv: list[str],
    files: dict[str, Content] | None = None,
    *,
    name: str | None = None,
    codes: tuple[int, ...] = (1, 2),
    bug: str | None = None,
    env: dict[str, str] | None = None,
) -> Any:
    """One named case; ``bug`` makes it a strict xfail with that reason."""
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(
        Case(tuple(argv), dict(files or {}), name, codes, dict(env or {})), id=cid, marks=marks
    )


def mkdir(path: Path) -> None:
    path.mkdir()


def mkfifo(path: Path) -> None:
    os.mkfifo(path)


def symlink_loop(path: Path) -> None:
    path.symlink_to(path)


def directory_with(files: dict[str, bytes]) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.mkdir()
        for name, data in files.items():
            (path / name).write_bytes(data)

    return make


def sqlite_file(build: Callable[[Any], None]) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(sqlite_bytes(build, path.parent.parent))

    return make


@dataclass
class World:
    """What the placeholders in a case's argv resolve to."""

    indir: Path
    outdir: Path
    server: CannedServer
    dead: tuple[str, str]
    busy: tuple[int, int]  # (tcp port held by a listening socket, its number again)
    store: str  # a store holding one finished experiment (read-only cases)

    def resolve(self, text: str) -> str:
        def one(m: re.Match[str]) -> str:
            kind, arg = m.group(1), m.group(2)
            if kind == "f":
                return str(self.indir / arg)
            return {
                "in": str(self.indir),
                "out": str(self.outdir),
                "missing_store": str(self.outdir / "none.sqlite"),
                "new_store": str(self.outdir / "new.sqlite"),
                "store": self.store,
                "srv": self.server.url(arg or ""),
                "hp": self.server.hostport,
                "dead": self.dead[0],
                "deadhp": self.dead[1],
                "busy": f"127.0.0.1:{self.busy[0]}",
                "busyport": str(self.busy[0]),
            }[kind]

        return re.sub(
            r"\{(f|in|out|missing_store|new_store|store|srv|hp|dead|deadhp|busy|"
            r"busyport)(?::([^}]*))?\}",
            one,
            text,
        )

    def names(self, c: Case) -> list[str]:
        if c.name is not None:
            return [self.resolve(c.name)]
        found: list[str] = []
        for arg in c.argv:
            for m in re.finditer(r"\{(f|srv|dead)(?::([^}]*))?\}", arg):
                found.append(
                    {"f": m.group(2) or "", "srv": self.server.hostport, "dead": self.dead[1]}[
                        m.group(1)
                    ]
                )
        return found


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float
    argparse: bool


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def run_case(c: Case, world: World, capsys: Any, monkeypatch: Any) -> Outcome:
    for name, content in c.files.items():
        path = world.indir / name
        if callable(content):
            content(path)
        else:  # text may name the world too (a playbook's endpoint: {dead}, {srv:...})
            path.write_bytes(
                world.resolve(content).encode() if isinstance(content, str) else content
            )
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)
    argv = [world.resolve(a) for a in c.argv]
    before = _listing(world.indir)
    capsys.readouterr()
    t0 = time.monotonic()
    parse_error = False
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage errors
        code = exc.code if isinstance(exc.code, int) else 2
        parse_error = True
    except BaseException:
        out, err = capsys.readouterr()
        pytest.fail(
            f"traceback from phaseprobe {' '.join(argv)[:300]}:\n"
            f"{traceback.format_exc()[-3000:]}\nstderr: {err[-500:]}"
        )
    seconds = time.monotonic() - t0
    out, err = capsys.readouterr()
    after = _listing(world.indir)
    assert after <= before | {str(Path(n)) for n in c.files}, (
        f"files created beside the inputs: {sorted(after - before)}"
    )
    return Outcome(code, out, err, seconds, parse_error)


def check(c: Case, o: Outcome, world: World) -> None:
    text = o.out + o.err
    assert "Traceback" not in text, text[-2000:]
    assert o.seconds < TIME_BOUND_S, f"took {o.seconds:.1f} s"
    assert o.code in c.codes, (
        f"exit {o.code}, wanted {c.codes}\nstdout: {o.out[-800:]}\nstderr: {o.err[-800:]}"
    )
    names = world.names(c)
    lines = [line for line in o.err.splitlines() if line.strip()]
    if o.argparse:
        assert lines and "error:" in lines[-1], o.err
        if c.name is not None:
            assert world.resolve(c.name) in lines[-1], lines[-1]
        return
    if o.code == 2:
        # One error line, the last thing said; progress notes ("reading X…") may precede it.
        errors = [line for line in lines if "error:" in line]
        assert len(errors) == 1 and lines[-1] == errors[0], (
            f"{len(errors)} error lines: {o.err[-1500:]}"
        )
        assert errors[0].startswith("error:"), errors[0]
        if names:
            assert any(n in errors[0] for n in names), f"{names} not in: {errors[0][:600]}"
    elif o.code == 1:
        assert text.strip(), "exit 1 without a word"


# -- module-scoped world: servers, a busy port, a store with one experiment --------------------

HTML = Reply(200, b"<!doctype html><html><body>Sign in</body></html>", "text/html")
DEEP = Reply(200, deep_json(100_000))
_PROM_NAMES = json_reply(
    {
        "status": "success",
        "data": [
            "vllm:e2e_request_latency_seconds_count",
            "vllm:request_prefill_time_seconds_sum",
            "vllm:request_prefill_time_seconds_count",
        ],
    }
)


def _prom_with(query: Reply) -> dict[str, Reply]:
    return {
        "/api/v1/label/__name__/values": _PROM_NAMES,
        "/api/v1/query": query,
        "/api/v1/query_range": query,
    }


def _vector(result: Any) -> Reply:
    return json_reply({"status": "success", "data": {"resultType": "vector", "result": result}})


ROUTES: dict[str, dict[str, Reply]] = {
    # Prometheus look-alikes
    "html": {"*": HTML},
    "e500": {"*": Reply(500, b"internal error", "text/plain")},
    "e401": {
        "*": json_reply({"status": "error", "errorType": "unauthorized", "error": "no token"}, 401)
    },
    "e404": {},
    "badjson": {"*": Reply(200, b'{"status": "success", "data": [')},
    "empty200": {"*": Reply(200, b"")},
    "data5": {"*": json_reply({"status": "success", "data": 5})},
    "datastr": {"*": json_reply({"status": "success", "data": "vllm:x"})},
    "deep": {"*": DEEP},
    "redirect": {"*": redirect_to("/redirect/loop")},
    "tarpit": {"*": Reply(200, TARPIT)},
    "huge": {"*": Reply(200, stream_bytes(b" " * (1 << 20), 64 << 20), length=64 << 20)},
    "badutf8": {"*": Reply(200, b'{"status": "success", "data": ["\xff\xfe"]}')},
    "promql400": {
        "/api/v1/label/__name__/values": _PROM_NAMES,
        "*": json_reply(
            {"status": "error", "errorType": "bad_data", "error": "parse error at char 1"}, 400
        ),
    },
    "qvalue": _prom_with(_vector([{"metric": {}, "value": [1, "not a number"]}])),
    "qitems": _prom_with(_vector([5, "x", None])),
    "qmetric": _prom_with(_vector([{"metric": 5, "value": [1, "1"]}])),
    "qresult5": _prom_with(
        json_reply({"status": "success", "data": {"resultType": "vector", "result": 5}})
    ),
    "qnodata": _prom_with(json_reply({"status": "success"})),
    "qdeep": _prom_with(DEEP),
    # OpenAI-compatible look-alikes (/v1/models)
    "m_html": {"*": HTML},
    "m_500": {"*": Reply(500, b"engine dead", "text/plain")},
    "m_401": {"*": json_reply({"error": "invalid api key"}, 401)},
    "m_data5": {"*": json_reply({"object": "list", "data": 5})},
    "m_datanull": {"*": json_reply({"object": "list", "data": None})},
    "m_datastr": {"*": json_reply({"object": "list", "data": "model-a"})},
    "m_datadict": {"*": json_reply({"object": "list", "data": {"id": "m"}})},
    "m_noid": {"*": json_reply({"object": "list", "data": [{"name": "m"}, {}, 5]})},
    "m_empty": {"*": json_reply({"object": "list", "data": []})},
    "m_list": {"*": json_reply([{"id": "m"}])},
    "m_10k": {"*": Reply(200, big_models(10_000))},
    "m_deep": {"*": Reply(200, deep_json(100_000, prefix='{"data": ', suffix="}"))},
    "m_badjson": {"*": Reply(200, b'{"data": [{"id": ')},
    "m_huge": {"*": Reply(200, stream_bytes(b"[" * (1 << 20), 48 << 20), length=48 << 20)},
    "m_badutf8": {"*": Reply(200, b'{"data": [{"id": "\xff\xfe"}]}')},
    "m_ok": {"/v1/models": json_reply({"object": "list", "data": [{"id": "served-model"}]})},
    # vLLM /metrics look-alikes (grafana lint --metrics URL)
    "x_garbage": {"*": Reply(200, garbage(4096), "text/plain")},
    "x_html": {"*": HTML},
    "x_500": {"*": Reply(500, b"oops", "text/plain")},
    "x_empty": {"*": Reply(200, b"", "text/plain")},
    # Grafana look-alikes
    "g_html": {"*": HTML},
    "g_500": {"*": json_reply({"message": "database locked"}, 500)},
    "g_401": {"*": json_reply({"message": "invalid API key"}, 401)},
    "g_deep": {"*": DEEP},
    "g_badjson": {"*": Reply(200, b'{"message": ')},
}


@pytest.fixture(scope="module")
def server() -> Iterator[CannedServer]:
    with CannedServer(ROUTES) as srv:
        yield srv


@pytest.fixture(scope="module")
def busy_port() -> Iterator[tuple[int, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        yield port, port


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    for var in (
        "OPENAI_API_KEY",
        "VLLM_API_KEY",
        "PHASEPROBE_PROM_TOKEN",
        "GRAFANA_TOKEN",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def world(
    tmp_path: Path, server: CannedServer, busy_port: tuple[int, int], experiment_store: str
) -> World:
    indir, outdir = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    outdir.mkdir()
    return World(indir, outdir, server, dead_url(), busy_port, experiment_store)


def _run(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    check(c, run_case(c, world, capsys, monkeypatch), world)


# -- nccl FILE / nccl diff A B -----------------------------------------------------------------

_NCCL_OK = nccl_log()
_TRUNCATED = (
    "h1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] ->\n"
    "h1:10:20 [0] NCCL INFO AllReduce: opCount 0 sendbuff\n"
    "h1:10:20 [0] NCCL INFO ncclCommInitRank comm 0xa1 rank\n"
)


BUG_NCCL_ZLIB = (
    "BUG phaseprobe/sources/nccl/log.py:parse_files: a .gz whose deflate data is corrupt raises "
    "zlib.error (not an OSError), which escapes as a traceback — fix: add zlib.error to the "
    "caught (OSError, EOFError, gzip.BadGzipFile) and raise ConfigError(f'{path}: cannot read "
    "(corrupt gzip: ...)')"
)
BUG_NCCL_STEPS = (
    "BUG phaseprobe/present/cli/cmd_nccl.py:register: --steps takes any int; 10**400 reaches "
    "nccl_summary.summarize's calls/ranks/steps and raises OverflowError — fix: type=int_in(1, "
    "10**12) from present/args.py (argparse names --steps)"
)


def _nccl_line(text: str) -> bytes:
    return nccl_log("h1:10:20 [0] NCCL INFO " + text + "\n")


NCCL_CASES = [
    case("empty", ["nccl", "{f:empty.log}"], {"empty.log": b""}),
    case("binary-garbage", ["nccl", "{f:bin.log}"], {"bin.log": garbage(65536)}),
    case(
        "non-utf8", ["nccl", "{f:latin.log}"], {"latin.log": b"h\xe9te \xff\xfe\x80 caf\xe9\n" * 50}
    ),
    # Lenient by design: an INFO line it does not model still counts as NCCL output.
    case(
        "tolerated-non-utf8-INFO",
        ["nccl", "{f:latin.log}"],
        {"latin.log": b"h\xe9te:1:2 [0] NCCL INFO \xff\xfe\x80 caf\xe9\n" * 50},
        codes=(0,),
    ),
    case("10MB-line-no-newline", ["nccl", "{f:long.log}"], {"long.log": b"x" * (10 << 20)}),
    case(
        "10MB-NCCL-line",
        ["nccl", "{f:longinfo.log}"],
        {"longinfo.log": b"h:1:2 [0] NCCL INFO Channel " + b"9" * (10 << 20)},
    ),
    case("NUL-line", ["nccl", "{f:nul.log}"], {"nul.log": b"\0" * 100_000 + b"\n"}),
    case(
        "tolerated-NULs-inside-INFO",
        ["nccl", "{f:nulinfo.log}"],
        {"nulinfo.log": b"h1:1:2 [0] NCCL INFO \0\0\0 version \0\n" * 100},
        codes=(0,),
    ),
    case("only-newlines", ["nccl", "{f:nl.log}"], {"nl.log": b"\n" * 100_000}),
    case("only-CRs", ["nccl", "{f:cr.log}"], {"cr.log": b"\r" * 100_000}),
    case("truncated-INFO-lines", ["nccl", "{f:cut.log}"], {"cut.log": _TRUNCATED}),
    case("truncated-INFO-strict", ["nccl", "--strict", "{f:cut.log}"], {"cut.log": _TRUNCATED}),
    case(
        "strict-garbage-after-valid",
        ["nccl", "--strict", "{f:mixed.log}"],
        {"mixed.log": _nccl_line("Channel 00/0 : 0[0] -> ")},
    ),
    case("directory", ["nccl", "{f:logs}"], {"logs": mkdir}),
    case("missing", ["nccl", "{f:missing.log}"]),
    case("fifo", ["nccl", "{f:pipe.log}"], {"pipe.log": mkfifo}),
    case("symlink-loop", ["nccl", "{f:loop.log}"], {"loop.log": symlink_loop}),
    case("gz-corrupt", ["nccl", "{f:bad.log.gz}"], {"bad.log.gz": b"\x1f\x8b" + garbage(4096)}),
    case(
        "gz-corrupt-deflate",
        ["nccl", "{f:bad2.log.gz}"],
        {"bad2.log.gz": b"\x1f\x8b\x08" + garbage(300)},
    ),
    case("gz-truncated", ["nccl", "{f:cut.log.gz}"], {"cut.log.gz": gzip_bytes(_NCCL_OK, 40)}),
    case("gz-name-plain-garbage", ["nccl", "{f:plain.gz}"], {"plain.gz": garbage(2048)}),
    case("gz-of-garbage", ["nccl", "{f:gar.log.gz}"], {"gar.log.gz": gzip_bytes(garbage(8192))}),
    case(
        "second-file-missing",
        ["nccl", "{f:ok.log}", "{f:missing2.log}"],
        {"ok.log": _NCCL_OK},
        name="missing2.log",
    ),
    case(
        "steps-zero", ["nccl", "--steps", "0", "{f:ok.log}"], {"ok.log": _NCCL_OK}, name="--steps"
    ),
    case(
        "steps-negative",
        ["nccl", "--steps", "-5", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--steps",
    ),
    case(
        "steps-not-a-number",
        ["nccl", "--steps", "many", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--steps",
    ),
    case(
        "steps-huge",
        ["nccl", "--steps", "9" * 400, "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--steps",
    ),
    case(
        "save-into-a-directory",
        ["nccl", "--save", "{out}", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--save",
    ),
    case(
        "save-missing-parent",
        ["nccl", "--save", "{out}/no/such/x.json", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--save",
    ),
    case(
        "experiment-without-store",
        ["nccl", "--experiment", "3", "--store", "{missing_store}", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="none.sqlite",
    ),
    case(
        "keep-without-store",
        ["nccl", "--keep", "--store", "{missing_store}", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="none.sqlite",
    ),
    case(
        "experiment-zero",
        ["nccl", "--experiment", "0", "{f:ok.log}"],
        {"ok.log": _NCCL_OK},
        name="--experiment",
    ),
    case(
        "count-beyond-int64",
        ["nccl", "--json", "{f:bigcount.log}"],
        {
            "bigcount.log": _nccl_line(
                "AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count "
                + "9" * 40
                + " datatype 6 op 0 root 0 comm 0xa1 "
                "[nranks=2] stream 0x5"
            )
        },
        codes=(0, 1, 2),
    ),
    case(
        "datatype-unknown",
        ["nccl", "--json", "{f:dtype.log}"],
        {
            "dtype.log": _nccl_line(
                "AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count 8 "
                "datatype 99999 op 0 root 0 comm 0xa1 [nranks=2] "
                "stream 0x5"
            )
        },
        codes=(0, 1, 2),
    ),
    case(
        "nranks-zero",
        ["nccl", "--json", "{f:nr0.log}"],
        {
            "nr0.log": _nccl_line(
                "ncclCommInitRank comm 0xb1 rank 0 nranks 0 cudaDev 0 "
                "nvmlDev 0 busId 1 commId 0x43 - Init START"
            )
        },
        codes=(0, 1, 2),
    ),
    case(
        "channels-absurd",
        ["nccl", "--json", "{f:ch.log}"],
        {
            "ch.log": _nccl_line(
                "99999999999999999999 coll channels, 0 collnet channels, "
                "0 nvls channels, 0 p2p channels, 0 p2p channels per peer"
            )
        },
        codes=(0, 1, 2),
    ),
]

NCCL_DIFF_CASES = [
    case(
        "diff-missing-B",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"a.log": _NCCL_OK},
        name="b.log",
    ),
    case(
        "diff-missing-A",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"b.log": _NCCL_OK},
        name="a.log",
    ),
    case(
        "diff-empty-A",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"a.log": b"", "b.log": _NCCL_OK},
        name="a.log",
    ),
    case(
        "diff-garbage-B",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"a.log": _NCCL_OK, "b.log": garbage(20000)},
        name="b.log",
    ),
    case(
        "diff-non-utf8-B",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"a.log": _NCCL_OK, "b.log": b"\xff\xfe\xfd NCCL INFO \x80\n" * 10},
        name="b.log",
    ),
    case(
        "diff-directory-A",
        ["nccl", "diff", "{f:a}", "{f:b.log}"],
        {"a": mkdir, "b.log": _NCCL_OK},
        name="a",
    ),
    case(
        "diff-gz-corrupt-B",
        ["nccl", "diff", "{f:a.log}", "{f:b.gz}"],
        {"a.log": _NCCL_OK, "b.gz": b"\x1f\x8b\x08" + garbage(300)},
        name="b.gz",
    ),
    case(
        "diff-strict-truncated-B",
        ["nccl", "diff", "--strict", "{f:a.log}", "{f:b.log}"],
        {"a.log": _NCCL_OK, "b.log": _TRUNCATED},
        name="b.log",
    ),
    case("diff-one-file", ["nccl", "diff", "{f:a.log}"], {"a.log": _NCCL_OK}, name="nccl diff"),
    case(
        "diff-three-files",
        ["nccl", "diff", "{f:a.log}", "{f:a.log}", "{f:a.log}"],
        {"a.log": _NCCL_OK},
        name="nccl diff",
    ),
    case(
        "diff-10MB-line-A",
        ["nccl", "diff", "{f:a.log}", "{f:b.log}"],
        {"a.log": b"y" * (10 << 20), "b.log": _NCCL_OK},
        name="a.log",
    ),
]


@pytest.mark.parametrize("c", NCCL_CASES + NCCL_DIFF_CASES)
def test_nccl(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- trace FILE (PyTorch profiler / Kineto JSON) -----------------------------------------------


def _events(*events: Any, **header: Any) -> str:
    return json.dumps({"traceEvents": list(events), **header})


_KERNEL = {
    "ph": "X",
    "cat": "kernel",
    "name": "gemm",
    "ts": 10,
    "dur": 5,
    "pid": 0,
    "tid": 7,
    "args": {"device": 0, "stream": 7, "correlation": 1},
}
_TRACE_OK = _events(_KERNEL)

TRACE_CASES = [
    case("empty", ["trace", "{f:t.json}"], {"t.json": b""}),
    case("whitespace", ["trace", "{f:t.json}"], {"t.json": b" \n\t " * 1000}),
    case("array", ["trace", "{f:t.json}"], {"t.json": "[]"}),
    case("empty-object", ["trace", "{f:t.json}"], {"t.json": "{}"}),
    case("string", ["trace", "{f:t.json}"], {"t.json": '"traceEvents"'}),
    case("null", ["trace", "{f:t.json}"], {"t.json": "null"}),
    case("traceEvents-5", ["trace", "{f:t.json}"], {"t.json": '{"traceEvents": 5}'}),
    case("traceEvents-null", ["trace", "{f:t.json}"], {"t.json": '{"traceEvents": null}'}),
    case("traceEvents-object", ["trace", "{f:t.json}"], {"t.json": '{"traceEvents": {"ph": "X"}}'}),
    case(
        "events-wrong-types",
        ["trace", "{f:t.json}"],
        {"t.json": '{"traceEvents": [5, "x", null, [], true]}'},
    ),
    case(
        "event-fields-wrong-types",
        ["trace", "{f:t.json}"],
        {
            "t.json": _events(
                {"ph": "X", "cat": "kernel", "ts": "abc", "dur": {}, "name": []},
                {"ph": ["X"], "cat": 5, "ts": None},
                {"ph": "X", "cat": {"a": 1}, "ts": 1, "dur": 1},
            )
        },
    ),
    case(
        "event-times-absurd",
        ["trace", "{f:t.json}"],
        {
            "t.json": _events(
                {**_KERNEL, "ts": 1e300},
                {**_KERNEL, "dur": -5},
                {**_KERNEL, "ts": 2**80},
                {**_KERNEL, "dur": 1e20},
            )
        },
    ),
    case(
        "event-times-nan",
        ["trace", "{f:t.json}"],
        {"t.json": '{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": NaN, "dur": Infinity}]}'},
    ),
    case(
        "deviceProperties-5",
        ["trace", "{f:t.json}"],
        {"t.json": _events(_KERNEL, deviceProperties=5)},
        codes=(0, 1, 2),
    ),  # ignored
    case(
        "deviceProperties-string",
        ["trace", "{f:t.json}"],
        {"t.json": _events(_KERNEL, deviceProperties="A100")},
        codes=(0, 1, 2),
    ),
    case(
        "distributedInfo-list",
        ["trace", "{f:t.json}"],
        {"t.json": _events(_KERNEL, distributedInfo=[1, 2])},
        codes=(0, 1, 2),
    ),
    case("key-not-string", ["trace", "{f:t.json}"], {"t.json": "{5: []}"}),
    case(
        "truncated-in-events",
        ["trace", "{f:t.json}"],
        {"t.json": '{"traceEvents": [' + json.dumps(_KERNEL)[:30]},
    ),
    case(
        "truncated-after-comma",
        ["trace", "{f:t.json}"],
        {"t.json": '{"traceEvents": [' + json.dumps(_KERNEL) + ","},
    ),
    case(
        "trailing-garbage",
        ["trace", "{f:t.json}"],
        {"t.json": _TRACE_OK + "}}}garbage"},
        codes=(0, 1, 2),
    ),
    case(
        "deep-events",
        ["trace", "{f:t.json}"],
        {"t.json": deep_json(100_000, prefix='{"traceEvents": [', suffix="]}")},
    ),
    case(
        "deep-header",
        ["trace", "{f:t.json}"],
        {"t.json": deep_json(100_000, '{"a":', "}", prefix='{"meta": ', suffix="}")},
    ),
    case("deep-top-level", ["trace", "{f:t.json}"], {"t.json": deep_json(100_000)}),
    case(
        "non-utf8",
        ["trace", "{f:t.json}"],
        {"t.json": b'{"traceEvents": [{"name": "\xff\xfe\x80"}]}'},
    ),
    case("binary-garbage", ["trace", "{f:t.json}"], {"t.json": garbage(65536)}),
    case("NUL-bytes", ["trace", "{f:t.json}"], {"t.json": b"\0" * 4096}),
    case("10MB-string", ["trace", "{f:t.json}"], {"t.json": '{"x": "' + "a" * (10 << 20)}),
    case("10MB-number", ["trace", "{f:t.json}"], {"t.json": '{"x": ' + "9" * (10 << 20) + "}"}),
    case("gzip-corrupt", ["trace", "{f:t.json.gz}"], {"t.json.gz": b"\x1f\x8b" + garbage(4096)}),
    case(
        "gzip-corrupt-deflate",
        ["trace", "{f:t.json.gz}"],
        {"t.json.gz": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + garbage(4096)},
    ),
    case(
        "gzip-truncated",
        ["trace", "{f:t.json.gz}"],
        {"t.json.gz": gzip_bytes(_TRACE_OK.encode() * 50, 60)},
    ),
    case(
        "gzip-of-non-utf8",
        ["trace", "{f:t.json.gz}"],
        {"t.json.gz": gzip_bytes(b'{"traceEvents": ["\xff\xfe"]}')},
    ),
    case("gzip-of-garbage", ["trace", "{f:t.json.gz}"], {"t.json.gz": gzip_bytes(garbage(9000))}),
    case("nsys-report-name", ["trace", "{f:r.nsys-rep}"], {"r.nsys-rep": garbage(1000)}),
    case("sqlite-given", ["trace", "{f:t.json}"], {"t.json": sqlite_file(foreign_db)}),
    case("directory-without-traces", ["trace", "{f:profiles}"], {"profiles": mkdir}),
    case(
        "directory-with-bad-trace",
        ["trace", "{f:profiles}"],
        {"profiles": directory_with({"rank0.1.pt.trace.json": b'{"traceEvents": ['})},
        name="rank0.1.pt.trace.json",
    ),
    case("missing", ["trace", "{f:missing.json}"]),
    case("fifo", ["trace", "{f:pipe.json}"], {"pipe.json": mkfifo}),
    case("symlink-loop", ["trace", "{f:loop.json}"], {"loop.json": symlink_loop}),
    case("top-zero", ["trace", "--top", "0", "{f:t.json}"], {"t.json": _TRACE_OK}, name="--top"),
    case("top-text", ["trace", "--top", "all", "{f:t.json}"], {"t.json": _TRACE_OK}, name="--top"),
    case(
        "gap-negative",
        ["trace", "--gap-us", "-1", "{f:t.json}"],
        {"t.json": _TRACE_OK},
        name="--gap-us",
    ),
    case(
        "gap-nan",
        ["trace", "--gap-us", "nan", "{f:t.json}"],
        {"t.json": _TRACE_OK},
        name="--gap-us",
    ),
    case(
        "gap-inf",
        ["trace", "--gap-us", "inf", "{f:t.json}"],
        {"t.json": _TRACE_OK},
        name="--gap-us",
    ),
    case(
        "keep-without-store",
        ["trace", "--keep", "--store", "{missing_store}", "{f:t.json}"],
        {"t.json": _TRACE_OK},
        name="none.sqlite",
    ),
]


@pytest.mark.parametrize("c", TRACE_CASES)
def test_trace(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- nsys FILE (SQLite export, or an nsys stats CSV) -------------------------------------------

_KERN_HEADER = (
    "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
)


def _kern_csv(*rows: str) -> str:
    return _KERN_HEADER + "".join(r + "\n" for r in rows)


# a kernel summary as nsys stats prints it on the console (columns cut by the dash runs)
_TEXT_HEADER = (
    " Time (%)  Total Time (ns)  Instances  Avg (ns)  Med (ns)  Min (ns)  Max (ns)  "
    "StdDev (ns)  Name\n"
)
_TEXT_DASHES = (
    " --------  ---------------  ---------  --------  --------  --------  --------  "
    "-----------  ----\n"
)


def _text_row(instances: str, total: str = "100", name: str = "gemm") -> str:
    return (
        f" {'50.0':>8}  {total:>15}  {instances:>9}  {'50.0':>8}  {'50.0':>8}  {'40':>8}  "
        f"{'60':>8}  {'1.0':>11}  {name}\n"
    )


NSYS_CASES = [
    case("text-file", ["nsys", "{f:r.sqlite}"], {"r.sqlite": "not a database\n" * 100}),
    case("empty-file", ["nsys", "{f:r.sqlite}"], {"r.sqlite": b""}),
    case("binary-garbage", ["nsys", "{f:r.sqlite}"], {"r.sqlite": garbage(65536)}),
    case(
        "sqlite-header-then-garbage",
        ["nsys", "{f:r.sqlite}"],
        {"r.sqlite": b"SQLite format 3\0" + garbage(8192)},
    ),
    case("foreign-tables", ["nsys", "{f:r.sqlite}"], {"r.sqlite": sqlite_file(foreign_db)}),
    case(
        "kernel-text-times",
        ["nsys", "{f:r.sqlite}"],
        {"r.sqlite": sqlite_file(nsys_like_db([("abc", "def", 0, 0, 1)]))},
    ),
    case(
        "kernel-real-huge-times",
        ["nsys", "{f:r.sqlite}"],
        {"r.sqlite": sqlite_file(nsys_like_db([(1e300, 1e308, 0, 0, 1)]))},
    ),
    case(
        "kernel-blob-name",
        ["nsys", "{f:r.sqlite}"],
        {"r.sqlite": sqlite_file(nsys_like_db([(1, 2, 0, 0, b"\xff\x00")]))},
    ),
    case(
        "kernel-view-over-dropped-table",
        ["nsys", "{f:r.sqlite}"],
        {"r.sqlite": sqlite_file(nsys_like_db([], view=True))},
    ),
    case("directory", ["nsys", "{f:r.sqlite}"], {"r.sqlite": mkdir}),
    case("missing", ["nsys", "{f:missing.sqlite}"]),
    case("missing-with-hash", ["nsys", "{f:miss#ing.sqlite}"]),
    case("name-with-hash", ["nsys", "{f:r#1.sqlite}"], {"r#1.sqlite": "not a database\n"}),
    case(
        "name-with-question-mark",
        ["nsys", "{f:r?mode=rwc.sqlite}"],
        {"r?mode=rwc.sqlite": "not a database\n"},
    ),
    case(
        "name-with-percent", ["nsys", "{f:r%41%zz.sqlite}"], {"r%41%zz.sqlite": "not a database\n"}
    ),
    case(
        "name-with-hash-foreign-db",
        ["nsys", "{f:x#y.sqlite}"],
        {"x#y.sqlite": sqlite_file(foreign_db)},
    ),
    case("fifo", ["nsys", "{f:pipe.sqlite}"], {"pipe.sqlite": mkfifo}),
    # the nsys stats readers (CSV, console text) open the file themselves: refused unopened
    case("fifo-stats-csv", ["nsys", "{f:pipe.csv}"], {"pipe.csv": mkfifo}),
    case("fifo-stats-text", ["nsys", "{f:pipe.txt}"], {"pipe.txt": mkfifo}),
    case("fifo-stats-log", ["nsys", "{f:pipe.log}"], {"pipe.log": mkfifo}),
    case("directory-stats-csv", ["nsys", "{f:dir.csv}"], {"dir.csv": lambda p: p.mkdir()}),
    case("top-zero", ["nsys", "--top", "0", "{f:r.sqlite}"], {"r.sqlite": b""}, name="--top"),
    case(
        "gap-nan",
        ["nsys", "--gap-us", "nan", "{f:r.sqlite}"],
        {"r.sqlite": sqlite_file(nsys_like_db([(1, 2, 0, 0, 1)]))},
        name="--gap-us",
    ),
    # nsys stats CSV
    case("csv-empty", ["nsys", "{f:kern_sum.csv}"], {"kern_sum.csv": b""}),
    case("csv-binary", ["nsys", "{f:kern_sum.csv}"], {"kern_sum.csv": garbage(20000)}),
    case(
        "csv-non-utf8", ["nsys", "{f:kern_sum.csv}"], {"kern_sum.csv": b"\xff\xfe,\x80\x81\n" * 100}
    ),
    case("csv-no-header", ["nsys", "{f:gpukernsum.csv}"], {"gpukernsum.csv": "a,b,c\n1,2,3\n"}),
    case(
        "csv-ragged-rows",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv("1,2,3,4,5,6,7,8,9,10,11,12,13", "1,2")},
    ),
    case(
        "csv-unclosed-quote",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv('50.0,100,2,50,50,40,60,1,"gemm')},
    ),
    case(
        "csv-instances-text",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv("50.0,100,many,50,50,40,60,1,gemm")},
    ),
    case(
        "csv-instances-empty",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv("50.0,100,,50,50,40,60,1,gemm")},
    ),
    case(
        "csv-total-inf",
        ["nsys", "--json", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv("50.0,1e999,2,50,50,40,60,1,gemm")},
    ),
    case(
        "csv-total-nan",
        ["nsys", "--json", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _kern_csv("50.0,nan,2,50,50,40,60,1,gemm")},
    ),
    case(
        "csv-10MB-line",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _KERN_HEADER + "1" * (10 << 20)},
    ),
    case(
        "csv-row-4096-fields",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _KERN_HEADER + "1," * 4096},
    ),
    case(
        "csv-NUL-bytes",
        ["nsys", "{f:kern_sum.csv}"],
        {"kern_sum.csv": _KERN_HEADER + "\0" * 1000 + "\n"},
    ),
    case("csv-directory", ["nsys", "{f:kern_sum.csv}"], {"kern_sum.csv": mkdir}),
    case("csv-missing", ["nsys", "{f:kern_sum.csv}"]),
    case("txt-garbage", ["nsys", "{f:stats.txt}"], {"stats.txt": garbage(3000)}),
    # the console text of nsys stats
    case(
        "text-only-skipped",
        ["nsys", "{f:stats.log}"],
        {
            "stats.log": "Processing [r.sqlite] with [/x/reports/osrt_sum.py]...\n"
            "SKIPPED: r.sqlite does not contain OS Runtime trace data.\n"
        },
    ),
    case(
        "text-header-misaligned",
        ["nsys", "{f:stats.txt}"],
        {
            "stats.txt": _TEXT_HEADER.replace("Instances", "Instances Instances")
            + _TEXT_DASHES
            + "  50.0  100  2  50.0  50.0  40  60  1.0  gemm\n"
        },
    ),
    case(
        "text-instances-word",
        ["nsys", "--json", "{f:stats.txt}"],
        {"stats.txt": _TEXT_HEADER + _TEXT_DASHES + _text_row("many")},
    ),
    case(
        "text-total-inf",
        ["nsys", "{f:stats.txt}"],
        {"stats.txt": _TEXT_HEADER + _TEXT_DASHES + _text_row("2", total="1e999")},
    ),
    case(
        "text-10MB-row",
        ["nsys", "{f:stats.txt}"],
        {"stats.txt": _TEXT_HEADER + _TEXT_DASHES + "9" * (10 << 20) + "\n"},
    ),
    case("text-dash-row-only", ["nsys", "{f:stats.log}"], {"stats.log": "a b\n--- ---\n"}),
    case(
        "text-escape-codes-in-name",
        ["nsys", "{f:stats.txt}"],
        {"stats.txt": _TEXT_HEADER + _TEXT_DASHES + _text_row("2", name="\x1b[2Jgemm")},
        codes=(0,),
    ),
]


@pytest.mark.parametrize("c", NSYS_CASES)
def test_nsys(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- gpu import FILE (nvidia-smi CSV) and gpu import --dcgm --prom URL -------------------------

_SMI_HEADER = (
    "timestamp, index, memory.used [MiB], memory.total [MiB], utilization.gpu [%], "
    "utilization.memory [%], power.draw [W], clocks.sm [MHz], clocks.mem [MHz], "
    "temperature.gpu\n"
)
_SMI_ROW = (
    "2024/05/01 12:00:00.123, 0, 1234 MiB, 81559 MiB, 45 %, 12 %, 250.12 W, 1980 MHz, "
    "2619 MHz, 40\n"
)


def _smi(*rows: str) -> str:
    return _SMI_HEADER + "".join(r + "\n" for r in rows)


def _smi_row(**cells: str) -> str:
    """The valid row with some cells replaced (by field position name)."""
    order = ["ts", "index", "used", "total", "util", "mutil", "power", "sm", "mem", "temp"]
    values = [c.strip() for c in _SMI_ROW.strip().split(",")]
    for k, v in cells.items():
        values[order.index(k)] = v
    return ", ".join(values)


GPU_CASES = [
    case("empty", ["gpu", "import", "{f:smi.csv}"], {"smi.csv": b""}, codes=(1,)),
    case("header-only", ["gpu", "import", "{f:smi.csv}"], {"smi.csv": _SMI_HEADER}, codes=(1,)),
    case(
        "wrong-columns",
        ["gpu", "import", "{f:smi.csv}"],
        {"smi.csv": "foo, bar, baz\n1, 2, 3\n"},
        codes=(1,),
    ),
    case(
        "wrong-columns-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": "foo, bar, baz\n1, 2, 3\n"},
    ),
    case(
        "nan-values-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(used="nan MiB", power="NaN W"))},
    ),
    case(
        "inf-values-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(used="inf MiB"))},
    ),
    case(
        "overflowing-number-json",
        ["gpu", "import", "--json", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(used="1e999 MiB", power="-1e999 W"))},
        codes=(0, 1, 2),
    ),
    case(
        "huge-index", ["gpu", "import", "{f:smi.csv}"], {"smi.csv": _smi(_smi_row(index="9" * 30))}
    ),
    case(
        "huge-index-4300-digits",
        ["gpu", "import", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(index="9" * 5000))},
    ),
    case(
        "negative-index-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(index="-1"))},
    ),
    case(
        "unknown-unit-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(used="12 parsecs"))},
    ),
    case(
        "timestamp-garbage-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(ts="yesterday"))},
    ),
    case(
        "timestamp-year-1-strict",
        ["gpu", "import", "--strict", "--tz", "+13:00", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(ts="0001/01/01 00:00:00"))},
        codes=(0, 1, 2),
    ),
    case(
        "timestamp-year-9999",
        ["gpu", "import", "--json", "--tz", "-12:00", "{f:smi.csv}"],
        {"smi.csv": _smi(_smi_row(ts="9999/12/31 23:59:59.999"))},
        codes=(0, 1, 2),
    ),
    case(
        "ragged-rows-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _smi("2024/05/01 12:00:00, 0, 1 MiB")},
    ),
    case(
        "non-utf8",
        ["gpu", "import", "{f:smi.csv}"],
        {"smi.csv": b"\xff\xfe\x00t\x00i\x00m\x00e\x00\n" * 100},
        codes=(1,),
    ),
    case(
        "utf16-with-bom",
        ["gpu", "import", "{f:smi.csv}"],
        {"smi.csv": ("\ufeff" + _smi(_SMI_ROW.strip())).encode("utf-16")},
        codes=(1,),
    ),
    case(
        "binary-garbage", ["gpu", "import", "{f:smi.csv}"], {"smi.csv": garbage(65536)}, codes=(1,)
    ),
    case(
        "binary-garbage-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": garbage(65536)},
    ),
    case("10MB-line", ["gpu", "import", "{f:smi.csv}"], {"smi.csv": "9" * (10 << 20)}, codes=(1,)),
    case(
        "NUL-line-strict",
        ["gpu", "import", "--strict", "{f:smi.csv}"],
        {"smi.csv": _SMI_HEADER + "\0" * 10000 + "\n"},
    ),
    case("directory", ["gpu", "import", "{f:smi}"], {"smi": mkdir}),
    case("missing", ["gpu", "import", "{f:missing.csv}"]),
    case("fifo", ["gpu", "import", "--strict", "{f:pipe.csv}"], {"pipe.csv": mkfifo}, codes=(2,)),
    case("dev-zero", ["gpu", "import", "/dev/zero"], name="/dev/zero", codes=(2,)),
    case(
        "sparse-64MB-one-line",
        ["gpu", "import", "{f:smi.csv}"],
        {"smi.csv": sparse_file(64 << 20)},
        codes=(2,),
    ),
    case("no-file", ["gpu", "import"], name="FILE"),
    case(
        "fields-empty",
        ["gpu", "import", "--fields", ",,", "{f:smi.csv}"],
        {"smi.csv": _SMI_ROW},
        name="fields",
    ),
    case(
        "fields-unknown",
        ["gpu", "import", "--fields", "foo,bar", "{f:smi.csv}"],
        {"smi.csv": _SMI_ROW},
        name="foo",
    ),
    case(
        "tz-unknown",
        ["gpu", "import", "--tz", "Mars/Olympus_Mons", "{f:smi.csv}"],
        {"smi.csv": _smi(_SMI_ROW.strip())},
        name="--tz",
    ),
    case(
        "tz-offset-out-of-range",
        ["gpu", "import", "--tz", "+99:99", "{f:smi.csv}"],
        {"smi.csv": _smi(_SMI_ROW.strip())},
        name="--tz",
    ),
    case(
        "tz-path-traversal",
        ["gpu", "import", "--tz", "../../../etc/passwd", "{f:smi.csv}"],
        {"smi.csv": _smi(_SMI_ROW.strip())},
        name="--tz",
    ),
    case(
        "tz-NUL",
        ["gpu", "import", "--tz", "UTC\0x", "{f:smi.csv}"],
        {"smi.csv": _smi(_SMI_ROW.strip())},
        name="--tz",
    ),
    case(
        "interval-zero",
        ["gpu", "import", "--interval", "0", "{f:smi.csv}"],
        {"smi.csv": _SMI_ROW},
        name="--interval",
    ),
    case(
        "interval-huge",
        ["gpu", "import", "--interval", "1e308", "{f:smi.csv}"],
        {"smi.csv": "1234\n"},
        name="--interval",
    ),
    case(
        "gpus-zero",
        ["gpu", "import", "--gpus", "0", "{f:smi.csv}"],
        {"smi.csv": _SMI_ROW},
        name="--gpus",
    ),
    case(
        "dcgm-and-file",
        ["gpu", "import", "--dcgm", "--prom", "{dead}", "{f:smi.csv}"],
        {"smi.csv": _SMI_ROW},
        name="--dcgm",
    ),
    case("dcgm-without-prom", ["gpu", "import", "--dcgm"], name="--prom"),
    case("dcgm-dead-prom", ["gpu", "import", "--dcgm", "--prom", "{dead}"]),
    case("dcgm-html-prom", ["gpu", "import", "--dcgm", "--prom", "{srv:html}"]),
    case("dcgm-500-prom", ["gpu", "import", "--dcgm", "--prom", "{srv:e500}"]),
    case("dcgm-data5", ["gpu", "import", "--dcgm", "--prom", "{srv:data5}"]),
    case("dcgm-result-items-garbage", ["gpu", "import", "--dcgm", "--prom", "{srv:qitems}"]),
    case(
        "dcgm-start-garbage",
        ["gpu", "import", "--dcgm", "--prom", "{dead}", "--start", "last tuesday"],
        name="last tuesday",
    ),
    case(
        "dcgm-start-nan",
        ["gpu", "import", "--dcgm", "--prom", "{srv:qnodata}", "--start", "nan"],
        name="nan",
    ),
    case(
        "dcgm-end-beyond-datetime",
        ["gpu", "import", "--dcgm", "--prom", "{srv:qnodata}", "--end", "1e20"],
        name="1e20",
    ),
    case(
        "dcgm-end-before-start",
        ["gpu", "import", "--dcgm", "--prom", "{dead}", "--start", "now", "--end", "now-1h"],
        name="--end",
    ),
]


@pytest.mark.parametrize("c", GPU_CASES)
def test_gpu_import(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- spans import FILE (a few; test_span_import covers the decoder) ----------------------------

SPANS_CASES = [
    case("missing", ["spans", "import", "--store", "{new_store}", "{f:missing.jsonl}"]),
    case("directory", ["spans", "import", "--store", "{new_store}", "{f:spans}"], {"spans": mkdir}),
    case("empty", ["spans", "import", "--store", "{new_store}", "{f:s.jsonl}"], {"s.jsonl": b""}),
    case(
        "binary-garbage",
        ["spans", "import", "--store", "{new_store}", "{f:s.jsonl}"],
        {"s.jsonl": garbage(30000)},
    ),
    case(
        "non-utf8",
        ["spans", "import", "--store", "{new_store}", "{f:s.jsonl}"],
        {"s.jsonl": b'{"resourceSpans": ["\xff\xfe"]}\n'},
    ),
    case(
        "deep-line",
        ["spans", "import", "--store", "{new_store}", "{f:s.jsonl}"],
        {"s.jsonl": deep_json(100_000, prefix='{"resourceSpans": ', suffix="}\n")},
    ),
    case(
        "gz-corrupt",
        ["spans", "import", "--store", "{new_store}", "{f:s.jsonl.gz}"],
        {"s.jsonl.gz": b"\x1f\x8b\x08" + garbage(500)},
    ),
    case(
        "json-array-lines",
        ["spans", "import", "--store", "{new_store}", "{f:s.jsonl}"],
        {"s.jsonl": '[]\n5\nnull\n"x"\n'},
    ),
    case(
        "store-is-a-directory",
        ["spans", "import", "--store", "{out}", "{f:s.jsonl}"],
        {"s.jsonl": "{}\n"},
        name="out",
    ),
    case(
        "store-not-sqlite",
        ["spans", "import", "--store", "{f:store.sqlite}", "{f:s.jsonl}"],
        {"s.jsonl": "{}\n", "store.sqlite": garbage(4096)},
        name="store.sqlite",
    ),
    case(
        "fifo",
        ["spans", "import", "--store", "{new_store}", "{f:pipe.jsonl}"],
        {"pipe.jsonl": mkfifo},
        codes=(2,),
    ),
    case(
        "dev-zero",
        ["spans", "import", "--store", "{new_store}", "/dev/zero"],
        name="/dev/zero",
        codes=(2,),
    ),
    case(
        "store-fifo",
        ["spans", "import", "--store", "{f:pipe.sqlite}", "{f:s.jsonl}"],
        {"s.jsonl": "{}\n", "pipe.sqlite": mkfifo},
        name="pipe.sqlite",
        codes=(2,),
    ),
]


@pytest.mark.parametrize("c", SPANS_CASES)
def test_spans_import(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- ab PLAYBOOK -------------------------------------------------------------------------------


def book(
    run: dict[str, str | None] | None = None,
    top: dict[str, str | None] | None = None,
    a: dict[str, str | None] | None = None,
    b: dict[str, str | None] | None = None,
    tail: str = "",
) -> str:
    """A playbook: two arms at a port where nothing listens (so a playbook that passes
    validation ends in 'endpoint unreachable', never in a run), with fields replaced
    (a value of None drops the key). Values are TOML source text."""

    def table(fields: dict[str, str | None]) -> list[str]:
        return [f"{k} = {v}" for k, v in fields.items() if v is not None]

    t = table({"name": '"hostile"', "model": '"m"', **(top or {})})
    r = table({"prompt": '"hello"', "max_tokens": "8", "runs": "2", **(run or {})})
    aa = table({"name": '"a"', "endpoint": '"{dead}"', **(a or {})})
    bb = table({"name": '"b"', "endpoint": '"{dead}"', **(b or {})})
    return "\n".join([*t, "[run]", *r, "[[arm]]", *aa, "[[arm]]", *bb]) + "\n" + tail


def ab(
    cid: str,
    text: str | bytes | Callable[[Path], None],
    name: str | None = None,
    extra: list[str] | None = None,
    bug: str | None = None,
) -> Any:
    return case(
        cid,
        ["ab", "{f:book.toml}", "--store", "{new_store}", *(extra or [])],
        {"book.toml": text},
        name=name,
        bug=bug,
    )


def run_field(cid: str, key: str, value: str, bug: str | None = None) -> Any:
    return ab(f"run.{key}={cid}", book(run={key: value}), name=f"run.{key}", bug=bug)


BUG_AB_TIMEOUT = (
    "BUG phaseprobe/collect/ab/playbook.py:_run_plan: run.timeout_s = inf or nan passes "
    "(`timeout <= 0` is False for both) and reaches the requests — fix: require "
    "math.isfinite(timeout) and 0 < timeout <= 7*24*3600, like present/args.seconds"
)
BUG_AB_PAUSE = (
    "BUG phaseprobe/collect/ab/playbook.py:_run_plan: run.pause_s = nan or 1e308 passes "
    "(`pause < 0` is False) and would reach time.sleep — fix: require math.isfinite(pause) "
    "and 0 <= pause <= 3600 (naming run.pause_s)"
)
BUG_AB_MAX_RUNS = (
    "BUG phaseprobe/collect/ab/playbook.py:_run_plan: run.max_runs has no upper bound (10**18 "
    "passes) although --max-runs is capped at 100000 in cmd_ab._check_numbers — fix: "
    "r.int_('max_runs', 60, 2) plus a maximum of 100000 naming run.max_runs"
)

AB_CASES = [
    ab("missing", lambda p: None, name="book.toml"),
    ab("directory", mkdir, name="book.toml"),
    ab("fifo", mkfifo, name="book.toml"),
    ab("sparse-20GB", sparse_file(20 << 30), name="book.toml"),
    case("dev-zero", ["ab", "/dev/zero", "--store", "{new_store}"], name="/dev/zero", codes=(2,)),
    ab("empty", b"", name="book.toml"),
    ab("non-utf8", b'name = "x"\n[run]\nprompt = "\xff\xfe"\n', name="byte 27"),
    ab("utf16", book().encode("utf-16"), name="book.toml"),
    ab("binary-garbage", garbage(5000), name="book.toml"),
    ab("NUL-bytes", b'name = "a\0b"\n', name="book.toml"),
    ab("invalid-toml", "name = \n[run\n", name="book.toml"),
    ab("duplicate-key", book(tail='name = "again"\n'), name="book.toml"),
    ab(
        "deep-inline-tables",
        book(tail="x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"),
        name="book.toml",
    ),
    ab("deep-arrays", book(tail="x = " + "[" * 100_000 + "]" * 100_000 + "\n"), name="book.toml"),
    ab("10MB-string", book(top={"description": '"' + "d" * (10 << 20) + '"'}), name="{deadhp}"),
    ab("unknown-top-key", book(top={"arms": "[]"}), name="arms"),
    ab("name-not-string", book(top={"name": "5"}), name="name"),
    ab("name-empty", book(top={"name": '"  "'}), name="name"),
    ab("description-list", book(top={"description": "[]"}), name="description"),
    ab("model-number", book(top={"model": "1.5"}), name="model"),
    ab("run-not-a-table", book().replace("[run]\n", "run = 5\n[run2]\n"), name="book.toml"),
    ab("run-missing", book(tail="").replace("[run]", "[runs]"), name="runs"),
    run_field("unknown", "repeat", "3"),
    run_field("5", "prompt", "5"),
    run_field("empty", "prompt", '""'),
    ab("run.prompt-and-prompt_tokens", book(run={"prompt_tokens": "8"}), name="run.prompt"),
    ab("run.neither-prompt", book(run={"prompt": None}), name="run.prompt"),
    ab(
        "run.prompt_tokens=text",
        book(run={"prompt": None, "prompt_tokens": '"8"'}),
        name="run.prompt_tokens",
    ),
    ab(
        "run.prompt_tokens=0",
        book(run={"prompt": None, "prompt_tokens": "0"}),
        name="run.prompt_tokens",
    ),
    ab(
        "run.prompt_tokens=float",
        book(run={"prompt": None, "prompt_tokens": "8.5"}),
        name="run.prompt_tokens",
    ),
    run_field("1", "max_tokens", "1"),
    run_field("text", "max_tokens", '"8"'),
    run_field("bool", "max_tokens", "true"),
    run_field("nan", "max_tokens", "nan"),
    ab("run.max_tokens-missing", book(run={"max_tokens": None}), name="run.max_tokens"),
    run_field("0", "runs", "0"),
    run_field("float", "runs", "1.5"),
    run_field("-1", "warmup", "-1"),
    run_field("grpc", "api", '"grpc"'),
    run_field("number", "api", "5"),
    run_field("random", "order", '"random"'),
    run_field("0", "block_size", "0"),
    run_field("-1", "seed", "-1"),
    run_field("text", "min_effect", '"a lot"'),
    run_field("zero", "min_effect", '"0%"'),
    run_field("bool", "min_effect", "true"),
    run_field("1e308", "min_effect", "1e308"),
    run_field("nan", "min_effect", "nan"),
    run_field("-inf", "min_effect", "-inf"),
    run_field("yes", "ignore_eos", '"yes"'),
    run_field("0", "timeout_s", "0"),
    run_field("-1", "timeout_s", "-1"),
    run_field("text", "timeout_s", '"10s"'),
    run_field("inf", "timeout_s", "inf"),
    run_field("nan", "timeout_s", "nan"),
    run_field("-1", "pause_s", "-1"),
    run_field("nan", "pause_s", "nan"),
    run_field("1e308", "pause_s", "1e308"),
    run_field("1", "until_decided", "1"),
    run_field("1e308", "max_runs", "1e308"),
    run_field("-1", "max_runs", "-1"),
    run_field("nan", "max_runs", "nan"),
    run_field("1", "max_runs", "1"),
    run_field("10**18", "max_runs", "1000000000000000000"),
    run_field("0", "max_minutes", "0"),
    run_field("nan", "max_minutes", "nan"),
    run_field("inf", "max_minutes", "inf"),
    run_field("a-year", "max_minutes", "525600"),
    run_field("unknown", "primary", '"throughput"'),
    run_field("number", "primary", "5"),
    ab("arm-one", book().rsplit("[[arm]]", 1)[0], name="arm"),
    ab("arm-three", book(tail='[[arm]]\nname = "c"\nendpoint = "{dead}"\n'), name="arm"),
    ab("arm-not-tables", book().split("[[arm]]")[0] + "arm = [1, 2]\n", name="run.arm"),
    ab("arm-is-a-table", book().split("[[arm]]")[0] + '[arm]\nname = "a"\n', name="arm"),
    ab("arm-typo-arms", book().replace("[[arm]]", "[[arms]]"), name="arms"),
    ab("arm-same-names", book(b={"name": '"a"'}), name="arm[1].name"),
    ab("arm-name-missing", book(a={"name": None}), name="arm[0].name"),
    ab("arm-unknown-key", book(a={"gpu": "0"}), name="arm[0].gpu"),
    ab("arm-endpoint-and-launch", book(a={"launch": "{ args = [] }"}), name="arm[0]"),
    ab("arm-neither", book(b={"endpoint": None}), name="arm[1]"),
    ab("arm-endpoint-ftp", book(a={"endpoint": '"ftp://h:21"'}), name="arm[0].endpoint"),
    ab("arm-endpoint-empty", book(a={"endpoint": '""'}), name="arm[0].endpoint"),
    ab("arm-endpoint-no-host", book(a={"endpoint": '"http://"'}), name="arm[0].endpoint"),
    ab("arm-endpoint-number", book(a={"endpoint": "8000"}), name="arm[0].endpoint"),
    ab("arm-endpoint-bad-port", book(a={"endpoint": '"http://127.0.0.1:99999"'}), name="99999"),
    ab(
        "arm-endpoint-spaces", book(a={"endpoint": '"http://127.0.0.1:1/ a b"'}), name="127.0.0.1:1"
    ),
    ab(
        "arm-endpoint-html",
        book(a={"endpoint": '"{srv:m_html}"'}, b={"endpoint": '"{srv:m_html}"'}),
        name="{hp}",
    ),
    ab(
        "arm-endpoint-data5",
        book(a={"endpoint": '"{srv:m_data5}"'}, b={"endpoint": '"{srv:m_data5}"'}),
        name="{hp}",
    ),
    ab(
        "arm-model-not-served",
        book(a={"endpoint": '"{srv:m_ok}"'}, b={"endpoint": '"{srv:m_ok}"'}),
        name="{hp}",
    ),
    ab(
        "launch-shell-string",
        book(a={"endpoint": None, "launch": '"vllm serve m"'}),
        name="arm[0].launch",
    ),
    ab(
        "launch-args-string",
        book(a={"endpoint": None, "launch": '{ args = "--dtype float16" }'}),
        name="arm[0].launch.args",
    ),
    ab(
        "launch-args-numbers",
        book(a={"endpoint": None, "launch": "{ args = [1, 2] }"}),
        name="arm[0].launch.args",
    ),
    ab(
        "launch-args-joined",
        book(a={"endpoint": None, "launch": '{ args = ["--dtype float16"] }'}),
        name="arm[0].launch.args",
    ),
    ab(
        "launch-args-port",
        book(a={"endpoint": None, "launch": '{ args = ["--port=8001"] }'}),
        name="arm[0].launch.args",
    ),
    ab(
        "launch-env-number",
        book(a={"endpoint": None, "launch": "{ env = { A = 1 } }"}),
        name="arm[0].launch.env",
    ),
    ab(
        "launch-env-list",
        book(a={"endpoint": None, "launch": "{ env = [1] }"}),
        name="arm[0].launch.env",
    ),
    ab(
        "launch-timeout-zero",
        book(a={"endpoint": None, "launch": "{ startup_timeout_s = 0 }"}),
        name="arm[0].launch.startup_timeout_s",
    ),
    ab(
        "launch-timeout-bool",
        book(a={"endpoint": None, "launch": "{ startup_timeout_s = true }"}),
        name="arm[0].launch.startup_timeout_s",
    ),
    ab(
        "launch-command-empty",
        book(a={"endpoint": None, "launch": "{ command = [] }"}),
        name="arm[0].launch.command",
    ),
    ab(
        "launch-unknown-key",
        book(a={"endpoint": None, "launch": "{ shell = true }"}),
        name="arm[0].launch.shell",
    ),
    ab("launch-not-a-table", book(a={"endpoint": None, "launch": "5"}), name="arm[0].launch"),
    ab("cli-min-effect-text", book(), name="--min-effect", extra=["--min-effect", "lots"]),
    ab("cli-min-effect-nan", book(), name="--min-effect", extra=["--min-effect", "nan"]),
    ab("cli-runs-zero", book(), name="--runs", extra=["--runs", "0"]),
    ab("cli-max-runs-one", book(), name="--max-runs", extra=["--max-runs", "1"]),
    ab("cli-max-minutes-nan", book(), name="--max-minutes", extra=["--max-minutes", "nan"]),
    ab("cli-max-minutes-inf", book(), name="--max-minutes", extra=["--max-minutes", "inf"]),
    ab(
        "cli-runs-and-until-decided",
        book(),
        name="--runs",
        extra=["--runs", "3", "--until-decided"],
    ),
    ab("cli-api-key-env-unset", book(), name="NO_SUCH_VAR", extra=["--api-key-env", "NO_SUCH_VAR"]),
    ab("cli-primary-unknown", book(), name="--primary", extra=["--primary", "vibes"]),
    case(
        "shipped-name-unknown",
        ["ab", "no-such-playbook", "--store", "{new_store}"],
        name="no-such-playbook",
    ),
    case(
        "two-playbooks",
        ["ab", "{f:a.toml}", "{f:b.toml}", "--store", "{new_store}"],
        {"a.toml": book(), "b.toml": book()},
        name="PLAYBOOK",
    ),
    case("report-not-a-number", ["ab", "report", "x1", "--store", "{store}"], name="x1"),
    case(
        "report-missing-store",
        ["ab", "report", "1", "--store", "{missing_store}"],
        name="none.sqlite",
    ),
    case("report-no-such-session", ["ab", "report", "99", "--store", "{store}"], name="99"),
    case("compare-one-id", ["ab", "compare", "1", "--store", "{store}"], name="ab compare"),
    case(
        "compare-missing-experiment", ["ab", "compare", "1", "77", "--store", "{store}"], name="77"
    ),
    case(
        "resume-missing-store",
        ["ab", "--resume", "3", "--store", "{missing_store}"],
        name="none.sqlite",
    ),
    case("resume-no-such-session", ["ab", "--resume", "3", "--store", "{store}"], name="3"),
    case(
        "store-not-sqlite",
        ["ab", "{f:book.toml}", "--store", "{f:st.sqlite}"],
        {"book.toml": book(), "st.sqlite": garbage(4096)},
        name="st.sqlite",
    ),
]


@pytest.mark.parametrize("c", AB_CASES)
def test_ab(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- probe, query, grafana, plan, runs, check, spans, interplay: servers that lie, numbers
# -- out of range (the commands the first sweep left out) ------------------------------------


def _probe(
    cid: str, endpoint: str, *extra: str, name: str | None = None, codes: tuple[int, ...] = (1, 2)
) -> Any:
    return case(
        cid,
        [
            "probe",
            "--endpoint",
            endpoint,
            "--runs",
            "1",
            "--warmup",
            "0",
            "--no-gpu",
            "--no-spans",
            "--store",
            "{new_store}",
            *extra,
        ],
        name=name,
        codes=codes,
    )


_MODELS_SCENARIOS = (
    "m_html",
    "m_500",
    "m_401",
    "m_data5",
    "m_datanull",
    "m_datastr",
    "m_datadict",
    "m_noid",
    "m_empty",
    "m_list",
    "m_deep",
    "m_badjson",
    "m_huge",
    "m_badutf8",
)
PROBE_CASES = [
    *[_probe(f"models-{s}", "{srv:" + s + "}", name="{hp}") for s in _MODELS_SCENARIOS],
    # 10,000 models are fine (32 kept); the completions then get a model list back: run fails
    _probe("models-10k-then-no-completions", "{srv:m_10k}", codes=(1, 2)),
    _probe("dead-endpoint", "{dead}", name="{deadhp}"),
    _probe("endpoint-ftp", "ftp://127.0.0.1:9", name="ftp://127.0.0.1:9"),
    _probe("endpoint-query-token", "http://127.0.0.1:9/?api_key=SECRET", name="api_key"),
    _probe("endpoint-userinfo-dead", "http://u:SECRET@{deadhp}", name="{deadhp}"),
    _probe(
        "prompt-tokens-1e11", "{dead}", "--prompt-tokens", "100000000000", name="--prompt-tokens"
    ),
    _probe("max-tokens-1e7", "{dead}", "--max-tokens", "10000000", name="--max-tokens"),
    _probe("runs-1e9", "{dead}", "--runs", "1000000000", name="--runs"),
    _probe("runs-zero", "{dead}", "--runs", "0", name="--runs"),
    _probe("warmup-negative", "{dead}", "--warmup", "-1", name="--warmup"),
    _probe("timeout-zero", "{dead}", "--timeout", "0", name="--timeout"),
    _probe("timeout-nan", "{dead}", "--timeout", "nan", name="--timeout"),
    _probe("deadline-inf", "{dead}", "--deadline", "inf", name="--deadline"),
    _probe("pause-negative", "{dead}", "--pause", "-1", name="--pause"),
    _probe("gpu-period-zero", "{dead}", "--gpu-period", "0", name="--gpu-period"),
    _probe("peaks-unknown", "{dead}", "--peaks", "h300", name="--peaks"),
    _probe("model-config-missing", "{dead}", "--model-config", "{f:nope.json}", name="nope.json"),
    *[
        case(
            f"model-config-{cid}-{cmd[0]}",
            [*cmd, "--model-config", path],
            files,
            name=name,
            codes=(2,),
        )
        for cmd in (
            [
                "probe",
                "--endpoint",
                "{dead}",
                "--runs",
                "1",
                "--no-gpu",
                "--no-spans",
                "--store",
                "{new_store}",
            ],
            ["check", "--store", "{store}", "--peaks", "h100-sxm"],
            ["calibrate"],
        )
        for cid, path, files, name in (
            ("fifo", "{f:config.json}", {"config.json": mkfifo}, "config.json"),
            ("dev-zero", "/dev/zero", {}, "/dev/zero"),
            (
                "sparse-20GB",
                "{f:config.json}",
                {"config.json": sparse_file(20 << 30)},
                "config.json",
            ),
        )
    ],
    case(
        "check-model-config-deep",
        ["check", "--store", "{store}", "--peaks", "h100-sxm", "--model-config", "{f:deep.json}"],
        {"deep.json": deep_json(100_000)},
        codes=(2,),
    ),
    case(
        "check-trace-deep",
        ["check", "--latest", "--store", "{store}", "--trace", "{f:deep.json}"],
        {"deep.json": deep_json(100_000)},
        codes=(2,),
    ),
    case(
        "check-trace-fifo",
        ["check", "--latest", "--store", "{store}", "--trace", "{f:pipe.json}"],
        {"pipe.json": mkfifo},
        codes=(2,),
    ),
    case(
        "check-nccl-json-deep",
        ["check", "--latest", "--store", "{store}", "--nccl", "{f:deep.json}"],
        {"deep.json": deep_json(100_000)},
        codes=(2,),
    ),
    case(
        "check-server-log-dev-zero",
        ["check", "--latest", "--store", "{store}", "--server-log", "/dev/zero"],
        name="/dev/zero",
        codes=(2,),
    ),
]

_PROM_SCENARIOS = (
    "html",
    "e500",
    "e401",
    "e404",
    "badjson",
    "empty200",
    "data5",
    "datastr",
    "deep",
    "redirect",
    "huge",
    "badutf8",
    "promql400",
    "qvalue",
    "qitems",
    "qmetric",
    "qresult5",
    "qnodata",
    "qdeep",
)
QUERY_CASES = [
    *[
        case(
            f"prom-{s}",
            ["query", "ttft_p50", "--prom", "{srv:" + s + "}", "--timeout", "2"],
            name="{hp}",
        )
        for s in _PROM_SCENARIOS
    ],
    case("prom-dead", ["query", "ttft_p50", "--prom", "{dead}"], name="{deadhp}"),
    case(
        "prom-unknown-query", ["query", "no_such_query", "--prom", "{dead}"], name="no_such_query"
    ),
    case(
        "prom-timeout-nan",
        ["query", "ttft_p50", "--prom", "{dead}", "--timeout", "nan"],
        name="--timeout",
    ),
    case(
        "prom-range-backwards",
        [
            "query",
            "ttft_p50",
            "--prom",
            "{dead}",
            "--range",
            "2024-01-02T00:00:00Z",
            "2024-01-01T00:00:00Z",
        ],
        name="--range",
    ),
]

_GRAFANA_SCENARIOS = ("g_html", "g_500", "g_401", "g_deep", "g_badjson", "tarpit")
GRAFANA_CASES = [
    *[
        case(
            f"grafana-{s}",
            ["grafana", "import", "--url", "{srv:" + s + "}", "--timeout", "1"],
            name="{hp}",
            env={"GRAFANA_TOKEN": "tok"},
        )
        for s in _GRAFANA_SCENARIOS
    ],
    case(
        "grafana-dead",
        ["grafana", "import", "--url", "{dead}"],
        name="{deadhp}",
        env={"GRAFANA_TOKEN": "tok"},
    ),
    case(
        "grafana-no-token",
        ["grafana", "import", "--url", "{dead}"],
        name="GRAFANA_TOKEN",
        env={"GRAFANA_TOKEN": ""},
    ),
    case(
        "grafana-file-deep",
        ["grafana", "import", "{f:d.json}", "--url", "{dead}"],
        {"d.json": deep_json(100_000)},
        name="d.json",
        env={"GRAFANA_TOKEN": "tok"},
    ),
    case(
        "grafana-lint-metrics-garbage",
        ["grafana", "lint", "--metrics", "{srv:x_garbage}"],
        name="{hp}",
    ),
    case("grafana-lint-metrics-500", ["grafana", "lint", "--metrics", "{srv:x_500}"], name="{hp}"),
    *[
        case(
            f"grafana-lint{'-metrics' if flag else ''}-{cid}",
            ["grafana", "lint", *([flag] if flag else []), path],
            files,
            name=name,
            codes=(2,),
        )
        for flag in ("", "--metrics")
        for cid, path, files, name in (
            ("fifo", "{f:pipe.json}", {"pipe.json": mkfifo}, "pipe.json"),
            ("dev-zero", "/dev/zero", {}, "/dev/zero"),
            ("sparse-20GB", "{f:big.json}", {"big.json": sparse_file(20 << 30)}, "big.json"),
        )
    ],
    case(
        "grafana-build-out-fifo",
        ["grafana", "build", "--out", "{f:out.json}"],
        {"out.json": mkfifo},
        codes=(2,),
    ),
]

OTHER_CASES = [
    case(
        "plan-gpus-huge",
        ["plan", "--config", "{f:c.json}", "--gpu-mem-gb", "80", "--gpus", str(10**30)],
        {"c.json": "{}"},
        name="--gpus",
    ),
    case(
        "plan-context-zero",
        ["plan", "--config", "{f:c.json}", "--gpu-mem-gb", "80", "--context", "0"],
        {"c.json": "{}"},
        name="--context",
    ),
    case(
        "plan-config-not-json",
        ["plan", "--config", "{f:c.json}", "--gpu-mem-gb", "80"],
        {"c.json": garbage(500)},
        name="c.json",
    ),
    case(
        "plan-config-dev-zero",
        ["plan", "--config", "/dev/zero", "--gpu-mem-gb", "80"],
        name="/dev/zero",
        codes=(2,),
    ),
    case(
        "plan-config-fifo",
        ["plan", "--config", "{f:c.json}", "--gpu-mem-gb", "80"],
        {"c.json": mkfifo},
        codes=(2,),
    ),
    case(
        "plan-config-sparse-20GB",
        ["plan", "--config", "{f:c.json}", "--gpu-mem-gb", "80"],
        {"c.json": sparse_file(20 << 30)},
        codes=(2,),
    ),
    *[
        case(
            f"store-fifo-{'-'.join(cmd)}",
            [*cmd, "--store", "{f:pipe.sqlite}"],
            {"pipe.sqlite": mkfifo},
            codes=(2,),
        )
        for cmd in (
            ["runs"],
            ["runs", "--latest"],
            ["check", "--latest"],
            ["spans", "list"],
            ["ab", "report", "1"],
            ["dashboard"],
        )
    ],
    case(
        "nccl-save-fifo",
        ["nccl", "{f:a.log}", "--save", "{f:out.json}"],
        {"a.log": nccl_log(), "out.json": mkfifo},
        name="out.json",
        codes=(2,),
    ),
    case("runs-id-beyond-sqlite", ["runs", str(10**30), "--store", "{store}"], name="experiment"),
    case("runs-missing-store", ["runs", "--store", "{missing_store}"], name="none.sqlite"),
    case(
        "check-id-beyond-sqlite",
        ["check", "--experiment", str(10**25), "--store", "{store}"],
        name="--experiment",
    ),
    case(
        "check-no-such-experiment",
        ["check", "--experiment", "987", "--store", "{store}"],
        name="987",
    ),
    case(
        "spans-show-unknown",
        ["spans", "show", "no-such-request", "--store", "{store}"],
        name="no-such-request",
    ),
    case(
        "spans-list-last-zero",
        ["spans", "list", "--last", "0", "--store", "{store}"],
        name="--last",
    ),
    case(
        "batch-concurrency-huge",
        ["batch", "--endpoint", "{dead}", "--concurrency", "1,100000"],
        name="--concurrency",
    ),
    case("batch-dead", ["batch", "--endpoint", "{dead}", "--concurrency", "1"], name="{deadhp}"),
    case(
        "prefix-tokens-huge",
        ["prefix", "--endpoint", "{dead}", "--prefix-tokens", str(10**9)],
        name="--prefix-tokens",
    ),
    case("interfere-dead", ["interfere", "--endpoint", "{dead}"], name="{deadhp}"),
    case("interfere-models-deep", ["interfere", "--endpoint", "{srv:m_deep}"], name="{hp}"),
    case(
        "dashboard-port-huge", ["dashboard", "--port", "70000", "--store", "{store}"], name="--port"
    ),
]


@pytest.mark.parametrize("c", PROBE_CASES + QUERY_CASES + GRAFANA_CASES + OTHER_CASES)
def test_more_commands(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- numeric options checked before any request (interfere, query) -----------------------------

NUMERIC_OPTION_CASES = [
    *[
        case(
            f"interfere-at-time-{v}",
            ["interfere", "--endpoint", "{dead}", "--at-time", v],
            name="--at-time",
        )
        for v in ("nan", "1e400", "inf", "-1", "1e9")
    ],
    *[
        case(
            f"interfere-min-effect-{v}",
            ["interfere", "--endpoint", "{dead}", "--endpoint-b", "{dead}", "--min-effect", v],
            name="--min-effect",
        )
        for v in ("nan", "-1", "0", "1e400", "abc")
    ],
    *[
        case(
            f"query-step-{v}",
            [
                "query",
                "ttft_p50",
                "--prom",
                "{srv:tarpit}",
                "--range",
                "now-1h",
                "now",
                "--step",
                v,
            ],
            name="--step",
        )
        for v in ("0", "-1", "nan", "abc", "1e400", "0s")
    ],
    *[
        case(
            f"query-at-{v}", ["query", "ttft_p50", "--prom", "{srv:tarpit}", "--at", v], name="--at"
        )
        for v in ("nan", "1e400", "-1")
    ],
]


@pytest.mark.parametrize("c", NUMERIC_OPTION_CASES)
def test_numeric_options(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    _run(c, world, capsys, monkeypatch)


# -- base URLs that paths are appended to: no ?query / #fragment, no Grafana userinfo ---------

BASE_URL_CASES = [
    case(
        "prom-query-token",
        ["query", "ttft_p50", "--prom", "{srv:tarpit}/?access_token=SECRETQ"],
        name="Prometheus URL",
    ),
    case(
        "prom-fragment",
        ["query", "ttft_p50", "--prom", "{srv:tarpit}#token=SECRETQ"],
        name="Prometheus URL",
    ),
    case(
        "grafana-query-token",
        ["grafana", "import", "--url", "{srv:tarpit}?access_token=SECRETQ"],
        name="Grafana URL",
        env={"GRAFANA_TOKEN": "tok"},
    ),
    case(
        "grafana-userinfo",
        ["grafana", "import", "--url", "http://u:SECRETPW@{hp}"],
        name="Basic auth",
        env={"GRAFANA_TOKEN": "tok"},
    ),
]


@pytest.mark.parametrize("c", BASE_URL_CASES)
def test_base_urls(c: Case, world: World, capsys: Any, monkeypatch: Any) -> None:
    o = run_case(c, world, capsys, monkeypatch)
    check(c, o, world)
    assert "SECRETQ" not in o.out + o.err and "SECRETPW" not in o.out + o.err
