"""Set a probe's measured phases against their physical bound (the roofline per phase).

Two inputs come from outside the runs: the model's ``config.json`` (the local vLLM's
``/v1/models`` ``root`` is its directory; for a remote server pass ``--model-config``) and the
hardware peaks (a datasheet row such as ``h100-sxm``, or this machine's ``phaseprobe
calibrate`` result). Without either, the report says what is missing instead of guessing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phaseprobe import calibrate
from phaseprobe.analysis.gpu_peaks import lookup
from phaseprobe.analysis.roofline import (
    ModelCost,
    Peaks,
    model_cost_from_config,
    peaks_from_spec,
    roofline_for_run,
)
from phaseprobe.collect.experiment import ProbeResult
from phaseprobe.errors import PhaseprobeError
from phaseprobe.records import Run
from phaseprobe.store import Store

__all__ = ["efficiency_report", "kv_reservation_report", "model_config_path", "resolve_peaks"]


def model_config_path(server_info: dict[str, Any], explicit: str | None) -> Path | None:
    """``--model-config``, else the served model's ``root`` when it is a local directory."""
    if explicit:
        return Path(explicit)
    for model in server_info.get("models") or []:
        root = model.get("root") if isinstance(model, dict) else None
        if root and (Path(root) / "config.json").is_file():
            return Path(root)
    return None


def resolve_peaks(choice: str | None, dtype: str = "bf16") -> Peaks | None:
    """``choice``: a GPU name from the peaks table, ``calibrated`` (this machine's stored
    calibration), or None (no peaks)."""
    if choice is None:
        return None
    if choice == "calibrated":
        cal = calibrate.load()
        return cal.to_peaks(dtype) if cal else None
    return peaks_from_spec(lookup(choice), dtype)


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def efficiency_report(runs: Sequence[Run], server_info: dict[str, Any], *,
                      peaks_choice: str | None, model_config: str | None) -> dict[str, Any]:
    """Per-run roofline and medians, or ``{"skipped": reason}``."""
    if peaks_choice is None:
        return {"skipped": "no hardware peaks: pass --peaks GPU (e.g. h100-sxm) or run "
                           "`phaseprobe calibrate` and pass --peaks calibrated"}
    try:
        peaks = resolve_peaks(peaks_choice)
        if peaks is None:
            return {"skipped": "no stored calibration: run `phaseprobe calibrate` first"}
        path = model_config_path(server_info, model_config)
        if path is None:
            return {"skipped": "the model's config.json is not reachable from here: pass "
                               "--model-config PATH"}
        cost: ModelCost = model_cost_from_config(path)
    except PhaseprobeError as exc:
        return {"skipped": str(exc)}
    done = [r for r in runs if r.status != "error"]
    per_run = [roofline_for_run(r, cost, peaks) for r in done]
    return {
        "peaks": peaks.origin,
        "model_config": str(path),
        "decode_efficiency": _median([r.decode_efficiency for r in per_run]),
        "decode_bound_s_per_token": _median([r.decode_bound_s_per_token for r in per_run]),
        "decode_measured_s_per_token": _median([r.decode_measured_s_per_token for r in per_run]),
        "prefill_efficiency": _median([r.prefill_efficiency for r in per_run]),
        "prefill_bound_s": _median([r.prefill_bound_s for r in per_run]),
        "prefill_bound_kind": per_run[0].prefill_bound_kind if per_run else None,
        "prefill_measured_s": _median([r.prefill_measured_s for r in per_run]),
        "runs": [{"seq": r.seq, **rl.to_dict()} for r, rl in zip(done, per_run)],
    }


def kv_reservation_report(store: Store, result: ProbeResult, *,
                          model_config: str | None) -> dict[str, Any]:
    """The experiment's GPU memory series beside vLLM's cache config: reservation or growth."""
    from phaseprobe.analysis.kv_reservation import analyze_kv_reservation, run_windows

    kv_per_token: float | None = None
    path = model_config_path(result.server_info, model_config)
    if path is not None:
        try:
            kv_per_token = model_cost_from_config(path).kv_bytes_per_token
        except PhaseprobeError:
            kv_per_token = None  # the verdict does not need it; capacity in tokens does
    report = analyze_kv_reservation(
        store.gpu_samples(result.experiment_id), run_windows=run_windows(result.runs),
        cache=result.server_info.get("cache_config") or {}, kv_bytes_per_token=kv_per_token)
    return report.to_dict()
