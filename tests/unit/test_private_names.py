"""A module's underscored names are its own (issue 43 item 5): no phaseprobe module imports
another's private name. What one module shares with others is public, in its ``__all__``."""

from __future__ import annotations

import ast
from pathlib import Path

import phaseprobe

ROOT = Path(phaseprobe.__file__).parent
# Still crossing, each left to its module's owner (issue 43 item 5 made the rest public):
# the Nsight export's readers and the OTLP/JSON reader's helpers.
KNOWN = {"phaseprobe.sources.nsys.export", "phaseprobe.sources.vllm.otlp_json_fast"}


def _private_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if not node.module.startswith("phaseprobe") or node.module in KNOWN:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT.parent)}: {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    assert _private_imports() == []


def test_the_names_made_public_are_exported() -> None:
    from phaseprobe.present.cli import render_spans, time_arg
    from phaseprobe.sources.vllm import otlp_fields

    assert {"duration_s", "number"} <= set(time_arg.__all__)
    assert {"count", "short_id"} <= set(render_spans.__all__)
    assert {"FIELD_OF", "timestamp_problem", "bounded_attributes"} <= set(otlp_fields.__all__)
    for module in (time_arg, render_spans, otlp_fields):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
