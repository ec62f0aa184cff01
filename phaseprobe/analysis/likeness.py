"""Like with like: may two experiments be compared, and does a file belong to an experiment?
(pure; no I/O)

:func:`unlike_fields` lists what makes two experiments incomparable: a different model,
prompt or output shape, api, or measurement kind (an isolated probe against a batch of
concurrent streams). What an A/B or a before/after comparison *varies on purpose* (the
server's flags, its GPU count) is not compared. An empty list: like with like.

:func:`evidence_mismatches` says why an evidence file (an NCCL log summary, a trace's
metadata) cannot come from the experiment it was given with: its time span misses the
experiment's window, it names another host, another tensor-parallel size, another vLLM or
model. Each reason quotes both sides. A fact missing on either side is not held against the
file (it cannot be checked), so an empty list means "nothing contradicts it".
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from phaseprobe.records import Experiment, Run

__all__ = [
    "MEASUREMENT_KINDS",
    "measurement_kind",
    "unlike_fields",
    "ExperimentFacts",
    "evidence_mismatches",
    "facts_from",
    "WINDOW_SLACK_S",
    "PROMPT_TOLERANCE",
]

# Experiment kinds that measure the same thing: one request alone on the server at a time.
MEASUREMENT_KINDS: dict[str, str] = {
    "probe": "isolated requests",
    "ab-arm": "isolated requests",
    "prefix": "prefix-cache cold/warm pairs",
    "batch": "concurrent streams",
    "interfere": "interference pairs",
}
PROMPT_TOLERANCE = 0.05  # measured prompt lengths within 5 % are the same shape
WINDOW_SLACK_S = 60.0  # clocks of client and server hosts may differ by this much


def measurement_kind(kind: str) -> str:
    """What an experiment of ``kind`` measures, in words (``probe`` → "isolated requests");
    a kind not in :data:`MEASUREMENT_KINDS` as it is."""
    return MEASUREMENT_KINDS.get(kind, kind)


def _prompt_tokens(runs: Sequence[Run] | None) -> float | None:
    vals = [
        r.client.prompt_tokens
        for r in runs or ()
        if r.client is not None and r.client.prompt_tokens is not None
    ]
    return float(statistics.median(vals)) if vals else None


def unlike_fields(
    exp_a: Experiment,
    exp_b: Experiment,
    runs_a: Sequence[Run] | None = None,
    runs_b: Sequence[Run] | None = None,
) -> list[str]:
    """What differs between two experiments that should not for a comparison, each as
    ``"what: A vs B"``; empty when they are like with like.

    Compared: model, api, measurement kind, output shape (max_tokens, ignore_eos) and prompt
    shape: the requested prompt length, or the prompt text, and, when the runs are given, the
    prompt tokens the server counted (median, within :data:`PROMPT_TOLERANCE`).
    """
    a, b = exp_a.spec, exp_b.spec
    out: list[str] = []
    if a.model != b.model:
        out.append(f"model: {a.model} vs {b.model}")
    if a.api != b.api:
        out.append(f"api: {a.api} vs {b.api}")
    ka, kb = measurement_kind(exp_a.kind), measurement_kind(exp_b.kind)
    if ka != kb:
        out.append(f"measurement kind: {exp_a.kind} ({ka}) vs {exp_b.kind} ({kb})")
    if a.max_tokens != b.max_tokens:
        out.append(f"output tokens (max_tokens): {a.max_tokens} vs {b.max_tokens}")
    if a.ignore_eos != b.ignore_eos:
        out.append(f"ignore_eos: {a.ignore_eos} vs {b.ignore_eos} (output length fixed or free)")
    ta, tb = _prompt_tokens(runs_a), _prompt_tokens(runs_b)
    if ta is not None and tb is not None:
        if abs(ta - tb) > PROMPT_TOLERANCE * max(ta, tb):
            out.append(f"prompt tokens: {ta:g} vs {tb:g}")
    elif a.prompt_tokens_target != b.prompt_tokens_target:
        out.append(
            f"prompt tokens asked: {a.prompt_tokens_target or 'fixed text'} vs "
            f"{b.prompt_tokens_target or 'fixed text'}"
        )
    elif a.prompt_tokens_target is None and a.prompt != b.prompt:
        out.append(f"prompt text: {len(a.prompt)} vs {len(b.prompt)} characters, different")
    return out


@dataclass(frozen=True)
class ExperimentFacts:
    """What is known about where and when an experiment ran (empty / None: unknown)."""

    window_ns: tuple[int, int] | None = None  # wall clock, first send → last run's end
    hosts: frozenset[str] = frozenset()  # names the server's host goes by
    tensor_parallel_size: int | None = None
    vllm_version: str | None = None
    models: frozenset[str] = field(default_factory=frozenset)  # served names and paths


def _short(host: str) -> str:
    return host.strip().lower().split(".")[0]


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def evidence_mismatches(
    what: str,
    facts: ExperimentFacts,
    *,
    span_ns: tuple[int, int] | None = None,
    hosts: Iterable[str] = (),
    ranks: Iterable[int] = (),
    world_size: int | None = None,
    vllm_version: str | None = None,
    model: str | None = None,
) -> list[str]:
    """Why the evidence file ``what`` (e.g. "NCCL log", "trace") cannot belong to the
    experiment described by ``facts``; empty when nothing contradicts it.

    ``span_ns``: the wall-clock span the file's own timestamps cover; ``hosts``: host names it
    names; ``ranks``: the communicator sizes it shows (NCCL); ``world_size``: the job's ranks
    (a trace's distributed info).
    """
    out: list[str] = []
    if span_ns is not None and facts.window_ns is not None:
        start, end = facts.window_ns
        slack = int(WINDOW_SLACK_S * 1e9)
        if span_ns[1] < start - slack or span_ns[0] > end + slack:
            out.append(
                f"time: the {what} covers {_when(span_ns[0])} to {_when(span_ns[1])}, "
                f"the experiment ran {_when(start)} to {_when(end)}"
            )
    names = {_short(h) for h in hosts if h}
    mine = {_short(h) for h in facts.hosts if h}
    if names and mine and not names & mine:
        out.append(
            f"host: the {what} names {', '.join(sorted(names))}, the experiment's "
            f"server is {', '.join(sorted(mine))}"
        )
    sizes = sorted({int(r) for r in ranks if r})
    tp = facts.tensor_parallel_size
    # A tensor-parallel server has a communicator of exactly its TP size (other sizes are
    # pipeline or data parallel groups); with TP 1 there is none to look for.
    if sizes and tp and tp > 1 and tp not in sizes:
        out.append(
            f"ranks: the {what} shows communicators of {'/'.join(map(str, sizes))} "
            f"rank(s), the experiment's tensor-parallel size is {tp}"
        )
    if world_size and tp and world_size % tp:
        out.append(
            f"ranks: the {what} is of a {world_size}-rank job, the experiment's "
            f"tensor-parallel size is {tp}"
        )
    if vllm_version and facts.vllm_version and vllm_version != facts.vllm_version:
        out.append(
            f"vLLM: the {what} was taken with vLLM {vllm_version}, the experiment's "
            f"server is vLLM {facts.vllm_version}"
        )
    if (
        model
        and facts.models
        and model not in facts.models
        and model.rstrip("/").split("/")[-1]
        not in {m.rstrip("/").split("/")[-1] for m in facts.models}
    ):
        out.append(
            f"model: the {what} is of {model}, the experiment served "
            f"{', '.join(sorted(facts.models))}"
        )
    return out


def facts_from(
    server_info: Mapping[str, Any],
    runs: Sequence[Run],
    hosts: Iterable[str] = (),
    tensor_parallel_size: int | None = None,
) -> ExperimentFacts:
    """:class:`ExperimentFacts` from an experiment's stored server info and runs (``hosts``:
    the names its endpoint's host goes by, which only the caller can resolve)."""
    starts = [r.client.sent_wall_ns for r in runs if r.client is not None]
    ends = [r.client.sent_wall_ns + r.client.end_offset_ns for r in runs if r.client is not None]
    models: set[str] = set()
    for m in server_info.get("models") or []:
        if isinstance(m, Mapping):
            models.update(str(m[k]) for k in ("id", "root") if m.get(k))
    version = server_info.get("vllm_version")
    return ExperimentFacts(
        window_ns=(min(starts), max(ends)) if starts else None,
        hosts=frozenset(hosts),
        tensor_parallel_size=tensor_parallel_size,
        vllm_version=str(version) if version else None,
        models=frozenset(models),
    )
