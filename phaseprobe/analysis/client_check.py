"""Is a run's client timeline consistent with the server's own phases? (pure; no I/O)

The client cannot see a token before the server produced it, and it cannot see tokens
*faster* than the server produced them. When it does (a first token far later than the
server's TTFT, then the rest of the answer at once), the client's stamps measure when a
stalled client (or a buffering hop) got round to reading, not the server: such a run is kept
and shown, but left out of medians and A/B statistics, like a run that was not alone on the
server.

Every threshold is relative to the server's own numbers for the same request:

* **burst** — the client's first-to-last-token window (its TPOT) is below
  :data:`TPOT_SHARE` of the server's decode time (decode per token);
* **bunched gaps** — the median inter-token gap is below :data:`ITL_SHARE` of the server's
  decode per token: most tokens arrived together, not paced by decode steps;
* **late first token** — client TTFT more than :data:`TTFT_FACTOR` times the server's TTFT
  (and later than :data:`TTFT_MIN_STEPS` decode steps). Over a network this can be plain
  latency, so it counts alone only when there is no hop (127.0.0.1) or the client's own stall
  (StallWatch) explains it.

The verdict says who held the tokens back: ``client`` when this process was unscheduled for at
least :data:`STALL_SHARE` of the delay, else ``api_server`` on a loopback endpoint (there is no
proxy between them), else ``hop`` (a proxy, the network, or the API server).
"""

from __future__ import annotations

import ipaddress

from phaseprobe.endpoint_url import host_of
from phaseprobe.format import duration as _ms
from phaseprobe.records import ClientCheck, ClientTimeline, Isolation, Run, ServerPhases

__all__ = [
    "TPOT_SHARE",
    "ITL_SHARE",
    "TTFT_FACTOR",
    "TTFT_MIN_STEPS",
    "STALL_SHARE",
    "MIN_GAPS",
    "check_client",
    "client_verdict",
    "client_consistent",
    "has_hop",
    "cause_advice",
]

TPOT_SHARE = 0.5  # client TPOT below this share of the server's decode per token: a burst
ITL_SHARE = 0.1  # median gap below this share of a decode step: gaps are bunched
TTFT_FACTOR = 2.0  # client TTFT above this multiple of the server's: first token held back
TTFT_MIN_STEPS = 2.0  # ... and later by more than this many of the server's decode steps
STALL_SHARE = 0.5  # a client stall this share of the delay explains the delay
MIN_GAPS = 4  # fewer inter-token gaps: no median gap worth judging

_NOT_CHECKED = ClientCheck(checked=False, consistent=True)


