"""Read Prometheus rule files for ``alerts lint`` and ``alerts build --existing``.

A file is a rule file (``groups:``) or a Prometheus Operator ``PrometheusRule`` (its
``spec.groups``), possibly several YAML documents in one file (``---``). Errors name the file.
Each rule's expression goes to the Grafana lint's core (stale, removed and missing vLLM
names); rule names defined twice are reported as clashes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import DASHBOARD_CAP, read_input_text
from phaseprobe.present.grafana.lint import ExprRef

__all__ = ["RuleFile", "clashes", "load_rule_file"]


@dataclass(frozen=True)
class RuleFile:
    path: str
    refs: list[ExprRef]  # every rule's expression, with "group G record|alert NAME"
    names: list[tuple[str, str]] = field(default_factory=list)  # (record|alert, name)


def _groups(doc: Any) -> list[Any] | None:
    if not isinstance(doc, dict):
        return None
    if doc.get("kind") == "PrometheusRule":
        spec = doc.get("spec")
        return spec.get("groups") if isinstance(spec, dict) else None
    return doc.get("groups")


def load_rule_file(path: Path) -> RuleFile:
    def fail(reason: str) -> ConfigError:  # a FIFO, /dev/zero, a file over the cap
        return ConfigError(f"rule file {path}: {reason}")

    try:
        text = read_input_text(path, DASHBOARD_CAP, fail)
    except FileNotFoundError:
        raise fail("no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot be read ({type(exc).__name__})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise fail(f"not valid YAML{at}") from None
    except RecursionError:
        raise fail("input nested too deeply") from None
    refs: list[ExprRef] = []
    names: list[tuple[str, str]] = []
    found = False
    for doc in docs:
        groups = _groups(doc)
        if not isinstance(groups, list):
            continue
        found = True
        for group in groups:
            if not isinstance(group, dict):
                continue
            for rule in group.get("rules") or []:
                if not isinstance(rule, dict):
                    continue
                kind = "alert" if "alert" in rule else "record"
                name = str(rule.get(kind, "?"))
                names.append((kind, name))
                if isinstance(rule.get("expr"), str):
                    where = f"group {group.get('name', '?')!r} {kind} {name}"
                    refs.append(ExprRef(where, rule["expr"]))
    if not found:
        raise fail("not a Prometheus rule file (no 'groups:') nor a PrometheusRule")
    return RuleFile(str(path), refs, names)


def clashes(new: Iterable[tuple[str, str]], files: Iterable[RuleFile]) -> list[str]:
    """Recording rules the new rules define that a file already defines (two rules writing one
    series fight over it), and alerts of the same name (two runbooks, one page)."""
    wanted = set(new)
    out = []
    for f in files:
        for kind, name in sorted(set(f.names) & wanted):
            out.append(f"{kind} {name} is already defined in {f.path}")
    return out
