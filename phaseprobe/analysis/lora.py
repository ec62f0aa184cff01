"""LoRA adapters: which adapter each run asked for, the phases per adapter, and what loading
one costs.

vLLM serves each adapter under its own name (``--lora-modules NAME=PATH``), listed by
``/v1/models`` with ``parent`` = the base model; a request picks one by its ``model``. vLLM's
metrics never carry the adapter: every histogram and counter of an adapter's request is
labelled with the base model's ``model_name`` (:func:`metrics_model`). vLLM 0.32 exports one
LoRA series, the gauge ``vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}``, whose value is the time (Unix seconds) that label set was last seen;
the newest is the engine's state now (:func:`lora_state`). Read its labels with care: 0.32
fills both from one set (every adapter with a request the frontend tracks, counts dropped), so
they are always equal, and a request deferred for want of an adapter slot is not tracked until
it is scheduled (its QUEUED event comes with its first output). The gauge gives ``max_lora``
and the adapters in flight, never the adapters waiting for a slot; those requests are counted
by ``vllm:num_requests_waiting_by_reason{reason="deferred"}`` (with other transient waits: KV
transfers, blocked requests). Nothing about loading time or residency is exported (vLLM#45325
and RFC #6275 propose it), so the cost of a load is measured from the runs themselves.

A run **loads** its adapter when that adapter was not among the ``max_lora`` adapters most
recently asked for before it (an adapter batch slot is held by the last adapters used; with
vLLM's default ``--max-cpu-loras`` = ``--max-loras`` an evicted adapter is read from disk again).
It is **warm** when it was. Phaseprobe knows only its own requests (warm-ups included): other
traffic between runs can evict or load adapters unseen (:func:`load_kind`).

The cost (:class:`SwapCost`): the loads' TTFT (client) and server prefill against the warm
runs', medians with a bootstrap interval of their ratio and a Mann-Whitney test
(:func:`phaseprobe.analysis.ab.stats.compare_samples`); fewer than 5 runs on a side is
"too thin", never a conclusion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from phaseprobe.analysis.ab.stats import MetricComparison, compare_samples
from phaseprobe.analysis.lora_gauge import LORA_INFO, LoraState, LoraWindow, lora_state, lora_window
from phaseprobe.analysis.phases import summarize
from phaseprobe.errors import ConfigError
from phaseprobe.records import AdapterUse, Run

__all__ = [
    "LORA_INFO",
    "MIN_RUNS",
    "MIN_EFFECT",
    "UnknownAdapter",
    "LoraState",
    "LoraWindow",
    "lora_window",
    "AdapterPhases",
    "SwapCost",
    "LoraReport",
    "served_adapters",
    "metrics_model",
    "check_adapters",
    "lora_state",
    "schedule",
    "adapter_use",
    "load_kind",
    "lora_report",
]

MIN_RUNS = 5  # loads and warm runs each: below it the comparison is too thin to conclude
MIN_EFFECT = 0.10  # a load slower than warm runs by less than this is not called a cost

LoadKind = Literal["load", "warm"]


class UnknownAdapter(ConfigError):
    """A LoRA adapter the server does not serve; names the ones it does."""

    def __init__(self, names: Sequence[str], served: Mapping[str, str | None], where: str) -> None:
        self.names = tuple(names)
        self.served = dict(served)
        listed = (
            ", ".join(served) if served else "none: start vLLM with --enable-lora --lora-modules"
        )
        super().__init__(
            f"LoRA adapter{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))} "
            f"not served at {where} (its adapters: {listed})"
        )


def served_adapters(models: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """``/v1/models`` entries that are LoRA adapters (they name a ``parent``): name → base."""
    return {
        str(m["id"]): str(m["parent"])
        for m in models
        if isinstance(m, Mapping) and "id" in m and m.get("parent")
    }


def metrics_model(model: str, models: Sequence[Mapping[str, Any]]) -> str:
    """The ``model_name`` label vLLM puts on the metrics of a request for ``model``: its base
    model when ``model`` is an adapter, else ``model`` itself."""
    return served_adapters(models).get(model) or model


def check_adapters(
    names: Sequence[str], models: Sequence[Mapping[str, Any]], where: str
) -> dict[str, str | None]:
    """``names`` → base model, each an adapter the server serves; :class:`UnknownAdapter`
    (naming the served ones) for any other, and a ConfigError for adapters of two bases."""
    served = served_adapters(models)
    unknown = [n for n in names if n not in served]
    if unknown:
        raise UnknownAdapter(unknown, served, where)
    bases = {served[n] for n in names}
    if len(bases) > 1:
        raise ConfigError(f"the adapters {', '.join(names)} have different base models")
    return {n: served[n] for n in names}


def schedule(adapters: Sequence[str], block: int, n: int) -> list[str]:
    """The adapter of each of ``n`` requests: ``block`` in a row of each, cycling (block 2
    over a, b, c: a a b b c c a a …), so with fewer slots than adapters the first of each
    block loads its adapter and the others find it warm."""
    if not adapters or block < 1:
        raise ConfigError("an adapter cycle needs at least one adapter and a block of 1 or more")
    return [adapters[(i // block) % len(adapters)] for i in range(n)]


def adapter_use(
    name: str, base: str | None, previous: Sequence[str], max_lora: int | None
) -> AdapterUse:
    """The run's :class:`AdapterUse`, from the models phaseprobe asked for before it (oldest
    first, base-model requests included: they are dropped here)."""
    recent: list[str] = []
    for m in reversed(previous):
        if m != base and m not in recent:
            recent.append(m)
    return AdapterUse(name=name, base=base, max_loras=max_lora, recent=tuple(recent[:16]))


def load_kind(use: AdapterUse) -> LoadKind | None:
    """Did the run have to load its adapter (``load``) or find it in a slot (``warm``)? None:
    vLLM did not say its ``max_lora``."""
    if use.max_loras is None or use.max_loras < 1:
        return None
    return "warm" if use.name in use.recent[: use.max_loras] else "load"


@dataclass(frozen=True)
class AdapterPhases:
    """One adapter's medians (s) over its runs (:func:`phaseprobe.analysis.phases.summarize`)."""

    adapter: str  # "" for the base model
    runs: int
    clean: int  # runs the medians are over
    loads: int
    ttft_s: float | None
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    e2e_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """For --json (client medians over the clean runs, server ones over runs alone)."""
        return {
            "adapter": self.adapter or None,
            "runs": self.runs,
            "clean_runs": self.clean,
            "loads": self.loads,
            "client_ttft_s": self.ttft_s,
            "server_queue_s": self.queue_s,
            "server_prefill_s": self.prefill_s,
            "server_decode_s": self.decode_s,
            "client_e2e_s": self.e2e_s,
        }


