"""``--json`` documents as strict JSON.

``json.dumps`` writes a float NaN or infinity as ``NaN`` / ``Infinity``: not JSON, and ``jq``
or any strict parser refuses the whole document. A value can be non-finite when a server or a
file said so (a Prometheus sample ``NaN``, a histogram sum ``+Inf``, an old store row), so
every command's ``--json`` goes through :func:`dumps`: a non-finite float becomes ``null``
("no value"), as a missing reading already is.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth of dicts, lists, tuples) None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(doc: Any, **kwargs: Any) -> str:
    """``json.dumps(doc)``, strict: never ``NaN`` or ``Infinity`` in the text."""
    try:
        return json.dumps(doc, allow_nan=False, **kwargs)
    except ValueError:  # a non-finite float somewhere: the rare path walks the document
        return json.dumps(finite(doc), allow_nan=False, **kwargs)