def has_hop(endpoint: str | None) -> bool | None:
    """False when the endpoint is this machine (loopback: no proxy or network between client
    and server), True for any other host, None when unknown."""
    if not endpoint:
        return None
    host = host_of(endpoint)  # None for a stored endpoint that is no URL ("[oops]" as a host)
    if host is None:
        return None
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def check_client(
    client: ClientTimeline | None,
    server: ServerPhases | None,
    isolation: Isolation,
    *,
    hop: bool | None = None,
) -> ClientCheck:
    """Judge one run's client timeline against its server phases (see the module docstring).

    Checked only when the server numbers are this request's own: the run was verified alone
    on the server. ``hop``: :func:`has_hop` of the endpoint (None: unknown).
    """
    if client is None or server is None or not (isolation.verified and isolation.isolated):
        return _NOT_CHECKED
    c_ttft, s_ttft = client.ttft_s, server.ttft_s
    n = client.completion_tokens
    if c_ttft is None:
        return _NOT_CHECKED
    step = (
        server.decode_s / (n - 1)
        if server.decode_s is not None and n is not None and n >= 2 and server.decode_s > 0
        else None
    )  # server decode per token
    reasons: list[str] = []
    delay = 0.0  # how late the client saw what the server had produced
    burst = False
    tpot = client.tpot_s
    if step is not None and tpot is not None and tpot < TPOT_SHARE * step:
        burst = True
        delay = max(delay, (step - tpot) * (n - 1))  # type: ignore[operator]
        reasons.append(
            f"client TPOT {_ms(tpot)} is {tpot / step:.0%} of the server's decode "
            f"per token {_ms(step)} (decode {_ms(server.decode_s or 0.0)} over "
            f"{n} tokens): the tokens arrived in a burst"
        )
    gaps = client.itl_s
    if step is not None and len(gaps) >= MIN_GAPS:
        p50 = _median(gaps)
        if p50 < ITL_SHARE * step:
            burst = True
            delay = max(delay, max(gaps) - step)  # the hold that bunched the tokens after it
            reasons.append(
                f"ITL p50 {_ms(p50)} is under {ITL_SHARE:.0%} of the server's decode "
                f"per token {_ms(step)}: tokens were delivered bunched together"
            )
    stall = client.client_stall_s
    if s_ttft is not None and s_ttft > 0 and c_ttft > TTFT_FACTOR * s_ttft:
        excess = c_ttft - s_ttft
        explained = stall is not None and stall >= STALL_SHARE * excess
        # Over a network a late first token alone can be real latency: it counts alone only
        # without a hop or when the client's own stall explains it.
        beyond_steps = step is None or excess > TTFT_MIN_STEPS * step
        if burst or (beyond_steps and (hop is False or explained)):
            delay = max(delay, excess)
            reasons.insert(
                0,
                f"client TTFT {_ms(c_ttft)} vs server TTFT {_ms(s_ttft)} "
                f"({c_ttft / s_ttft:.1f}x): the first token was held back "
                f"{_ms(excess)}",
            )
    if not reasons:
        return ClientCheck(checked=True, consistent=True)
    if stall is not None and stall >= STALL_SHARE * delay:
        cause: str | None = "client"
        reasons.append(
            f"this client process was unscheduled for up to {_ms(stall)}: "
            + (
                # one loaded machine starves the API server as much as the client (seen: a
                # separate plain client got the same bursts from a local vLLM at load 6)
                "this machine is loaded, and the endpoint is on it too: its API server is held "
                "up alike, not the engine"
                if hop is False
                else "a loaded client machine, not the server"
            )
        )
    else:
        on_time = (
            ""
            if stall is None
            else f"; the client was scheduled on time (longest stall {_ms(stall)})"
        )
        if hop is False:
            cause = "api_server"
            reasons.append(
                "held back by a stalled API server or client: the endpoint is on "
                "this machine, with no proxy or network in between" + on_time
            )
        else:
            cause = "hop" if hop else None
            reasons.append(
                "held back between the engine and this client: a buffering proxy, "
                "the network, or a stalled API server" + on_time
            )
    return ClientCheck(checked=True, consistent=False, reasons=tuple(reasons), cause=cause)


def client_verdict(run: Run, hop: bool | None = None) -> ClientCheck:
    """The run's stored verdict, or (older stores, runs built by hand) judged now; ``hop``:
    :func:`has_hop` of its endpoint when the caller knows it."""
    if run.client_check is not None:
        return run.client_check
    return check_client(run.client, run.server, run.isolation, hop=hop)


def client_consistent(run: Run) -> bool:
    """False only for a run whose client timeline contradicts its server phases."""
    return client_verdict(run).consistent


def cause_advice(cause: str | None, hop: bool | None) -> str:
    """What to do about late or bunched deliveries, by who held the tokens back."""
    if cause == "client":
        return (
            "the client machine was starved (other work on its CPUs, e.g. the server on "
            "the same cores): its stamps are late, not the server; probe again from an "
            "idle client before tuning the server"
        )
    if cause == "api_server" or hop is False:
        return (
            "client and server share this machine, so no proxy or network is involved: "
            "the client process or vLLM's API server process was slow to read or send "
            "(CPU contention); give them cores of their own (fewer server threads, taskset) "
            "and probe again"
        )
    return (
        "the time is spent between client and engine: a buffering proxy (nginx "
        "proxy_buffering off; X-Accel-Buffering: no), network round trips, TLS, or an "
        "overloaded API server process; probe from a host next to the server to split "
        "network from server"
    )