@dataclass(frozen=True)
class SwapCost:
    """Loads against warm runs on one measure (B = loads, A = warm)."""

    measure: str  # "client_ttft_s" | "server_prefill_s"
    comparison: MetricComparison

    @property
    def thin(self) -> bool:
        """Too few loads or warm runs to conclude anything (fewer than :data:`MIN_RUNS`)."""
        c = self.comparison
        return c.n_a < MIN_RUNS or c.n_b < MIN_RUNS or c.verdict == "insufficient data"

    @property
    def extra_s(self) -> float | None:
        """Median of loads − median of warm runs (s)."""
        c = self.comparison
        return None if c.median_a is None or c.median_b is None else c.median_b - c.median_a

    @property
    def costs(self) -> bool:
        """A load is measurably slower by at least :data:`MIN_EFFECT` (never when thin)."""
        return not self.thin and self.comparison.verdict == "regression"

    def text(self) -> str:
        """One sentence with the medians, the interval and p, and what they say."""
        c = self.comparison
        name = "TTFT" if self.measure == "client_ttft_s" else "server prefill"
        if c.median_a is None or c.median_b is None:
            return f"{name}: {c.n_b} load(s), {c.n_a} warm run(s): nothing to compare"
        head = (
            f"{name} median {c.median_b * 1e3:.1f} ms over {c.n_b} load(s) vs "
            f"{c.median_a * 1e3:.1f} ms over {c.n_a} warm run(s)"
        )
        if self.thin:
            return head + f": too thin to conclude (at least {MIN_RUNS} of each)"
        extra = self.extra_s or 0.0
        ci = (
            f", ratio {c.ratio:.2f} (95 % CI {c.ci_low:.2f}–{c.ci_high:.2f}), p = {c.p_value:.3g}"
            if c.ratio is not None
            and c.ci_low is not None
            and c.ci_high is not None
            and c.p_value is not None
            else ""
        )
        verdict = (
            "a load costs it"
            if self.costs
            else "no measurable load cost"
            if c.verdict != "improvement"
            else "loads were faster (not a load cost)"
        )
        return head + f" ({extra * 1e3:+.1f} ms{ci}): {verdict}"

    def to_dict(self) -> dict[str, Any]:
        """For --json and the check rule's numbers."""
        c = self.comparison
        return {
            "loads": c.n_b,
            "warm": c.n_a,
            "load_median_s": c.median_b,
            "warm_median_s": c.median_a,
            "extra_s": self.extra_s,
            "ratio": c.ratio,
            "ratio_ci": [c.ci_low, c.ci_high] if c.ci_low is not None else None,
            "p_value": c.p_value,
            "verdict": "too thin" if self.thin else c.verdict,
            "load_costs": self.costs,
        }


