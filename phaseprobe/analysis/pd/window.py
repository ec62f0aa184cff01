"""A prefill/decode instance's KV path over a window of live traffic: what ``watch`` and
``check --live`` report per instance.

Pure: one :class:`~phaseprobe.analysis.replica_window.ReplicaWindow` in (``/metrics``
scraped twice, or PromQL), a :class:`KvPathWindow` out. Per instance: the NIXL connector's
failed transfers, failed notifications, expired KV (counted on the prefill side) and transfer
time p99; the decode side's KV wait p99; and a decode instance's recompute share
(``prompt_tokens_by_source``: local_compute / (local_compute + external_kv_transfer)). A
series the server does not export is said to be "not exported", never shown as 0: the CPU
build with the ExampleConnector exports no ``nixl_*`` at all.

**The decode-side KV wait on vLLM 0.32.** No series measures it as such: there is no
per-request KV-wait histogram, and ``nixl_xfer_time_seconds`` times each rank-level transfer,
pooled, not the request's wait. Where it is booked depends on the connector:

- an asynchronous connector (NIXL) parks the request in WAITING_FOR_REMOTE_KVS until its KV has
  arrived and only then schedules it, so the wait is inside the decode instance's
  ``request_queue_time_seconds``. That histogram's p99 is the KV wait's p99 when no request
  waited for capacity in the window (``num_requests_waiting_by_reason{reason="capacity"}``
  stayed 0 in every sample), and an upper bound otherwise;
- a synchronous connector (the ExampleConnector: ``get_num_new_matched_tokens`` returns
  ``load_kv_async=False``) loads the KV inside the decode side's prefill step, so it is in
  ``request_prefill_time_seconds``, not the queue (measured on the CPU pair,
  research/fleet_pd.md). Without ``nixl_*`` series phaseprobe cannot tell which kind of
  connector runs, so it quotes both p99s and names neither as the KV wait.

Percentiles come from bucket increases (:mod:`phaseprobe.analysis.bucket_quantile`): a p99 in
vLLM's first queue bucket (0.3 s) is an upper bound, said as "≤ 300 ms".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis.bucket_quantile import BucketQuantile
from phaseprobe.analysis.replica_window import NIXL_COUNTERS, ReplicaWindow

__all__ = ["KvPathWindow", "kv_path_window", "pd_role", "PREFILL_ROLE_MAX_TOKENS", "NOT_EXPORTED"]

PREFILL_ROLE_MAX_TOKENS = 1.5  # generated tokens per finished request: a prefill instance
NOT_EXPORTED = "not exported"
_NO_NIXL = "no nixl_* series: not the NIXL connector"


def pd_role(r: ReplicaWindow) -> tuple[str | None, str]:
    """("prefill" | "decode" | None, why) for one instance over the window. A prefill instance
    generates ~1 token per request (the P/D proxy asks it for one); a decode instance is one
    whose KV connector looked prompts up and that generated more."""
    done, gen = r.finished, r.delta("generation_tokens")
    if done is not None and done >= 1 and gen is not None and gen / done <= PREFILL_ROLE_MAX_TOKENS:
        return "prefill", f"{gen / done:.1f} tokens generated per request"
    lookups = r.delta("external_prefix_cache_queries")
    if lookups:
        return "decode", f"its KV connector looked up {lookups:.0f} prompt tokens"
    if done is not None and done < 1:
        return None, "no request finished in the window"
    return None, "no KV-connector lookups in the window (not a P/D instance?)"


@dataclass(frozen=True)
class KvPathWindow:
    """One instance's KV path over the window (see the module docstring). Counters are None
    when not exported; ``kv_wait_s`` is None when it cannot be measured, ``kv_wait_text``
    says what was measured instead and why."""

    name: str
    role: str | None
    role_why: str
    failed_transfers: float | None
    failed_notifications: float | None
    kv_expired: float | None
    xfer_p99: BucketQuantile | None
    xfer_exported: bool
    kv_wait_s: float | None
    kv_wait_bound: str | None  # None: the p99 itself; "upper": at most; "lower": above
    kv_wait_text: str
    transferred: float | None
    computed: float | None
    cached: float | None
    finished: float | None

    @property
    def nixl(self) -> bool:
        """Does the instance export the NIXL connector's series?"""
        return self.xfer_exported or any(
            v is not None
            for v in (self.failed_transfers, self.failed_notifications, self.kv_expired)
        )

    @property
    def recompute_share(self) -> float | None:
        """local_compute / (local_compute + external_kv_transfer); None on any instance not
        known to be a decode instance (a prefill or an aggregated server computes its prompts:
        that is no recompute), when not exported, or when no prompt token was counted."""
        if self.role != "decode" or self.transferred is None or self.computed is None:
            return None
        total = self.transferred + self.computed
        return self.computed / total if total > 0 else None

    def _count(self, value: float | None) -> str:
        return NOT_EXPORTED if value is None else f"{value:.0f}"

    @property
    def parts(self) -> list[str]:
        """The report's phrases, in order (the line is them joined)."""
        nixl = "" if self.nixl else f" ({_NO_NIXL})"
        out = [
            f"{self.role or 'role unknown'} ({self.role_why})",
            f"failed transfers {self._count(self.failed_transfers)}, failed "
            f"notifications {self._count(self.failed_notifications)}, expired KV "
            f"{self._count(self.kv_expired)}{nixl}",
        ]
        if not self.xfer_exported:
            out.append(f"transfer time p99 {NOT_EXPORTED}")
        elif self.xfer_p99 is None:
            out.append("transfer time p99: no transfer in the window")
        else:
            out.append(
                f"transfer time {self.xfer_p99.text} over "
                f"{self.xfer_p99.observations:.0f} transfers"
            )
        out.append(f"KV wait {self.kv_wait_text}")
        share = self.recompute_share
        if self.role == "prefill":
            out.append("recompute share: n/a (a prefill instance computes every prompt)")
        elif self.role != "decode":
            out.append("recompute share: n/a (not a decode instance)")
        elif self.transferred is None or self.computed is None:
            out.append(f"recompute share {NOT_EXPORTED} (no prompt_tokens_by_source)")
        elif share is None:
            out.append("recompute share: no prompt token counted in the window")
        else:
            out.append(
                f"recompute share {share * 100:.1f} % (computed {self.computed:.0f} of "
                f"{self.computed + self.transferred:.0f} prompt tokens, "
                f"{self.transferred:.0f} transferred)"
            )
        return out

    @property
    def text(self) -> str:
        """The report's line: :attr:`parts` joined by semicolons."""
        return "; ".join(self.parts)

    def to_dict(self) -> dict[str, Any]:
        """The instance's KV path as a JSON-ready dict (times in s, tokens as counts, the
        recompute share a fraction)."""
        return {
            "name": self.name,
            "role": self.role,
            "role_why": self.role_why,
            "nixl_exported": self.nixl,
            "failed_transfers": self.failed_transfers,
            "failed_notifications": self.failed_notifications,
            "kv_expired": self.kv_expired,
            "xfer_time_p99": self.xfer_p99.to_dict() if self.xfer_p99 else None,
            "kv_wait_p99_s": self.kv_wait_s,
            "kv_wait_bound": self.kv_wait_bound,
            "kv_wait": self.kv_wait_text,
            "transferred": self.transferred,
            "computed": self.computed,
            "cached": self.cached,
            "recompute_share": self.recompute_share,
            "finished": self.finished,
            "text": self.text,
        }


