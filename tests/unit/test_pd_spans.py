"""Issue 28 item 1: one P/D request, two legs — joining the prefill and decode legs' spans.

Synthetic spans shaped as research/fleet_pd.md measured them: both legs' ``gen_ai.request.id``
``cmpl-<X-Request-Id>-0`` (by hand) or the router's ``___prefill_addr_…___decode_addr_…`` id,
both in the client's trace under one parent when it sent a traceparent; the prefill leg has 1
output token and decode 0, the decode leg the rest.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from phaseprobe.analysis.pd.spans import PdJoin, join_legs, normalise_id, parse_router_id, pd_record
from phaseprobe.present.cli import main
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
UUID = "0123456789abcdef0123456789abcdef"
ROUTER = f"___prefill_addr_127.0.0.1:8061___decode_addr_127.0.0.1:8062_{UUID}"
_n = 0


def _span(
    *,
    start_ns: int,
    queue_ms: float,
    prefill_ms: float,
    ttft_ms: float,
    decode_ms: float,
    end_ms: float,
    out: int,
    request_id: str | None,
    instance: str,
    trace: str | None = None,
    parent: str | None = None,
) -> RequestSpan:
    global _n
    _n += 1
    return RequestSpan(
        trace_id=trace or f"{_n:032x}",
        span_id=f"{_n:016x}",
        request_id=request_id,
        model="tiny",
        service="vllm",
        instance=instance,
        start_ns=start_ns,
        end_ns=start_ns + round(end_ms * MS),
        queue_s=queue_ms / 1e3,
        prefill_s=prefill_ms / 1e3,
        decode_s=decode_ms / 1e3,
        inference_s=(prefill_ms + decode_ms) / 1e3,
        ttft_s=ttft_ms / 1e3,
        e2e_s=end_ms / 1e3,
        prompt_tokens=474,
        completion_tokens=out,
        parent_span_id=parent,
    )


def legs(
    request_id: str | None = "cmpl-abc-0",
    *,
    t0: int = T0,
    p_inst: str = "prefill",
    d_inst: str = "decode",
    trace: str | None = None,
    parent: str | None = None,
    decode_out: int = 16,
    d_request_id: str | None = "same",
) -> tuple[RequestSpan, RequestSpan]:
    """A prefill leg (arrives t0, 28 ms, 1 token) and a decode leg arriving 2 ms after the
    prefill leg's end: its queue 4 ms, prefill 16 ms, TTFT 24 ms, decode 55 ms. The decode
    leg's request id is the prefill leg's unless ``d_request_id`` says otherwise."""
    p = _span(
        start_ns=t0,
        queue_ms=1,
        prefill_ms=20,
        ttft_ms=25,
        decode_ms=0,
        end_ms=28,
        out=1,
        request_id=request_id,
        instance=p_inst,
        trace=trace,
        parent=parent,
    )
    d_decode = 55.0 if decode_out > 1 else 0.0
    d = _span(
        start_ns=t0 + 30 * MS,
        queue_ms=4,
        prefill_ms=16,
        ttft_ms=24,
        decode_ms=d_decode,
        end_ms=82,
        out=decode_out,
        request_id=request_id if d_request_id == "same" else d_request_id,
        instance=d_inst,
        trace=trace,
        parent=parent,
    )
    return p, d


def test_ids() -> None:
    assert normalise_id("cmpl-abc-0") == "abc"
    assert normalise_id("chatcmpl-abc-0") == "abc"
    assert normalise_id("abc") == "abc"
    r = parse_router_id(f"cmpl-{ROUTER}-0")
    assert r is not None
    assert (r.prefill_addr, r.decode_addr, r.uuid) == ("127.0.0.1:8061", "127.0.0.1:8062", UUID)
    assert parse_router_id("cmpl-abc-0") is None


def test_joined_by_request_id_roles_from_legs_and_hand_over_by_hand() -> None:
    p, d = legs()
    # Given in the "wrong" order: the roles come from the legs, not the order.
    joined = join_legs([d, p])
    assert joined.unjoined == ()
    (r,) = joined.records
    assert (r.key, r.joined_by, r.roles_from) == ("abc", "request_id", "legs")
    assert r.prefill is p and r.decode is d
    # By hand: the prefill leg ends at t0 + 28 ms; the decode leg arrives at t0 + 30 ms, its
    # first token at +54 ms, so it was scheduled at 54 - 16 = +38 ms: hand-over 10 ms.
    assert r.hand_over_s == pytest.approx(0.010)
    assert r.legs_gap_s == pytest.approx(0.002)
    assert r.decode_kv_wait_s == pytest.approx(0.004)
    assert r.decode_pre_engine_s == pytest.approx(0.004)  # 24 - 16 - 4
    assert r.legs_gap_s is not None and r.decode_pre_engine_s is not None
    assert r.decode_kv_wait_s is not None and r.hand_over_s is not None
    assert r.legs_gap_s + r.decode_pre_engine_s + r.decode_kv_wait_s == pytest.approx(r.hand_over_s)
    wd = d.windows()
    assert wd is not None
    assert r.hand_over_s * 1e9 == pytest.approx(wd.prefill_start_ns - p.end_ns)
    assert r.prefill_queue_s == pytest.approx(0.001)
    assert r.prefill_s == pytest.approx(0.020)
    assert r.prefill_pre_engine_s == pytest.approx(0.004)  # 25 - 20 - 1
    assert r.prefill_return_s == pytest.approx(0.003)  # first token at 25, end at 28
    assert r.decode_prompt_s == pytest.approx(0.016)
    assert r.decode_s == pytest.approx(0.055)
    assert r.ttft_s == pytest.approx(0.054)
    assert r.e2e_s == pytest.approx(0.112)
    parts = r.ttft_parts_s()
    assert sum(v for v in parts.values() if v is not None) == pytest.approx(r.ttft_s)
    assert r.hand_over_share == pytest.approx(10 / 54)
    d_ = r.to_dict()
    assert d_["hand_over_s"] == pytest.approx(0.010)
    assert d_["prefill_span"]["span_id"] == p.span_id
    assert d_["decode_span"]["completion_tokens"] == 16
    assert set(d_["ttft_parts_s"]) == set(parts)
    json.dumps(joined.to_dict())


def test_joined_by_router_id_roles_from_its_addresses() -> None:
    # Both legs 1 token (a client asking for 1 token): only the router's addresses tell.
    p, d = legs(
        f"cmpl-{ROUTER}-0", p_inst="127.0.0.1:8061", d_inst="http://127.0.0.1:8062/", decode_out=1
    )
    (r,) = join_legs([d, p]).records
    assert (r.joined_by, r.roles_from) == ("router_id", "router_id")
    assert (r.prefill_addr, r.decode_addr) == ("127.0.0.1:8061", "127.0.0.1:8062")
    assert r.prefill is p and r.decode is d
    # Another port that starts with the same digits is not the prefill instance.
    p2, d2 = legs(
        f"cmpl-{ROUTER}-0", p_inst="127.0.0.1:80612", d_inst="127.0.0.1:80622", decode_out=1
    )
    assert join_legs([p2, d2]).unknown_roles
    # Instances named otherwise (service.instance.id=prefill|decode): roles from the legs.
    p, d = legs(f"cmpl-{ROUTER}-0")
    (r,) = join_legs([p, d]).records
    assert (r.joined_by, r.roles_from, r.prefill_addr) == ("router_id", "legs", "127.0.0.1:8061")
    # ... and with both legs 1 token and unmatched addresses: unknown, the reason says why.
    p, d = legs(f"cmpl-{ROUTER}-0", decode_out=1)
    joined = join_legs([p, d])
    assert joined.records == ()
    (u,) = joined.unknown_roles
    assert u.by == "router_id" and "matching neither instance" in u.reason
    assert "--prefill-instance" in u.reason


def test_joined_by_trace() -> None:
    trace, parent = "ab" * 16, "cd" * 8
    # No shared id: the legs carry different ids (or none), one trace, one parent.
    p, d = legs("cmpl-leg-p-0", trace=trace, parent=parent, d_request_id="cmpl-leg-d-0")
    p2, d2 = legs(None, t0=T0 + 10**9, trace="ef" * 16, parent=parent)
    joined = join_legs([p, d, d2, p2])
    assert joined.unjoined == ()
    r1, r2 = joined.records
    assert (r1.joined_by, r1.key, r1.prefill, r1.decode) == ("trace", f"{trace}/{parent}", p, d)
    assert (r2.joined_by, r2.prefill, r2.decode) == ("trace", p2, d2)
    assert r1.hand_over_s == pytest.approx(0.010)


def test_roles_from_the_user() -> None:
    # Both legs look like a prefill leg: the user's names decide, one name is enough.
    p, d = legs("cmpl-x-0", p_inst="gpu-a", d_inst="gpu-b", decode_out=1)
    assert join_legs([p, d]).unknown_roles
    for roles in (
        {"gpu-a": "prefill", "gpu-b": "decode"},
        {"gpu-b": "decode"},
        {"gpu-a": "prefill"},
    ):
        (r,) = join_legs([d, p], roles).records
        assert (r.roles_from, r.prefill, r.decode) == ("user", p, d)
    # The user wins over the legs (here the names say the opposite of the tokens).
    p, d = legs("cmpl-y-0", p_inst="gpu-a", d_inst="gpu-b")
    (r,) = join_legs([p, d], {"gpu-a": "decode"}).records
    assert (r.roles_from, r.prefill, r.decode) == ("user", d, p)
    # Both legs on instances named prefill: not joined, said so.
    joined = join_legs([p, d], {"gpu-a": "prefill", "gpu-b": "prefill"})
    (u,) = joined.unknown_roles
    assert "both legs are on prefill instances" in u.reason
    # A name given for another instance leaves the legs to decide.
    (r,) = join_legs([p, d], {"elsewhere": "prefill"}).records
    assert r.roles_from == "legs"
    with pytest.raises(ValueError, match="prefill' or 'decode"):
        join_legs([p, d], {"gpu-a": "both"})


def test_unjoined_counted_and_named() -> None:
    p, d = legs("cmpl-ok-0")
    lone, _ = legs("cmpl-lone-0", t0=T0 + 10**9)
    # Three spans with one id and one trace: cannot be split.
    a, b = legs("cmpl-three-0", t0=T0 + 2 * 10**9, trace="11" * 16)
    c, _ = legs("cmpl-three-0", t0=T0 + 3 * 10**9, trace="11" * 16)
    # Two spans with one id, neither a prefill leg (a client re-using an id on a monolithic
    # instance).
    m1, _ = legs("cmpl-mono-0", t0=T0 + 4 * 10**9)
    m2, _ = legs("cmpl-mono-0", t0=T0 + 5 * 10**9)
    m1, m2 = (
        replace(m1, completion_tokens=16, decode_s=0.05),
        replace(m2, completion_tokens=16, decode_s=0.05),
    )
    nothing = replace(legs(None, t0=T0 + 6 * 10**9)[0], parent_span_id=None)
    spans = [p, d, lone, a, b, c, m1, m2, nothing]
    joined = join_legs(spans)
    assert [r.key for r in joined.records] == ["ok"]
    assert joined.counts() == {
        "joined_requests": 1,
        "single_leg_groups": 2,
        "single_leg_spans": 2,
        "more_than_two_groups": 1,
        "more_than_two_spans": 3,
        "unknown_roles_groups": 1,
        "unknown_roles_spans": 2,
    }
    singles = {u.key: u for u in joined.single_legs}
    assert set(singles) == {"lone", f"{nothing.trace_id}/-"}
    assert singles["lone"].request_ids == ("cmpl-lone-0",)
    assert singles["lone"].instances == ("prefill",)
    assert singles[f"{nothing.trace_id}/-"].by == "none"
    (three,) = joined.more_than_two
    assert three.key == "three" and three.span_ids == (a.span_id, b.span_id, c.span_id)
    (mono,) = joined.unknown_roles
    assert mono.key == "mono" and "neither has 1 output token" in mono.reason
    # Every span is accounted for.
    named = {s for u in joined.unjoined for s in u.span_ids} | {
        s.span_id for r in joined.records for s in (r.prefill, r.decode)
    }
    assert named == {s.span_id for s in spans}


def test_one_id_reused_is_split_by_trace() -> None:
    p1, d1 = legs("cmpl-same-0", trace="21" * 16, parent="1" * 16)
    p2, d2 = legs("cmpl-same-0", t0=T0 + 10**9, trace="22" * 16, parent="1" * 16)
    p3, _ = legs("cmpl-same-0", t0=T0 + 2 * 10**9, trace="23" * 16, parent="1" * 16)
    joined = join_legs([p1, d1, p2, d2, p3])
    assert [(r.prefill, r.decode) for r in joined.records] == [(p1, d1), (p2, d2)]
    assert all(r.joined_by == "request_id" for r in joined.records)
    (u,) = joined.single_legs
    assert u.span_ids == (p3.span_id,)


def test_missing_durations_give_none_not_errors() -> None:
    p, d = legs()
    p = replace(p, decode_s=None)  # a prefill leg without decode: still windows
    d = replace(d, ttft_s=None)
    r = pd_record("k", "request_id", "user", p, d)
    assert r.prefill_return_s == pytest.approx(0.003)
    assert r.hand_over_s is None and r.ttft_s is None
    assert r.legs_gap_s == pytest.approx(0.002)
    assert r.decode_kv_wait_s == pytest.approx(0.004)  # the span's own queue
    assert isinstance(join_legs([]), PdJoin) and join_legs([]).records == ()


# -- the CLI ---------------------------------------------------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _fill(path: Path) -> list[RequestSpan]:
    now = time.time_ns()
    old = legs("cmpl-old-0", t0=now - 3600 * 10**9)
    by_hand = legs("cmpl-hand-0", t0=now - 20 * 10**9, p_inst="gpu-a", d_inst="gpu-b", decode_out=1)
    router = legs(
        f"cmpl-{ROUTER}-0", t0=now - 10 * 10**9, p_inst="127.0.0.1:8061", d_inst="127.0.0.1:8062"
    )
    lone = legs("cmpl-lone-0", t0=now - 5 * 10**9)[1]
    spans = [*old, *by_hand, *router, lone]
    with Store(path) as store:
        store.add_spans(spans, [{} for _ in spans])
    return spans


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store.sqlite"
    _fill(path)
    code, out, _ = _cli(["spans", "pd", "--store", str(path), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["spans"] == 7
    assert doc["counts"]["joined_requests"] == 2
    assert doc["counts"]["single_leg_spans"] == 1
    assert doc["counts"]["unknown_roles_groups"] == 1  # by hand, both legs 1 token
    keys = [r["key"] for r in doc["requests"]]
    assert keys == ["old", ROUTER]
    router = doc["requests"][1]
    assert router["joined_by"] == "router_id" and router["roles_from"] == "router_id"
    assert router["hand_over_s"] == pytest.approx(0.010, abs=1e-6)
    assert router["ttft_s"] == pytest.approx(0.054, abs=1e-6)
    assert router["prefill_span"]["instance"] == "127.0.0.1:8061"
    assert {u["key"] for u in doc["unjoined"]} == {"hand", "lone"}
    # The user's names join the by-hand request; --since leaves the old one out.
    code, out, _ = _cli(
        [
            "spans",
            "pd",
            "--store",
            str(path),
            "--json",
            "--since",
            "600",
            "--prefill-instance",
            "gpu-a",
            "--decode-instance",
            "gpu-b",
        ],
        capsys,
    )
    doc = json.loads(out)
    assert doc["spans"] == 5 and doc["roles"] == {"gpu-a": "prefill", "gpu-b": "decode"}
    assert [(r["key"], r["roles_from"]) for r in doc["requests"]] == [
        ("hand", "user"),
        (ROUTER, "router_id"),
    ]
    assert doc["counts"]["unknown_roles_groups"] == 0
    assert [u["key"] for u in doc["unjoined"]] == ["lone"]


def test_cli_table_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store.sqlite"
    _fill(path)
    code, out, _ = _cli(["spans", "pd", "--store", str(path)], capsys)
    assert code == 0
    assert "2 of 2 P/D request(s), from 7 span(s)" in out
    assert "hand-over" in out and "not joined:" in out
    assert "1 single legs" in out and "1 legs whose roles cannot be told" in out
    assert "lone" in out and "hand" in out
    code, _, err = _cli(
        ["spans", "pd", "--store", str(path), "--prefill-instance", "x", "--decode-instance", "x"],
        capsys,
    )
    assert code == 2 and "both prefill and decode: x" in err
    code, out, _ = _cli(["spans", "pd", "--store", str(path), "--since", "1"], capsys)
    assert code == 0 and "no request spans" in out
    code, _, err = _cli(["spans", "pd", "--store", str(tmp_path / "none.sqlite")], capsys)
    assert code == 2 and "no experiment store" in err
