"""Step costs for ``check --live``'s speculation rule, from the store.

A live window pools batches that mix drafted and plain steps, so it cannot price either; the
newest stored experiment whose isolated runs drafted (a ``probe`` of the same server with its
speculation on) can (:func:`phaseprobe.analysis.spec_decode.step_costs`). Reading it is the
wiring; the fit is analysis.
"""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.spec_decode import StepCosts, spec_of_run, step_costs
from phaseprobe.errors import PhaseprobeError
from phaseprobe.store import Store

__all__ = ["stored_step_costs", "LOOK_BACK"]

LOOK_BACK = 20  # newest experiments looked at: an older probe is likely another configuration


def stored_step_costs(store_path: Path | None) -> tuple[StepCosts | None, str]:
    """(the fitted costs, where they come from in words) or (None, why there are none)."""
    if store_path is None or not store_path.is_file():
        return None, "no experiment store given (--store)"
    try:
        with Store(store_path, readonly=True) as store:
            ids = sorted((int(e["id"]) for e in store.experiments()), reverse=True)
            last_why = f"no experiment with speculation in the newest {LOOK_BACK} of {store_path}"
            for exp_id in ids[:LOOK_BACK]:
                runs = store.runs(exp_id)
                if not any(spec_of_run(r) is not None for r in runs):
                    continue
                costs = step_costs(runs)
                if costs.reason is None:
                    return costs, f"experiment {exp_id} in {store_path}"
                last_why = f"experiment {exp_id} in {store_path}: {costs.reason}"
            return None, last_why
    except PhaseprobeError as e:
        return None, f"store unreadable ({e})"