@dataclass(frozen=True)
class LoraReport:
    """An experiment's adapters: phases per adapter, loads, and what a load costs."""

    adapters: tuple[AdapterPhases, ...]
    max_loras: int | None
    loads: int
    warm: int
    unknown: int  # adapter runs whose load could not be told (no max_lora)
    ttft: SwapCost | None
    prefill: SwapCost | None

    @property
    def used(self) -> bool:
        """Some run asked for a LoRA adapter."""
        return any(a.adapter for a in self.adapters)

    def to_dict(self) -> dict[str, Any]:
        """For probe --json (``{"used": false}`` without adapters)."""
        if not self.used:
            return {"used": False}
        return {
            "used": True,
            "source": "client TTFT and server deltas of this probe's runs",
            "max_loras": self.max_loras,
            "loads": self.loads,
            "warm": self.warm,
            "load_unknown": self.unknown,
            "by_adapter": [a.to_dict() for a in self.adapters],
            "load_cost_ttft": self.ttft.to_dict() if self.ttft else None,
            "load_cost_prefill": self.prefill.to_dict() if self.prefill else None,
        }

    def lines(self) -> list[str]:
        """What to print under the probe table."""
        if not self.used:
            return []
        out = [
            f"LoRA: {len([a for a in self.adapters if a.adapter])} adapter(s), max_loras "
            f"{self.max_loras if self.max_loras is not None else 'not exported'}; "
            f"{self.loads} run(s) loaded their adapter, {self.warm} found it warm"
            + (f", {self.unknown} unknown" if self.unknown else "")
        ]
        for a in self.adapters:
            out.append(
                f"  {a.adapter or '(base model)'}: {a.runs} run(s), {a.loads} load(s); median "
                f"TTFT {_ms(a.ttft_s)} · queue {_ms(a.queue_s)} · prefill {_ms(a.prefill_s)} · "
                f"decode {_ms(a.decode_s)} · e2e {_ms(a.e2e_s)} ms"
            )
        for cost in (self.ttft, self.prefill):
            if cost is not None:
                out.append(f"load cost: {cost.text()}")
        return out


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.1f}"


def _phases(name: str, runs: Sequence[Run]) -> AdapterPhases:
    s = summarize(runs)
    loads = sum(1 for r in runs if r.adapter is not None and load_kind(r.adapter) == "load")
    return AdapterPhases(
        adapter=name,
        runs=len(runs),
        clean=s.n_clean,
        loads=loads,
        ttft_s=s.client_ttft_s,
        queue_s=s.server_queue_s,
        prefill_s=s.server_prefill_s,
        decode_s=s.server_decode_s,
        e2e_s=s.client_e2e_s,
    )


def _value(run: Run, measure: str) -> float | None:
    if measure == "client_ttft_s":
        return run.client.ttft_s if run.client is not None else None
    return run.server.prefill_s if run.server is not None and run.attributed else None


def lora_report(runs: Sequence[Run]) -> LoraReport:
    """Phases per adapter and the cost of a load over an experiment's runs (ok runs only:
    a failed or shared run's timings are not a load's)."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.adapter.name if r.adapter else "", []).append(r)
    phases = tuple(_phases(name, rs) for name, rs in groups.items())
    ok = [r for r in runs if r.status == "ok" and r.adapter is not None]
    kinds = [(r, load_kind(r.adapter)) for r in ok if r.adapter is not None]
    loads = [r for r, k in kinds if k == "load"]
    warm = [r for r, k in kinds if k == "warm"]
    maxes = {r.adapter.max_loras for r in ok if r.adapter and r.adapter.max_loras is not None}

    def cost(measure: str) -> SwapCost | None:
        if not loads and not warm:
            return None
        a = [v for r in warm if (v := _value(r, measure)) is not None]
        b = [v for r in loads if (v := _value(r, measure)) is not None]
        return SwapCost(
            measure, compare_samples(a, b, metric=measure, label=measure, min_effect=MIN_EFFECT)
        )

    return LoraReport(
        adapters=phases,
        max_loras=max(maxes) if maxes else None,
        loads=len(loads),
        warm=len(warm),
        unknown=sum(1 for _, k in kinds if k is None),
        ttft=cost("client_ttft_s"),
        prefill=cost("server_prefill_s"),
    )
