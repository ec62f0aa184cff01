"""Does a ``--selector`` match any vLLM series of a ``/metrics`` page?

A page has only the labels vLLM writes (``model_name``, ``engine``, ...); ``job``,
``instance``, ``namespace`` and the like are added by Prometheus when it scrapes, so a matcher
on those cannot be checked here and is reported as such, not as a problem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from phaseprobe.sources.query_catalog import bare_selector, resolve_names

__all__ = ["names_from_samples", "selector_problems"]

_MATCHER = re.compile(
    r"""([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
)


def _value(quoted: str) -> str:
    if quoted.startswith('"'):
        try:
            value = json.loads(quoted)
            return value if isinstance(value, str) else quoted[1:-1]
        except json.JSONDecodeError:  # a Go escape JSON lacks (\a, \x41): close enough here
            return quoted[1:-1]
    return quoted[1:-1]


def _holds(op: str, want: str, have: str | None) -> bool:
    have = have or ""  # a missing label is the empty string to PromQL
    if op == "=":
        return have == want
    if op == "!=":
        return have != want
    try:
        matched = re.fullmatch(want, have) is not None
    except re.error:
        return True  # RE2 syntax Python lacks: do not claim a mismatch
    return matched if op == "=~" else not matched


def selector_problems(
    selector: str, samples: Mapping[str, list[tuple[dict[str, str], float]]]
) -> tuple[list[str], list[str]]:
    """(problems, unchecked labels): a problem when the matchers on labels the page has match
    no vLLM series of it."""
    matchers = [
        (m.group(1), m.group(2), _value(m.group(3)))
        for m in _MATCHER.finditer(bare_selector(selector))
    ]
    vllm = [
        labels
        for name, rows in samples.items()
        if name.startswith(("vllm:", "vllm_"))
        for labels, _ in rows
    ]
    on_page = {key for labels in vllm for key in labels}
    checked = [m for m in matchers if m[0] in on_page]
    unchecked = sorted({m[0] for m in matchers if m[0] not in on_page})
    if not vllm or not checked:
        return [], unchecked
    if any(all(_holds(op, want, labels.get(key)) for key, op, want in checked) for labels in vllm):
        return [], unchecked
    shown = ", ".join(f"{k}{op}{want!r}" for k, op, want in checked)
    values = {
        key: sorted({labels[key] for labels in vllm if key in labels})[:5] for key, _, _ in checked
    }
    problems = [
        f"--selector {selector!r} matches no vLLM series of the page ({shown}); it has "
        + "; ".join(f"{k} in {v}" for k, v in values.items())
    ]
    return problems, unchecked


def names_from_samples(samples: Mapping[str, object]) -> dict[str, str]:
    """Newest vLLM sample name → the spelling a ``/metrics`` page has (an older vLLM, a
    ``vllm_`` exporter), for :class:`~phaseprobe.analysis.alerts.rules.AlertOptions`."""
    return resolve_names(samples)