def _kv_wait(
    r: ReplicaWindow, role: str | None, nixl: bool
) -> tuple[float | None, str | None, str]:
    """(the KV wait p99 or its bound, the bound's kind, the words) for one instance."""
    if role != "decode":
        return None, None, "p99: n/a (not a decode instance)"
    queue, prefill = r.quantile("queue_time"), r.quantile("prefill_time")
    if not nixl:
        said = (
            f"p99 {NOT_EXPORTED} (vLLM 0.32 has no KV-wait series and, with {_NO_NIXL}, "
            "whether the connector waits in the queue or loads inside prefill cannot be "
            "told): decode-side queue "
            + (queue.text if queue else "not measured")
            + ", prefill "
            + (prefill.text if prefill else "not measured")
            + " (a synchronous connector such as the ExampleConnector loads the KV "
            "there)"
        )
        return None, None, said
    if queue is None:
        return None, None, "p99: the decode instance's queue-time histogram did not move"
    capacity = r.gauge_max.get("waiting_capacity")
    if capacity is not None and capacity <= 0:
        return (
            queue.value_s,
            queue.bound,
            (
                f"{queue.text} (NIXL books it as queue time; no request waited for capacity in "
                f"{r.samples} samples, so the queue is the KV wait)"
            ),
        )
    why = (
        f"up to {capacity:.0f} requests waited for capacity"
        if capacity is not None
        else "num_requests_waiting_by_reason is not exported: capacity waiting cannot be told apart"
    )
    return (
        queue.value_s,
        "upper",
        (
            f"at most the decode queue's {queue.text} (the queue "
            f"holds the KV wait and capacity queueing; {why})"
        ),
    )


def kv_path_window(r: ReplicaWindow) -> KvPathWindow:
    """One instance's KV path over the window (see the module docstring)."""
    role, why = pd_role(r)
    counts = {key: r.delta(key) for key in NIXL_COUNTERS}
    xfer_exported = r.delta("nixl_xfer_time_count") is not None
    nixl = xfer_exported or any(v is not None for v in counts.values())
    wait, bound, wait_text = _kv_wait(r, role, nixl)
    return KvPathWindow(
        r.name,
        role,
        why,
        counts["nixl_failed_transfers"],
        counts["nixl_failed_notifications"],
        counts["nixl_kv_expired"],
        r.quantile("nixl_xfer_time") if xfer_exported else None,
        xfer_exported,
        wait,
        bound,
        wait_text,
        r.delta("prompt_source_external_kv_transfer"),
        r.delta("prompt_source_local_compute"),
        r.delta("prompt_source_local_cache_hit"),
        r.finished,
    )
