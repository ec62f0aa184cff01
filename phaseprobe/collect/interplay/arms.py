"""``phaseprobe interfere`` on two arms: does a setting change how a long prefill stalls decode?

The arms are two endpoints, or an A/B playbook whose arms phaseprobe launches (chunked prefill
on/off, a small vs a large ``--max-num-batched-tokens``). Servers come from the A/B machinery
(:func:`phaseprobe.collect.ab.engine.start_arms` with
:func:`~phaseprobe.collect.ab.engine.launch_server`: 127.0.0.1, a free port, health-checked,
stopped on every exit path). Each arm is one stored
experiment of kind ``interfere`` named ``<name>:<arm>``; the labels ``interfere_arm`` and
``interfere_group`` tie the two together.

The steps are interleaved across arms (baseline 1 of A, of B, baseline 2 …, then pair 1 of A,
of B …) so slow drift lands on both arms, with the playbook's ``pause_s`` before each step so
the other arm's server has gone quiet on a small machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from phaseprobe.analysis.interplay import ArmsComparison, compare_arms
from phaseprobe.collect.ab.engine import Launcher, launch_server, start_arms
from phaseprobe.collect.ab.playbook import Playbook, redacted_arm
from phaseprobe.collect.interplay.context import Progress, Target, fmt_ms, quiet
from phaseprobe.collect.interplay.interfere import (
    InterfereResult,
    InterfereSession,
    InterfereSettings,
)
from phaseprobe.notes import Notes
from phaseprobe.records import ArmOrigin
from phaseprobe.store import Store

__all__ = [
    "InterfereArm",
    "ArmsResult",
    "run_interfere_arms",
    "interfere_playbook",
    "playbook_settings",
]


@dataclass(frozen=True)
class InterfereArm:
    """One arm of a two-arm interfere: its name, the endpoint it measures and where that came
    from."""

    name: str
    target: Target
    info: ArmOrigin = field(default_factory=ArmOrigin)  # kept in the experiment's server info


@dataclass
class ArmsResult:
    """A two-arm interfere's outcome: each arm's result, in arm order, and their comparison."""

    arms: dict[str, InterfereResult]  # arm name → its result, in arm order (A first)
    comparison: ArmsComparison
    notes: Notes = field(default_factory=Notes)
    playbook: str | None = None

    @property
    def runs(self) -> list[Any]:
        """Every stored run of every arm, arm A's first."""
        return [r for res in self.arms.values() for r in res.runs]

    def to_dict(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict: playbook, notes, comparison and each arm's result with
        its server info."""
        return {
            "playbook": self.playbook,
            "notes": self.notes.to_list(),
            "comparison": self.comparison,
            "arms": {
                name: {"server": res.server_info, **res.to_dict()}
                for name, res in self.arms.items()
            },
        }


def run_interfere_arms(
    arms: Sequence[InterfereArm],
    store: Store,
    settings: InterfereSettings,
    *,
    name: str = "interfere",
    pause_s: float = 0.0,
    min_effect: float = 0.05,
    progress: Progress | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ArmsResult:
    """The interfere experiment on every arm, steps interleaved; arm B compared to arm A."""
    if len(arms) != 2 or arms[0].name == arms[1].name:
        raise ValueError("two arms with different names are needed")
    say = progress or quiet
    group = f"{name}-{time.time_ns()}"
    names = ",".join(a.name for a in arms)
    sessions: list[InterfereSession] = []
    try:
        for arm in arms:
            sessions.append(
                InterfereSession(
                    arm.target,
                    store,
                    settings,
                    name=f"{name}:{arm.name}",
                    labels={
                        "interfere_arm": arm.name,
                        "interfere_arms": names,
                        "interfere_group": group,
                    },
                    arm={"arm": arm.name, "group": group, **arm.info},
                    require_model=True,
                )
            )
        for s in sessions:
            s.warm_up()

        for i in range(settings.reps):
            for s in sessions:
                if pause_s:
                    sleep(pause_s)  # the other arm's server winds down first
                s.baseline(i)
            say(f"interfere baseline {i + 1}/{settings.reps} (both arms)")
        for s in sessions:
            s.prepare()
        for i in range(settings.reps):
            for s in sessions:
                if pause_s:
                    sleep(pause_s)
                s.pair(i)
            say(
                f"interfere pair {i + 1}/{settings.reps}: "
                + ", ".join(
                    f"{arm.name} A max ITL {fmt_ms(s.stalls[-1].max_itl_s)}"
                    for arm, s in zip(arms, sessions)
                )
            )
    finally:
        results = {arm.name: s.finish() for arm, s in zip(arms, sessions)}
    name_a, name_b = arms[0].name, arms[1].name
    comparison = compare_arms(
        name_a, results[name_a].stalls, name_b, results[name_b].stalls, min_effect=min_effect
    )
    return ArmsResult(results, comparison)


def playbook_settings(playbook: Playbook, base: InterfereSettings) -> InterfereSettings:
    """The playbook's [run] as the interfere settings: A's prompt (prompt_tokens) and length
    (max_tokens), the repetitions (runs) and warm-ups; B and the trigger come from ``base``."""
    plan = playbook.run
    return InterfereSettings(
        a_prompt_tokens=plan.prompt_tokens or base.a_prompt_tokens,
        a_tokens=plan.max_tokens,
        b_prompt_tokens=base.b_prompt_tokens,
        b_tokens=base.b_tokens,
        trigger=base.trigger,
        reps=plan.runs,
        warmup=max(1, plan.warmup),
    )


def interfere_playbook(
    playbook: Playbook,
    store: Store,
    settings: InterfereSettings,
    *,
    name: str | None = None,
    api_key: str | None = None,
    launcher: Launcher = launch_server,
    progress: Progress | None = None,
) -> ArmsResult:
    """Start the playbook's arms (or use their endpoints), run interfere on both, stop them.

    ``settings`` is used as given: build it with :func:`playbook_settings` to take A's sizes
    and the repetitions from the playbook."""
    say = progress or quiet
    plan = playbook.run
    notes = Notes()  # the arms' starting (an arm sharing A's server)
    with contextlib.ExitStack() as stack:
        urls = start_arms(playbook, stack, launcher, say, notes)
        arms = [
            InterfereArm(
                arm.name,
                Target(
                    url,
                    arm.served_model,
                    api_key=api_key,
                    chat=plan.api == "chat",
                    timeout_s=plan.timeout_s,
                    deadline_s=plan.deadline_s,
                    seed=plan.seed,
                    replicas=arm.replicas,
                ),
                # kept in the experiment: secrets redacted as A/B keeps them
                {"playbook": playbook.name, "role": "AB"[i], **redacted_arm(arm)},
            )
            for i, (arm, url) in enumerate(zip(playbook.arms, urls))
        ]
        result = run_interfere_arms(
            arms,
            store,
            settings,
            name=name or playbook.name,
            pause_s=plan.pause_s,
            min_effect=plan.min_effect,
            progress=say,
        )
    notes.extend(result.notes)  # the starting notes first
    result.notes = notes
    result.playbook = playbook.name
    return result
