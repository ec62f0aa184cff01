"""Set a probe's measured phases against their physical bound (the roofline per phase).

Two inputs come from outside the runs: the model's ``config.json`` (the local vLLM's
``/v1/models`` ``root`` is its directory; for a remote server pass ``--model-config``) and the
hardware peaks (a datasheet row such as ``h100-sxm``, or this machine's ``phaseprobe
calibrate`` result, in the dtype the model is served in). Without either, the report says
what is missing instead of guessing. Both options are checked before any run
(:func:`validate_options`, :func:`check_against_server`): a config that is not the served
model's is refused, naming the fields that differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from phaseprobe import calibrate
from phaseprobe.analysis import model_math
from phaseprobe.analysis.gpu_peaks import lookup
from phaseprobe.analysis.model_match import Mismatch, compare_with_server, describe
from phaseprobe.analysis.quantiles import median_or_none
from phaseprobe.analysis.roofline import (
    ModelCost,
    Peaks,
    bound_beaten_message,
    is_beaten,
    peaks_from_spec,
    roofline_for_run,
)
from phaseprobe.collect.experiment import ProbeResult
from phaseprobe.collect.model_config import model_cost_from_config, model_shape_from_config
from phaseprobe.errors import ConfigError, PhaseprobeError
from phaseprobe.records import Run, ServerInfo
from phaseprobe.sources.model_config import read_model_config
from phaseprobe.store import Store

if TYPE_CHECKING:  # numpy: imported with the report only
    from phaseprobe.analysis.kv_reservation import KvReservationDoc

__all__ = [
    "BOUND_MODEL",
    "WorkReport",
    "check_against_server",
    "efficiency_report",
    "roofline_report",
    "work_report",
    "fetch_server_info",
    "kv_reservation_report",
    "model_config_mismatches",
    "model_config_path",
    "preflight",
    "resolve_peaks",
    "served_dtype",
    "validate_options",
    "allowed_model_roots",
    "model_root_note",
    "MODEL_ROOT_ENV",
]

MODEL_ROOT_ENV = "PHASEPROBE_MODEL_ROOT"


def model_config_path(server_info: Mapping[str, Any], explicit: str | None) -> Path | None:
    """``--model-config``, else the served model's ``root`` when it is a local directory
    inside one the user allowed (:func:`allowed_model_roots`)."""
    if explicit:
        return Path(explicit)
    return _served_root(server_info, None)[0]


def allowed_model_roots(explicit: str | Path | None = None) -> list[Path]:
    """Where a server-named ``root`` may be read, resolved: ``--model-config``'s directory,
    the local vLLM's model directory, and each directory of ``$PHASEPROBE_MODEL_ROOT``
    (``os.pathsep``-separated). A server names any path it likes: only these are trusted."""
    from phaseprobe.local.venv import default_model_dir

    given = [default_model_dir()]
    if explicit:
        p = Path(explicit).expanduser()
        given.append(p if p.is_dir() else p.parent)
    given += [
        Path(d).expanduser()
        for d in os.environ.get(MODEL_ROOT_ENV, "").split(os.pathsep)
        if d.strip()
    ]
    roots = []
    for d in given:
        try:
            roots.append(d.resolve())
        except (OSError, RuntimeError, ValueError):
            continue  # a loop or a bad name allows nothing
    return roots


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _served_root(
    server_info: Mapping[str, Any], explicit: str | Path | None
) -> tuple[Path | None, str | None]:
    """(the served model's directory, None), or (None, why a directory the server named was
    not read). The path is resolved (``..``, symlinks: the directory's and its config.json's)
    before it is compared; the server's value is never quoted (it is the server's text)."""
    roots: list[Path] | None = None
    refused = 0
    for model in server_info.get("models") or []:
        root = model.get("root") if isinstance(model, dict) else None
        if not isinstance(root, str) or not root:
            continue
        try:
            if not (Path(root) / "config.json").is_file():
                continue  # a hub name such as org/model: nothing local to read
            real = (Path(root) / "config.json").resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            continue
        if roots is None:
            roots = allowed_model_roots(explicit)
        directory = Path(root).resolve()
        if Path(root).is_absolute() and _inside(directory, roots) and _inside(real, roots):
            return directory, None
        refused += 1
    if not refused:
        return None, None
    return None, (
        f"the server's /v1/models names a model directory outside those phaseprobe "
        f"may read (--model-config's, the local vLLM's, ${MODEL_ROOT_ENV}): not read; "
        f"pass --model-config PATH, or add its parent to ${MODEL_ROOT_ENV}"
    )


def model_root_note(server_info: Mapping[str, Any], explicit: str | None = None) -> str | None:
    """Why the server's ``root`` was not read as the model's directory, when it was refused
    (outside every allowed directory); None when it was read, or named nothing local."""
    return _served_root(server_info, explicit)[1]


def _unreachable(server_info: Mapping[str, Any]) -> str:
    note = model_root_note(server_info)
    return "the model's config.json is not reachable from here" + (
        f" ({note})" if note else ": pass --model-config PATH"
    )


def resolve_peaks(choice: str | None, dtype: str = "bf16") -> Peaks | None:
    """``choice``: a GPU name from the peaks table, ``calibrated`` (this machine's stored
    calibration), or None (no peaks)."""
    if choice is None:
        return None
    if choice == "calibrated":
        cal = calibrate.load()
        return cal.to_peaks(dtype) if cal else None
    return peaks_from_spec(lookup(choice), dtype)


def served_dtype(path: Path) -> str:
    """The activation dtype the server computes in, as the config says (fp32 checkpoints are
    served as fp16 by vLLM's ``--dtype auto``): the dtype whose peak the roofline uses."""
    return model_math.weight_format(model_shape_from_config(path)[0]).base_dtype


def model_config_mismatches(path: Path, server_info: Mapping[str, Any]) -> list[Mismatch]:
    """What the server reports that ``path``'s config contradicts. The served model's own
    config.json (``root``) is the served model by definition: nothing to check."""
    cfg, given_source = read_model_config(path)
    root = _served_root(server_info, path)[0]
    served: dict[str, Any] | None = None
    source = ""
    if root is not None:
        served, source = read_model_config(root)
        if Path(source).resolve() == Path(given_source).resolve():
            return []
    return compare_with_server(
        cfg,
        server_info,
        served_config=served,
        served_config_source=f"the server's {source}" if source else "",
    )


def validate_options(peaks_choice: str | None, model_config: str | None) -> None:
    """Everything about ``--peaks`` and ``--model-config`` that needs no server: checked
    before any run (ConfigError naming the option)."""
    if model_config is not None:
        model_shape_from_config(model_config)
    if peaks_choice is None:
        return
    if peaks_choice == "calibrated":
        if calibrate.load() is None:
            raise ConfigError(
                f"--peaks calibrated: no calibration stored in "
                f"{calibrate.calibration_path()}; run `phaseprobe calibrate` "
                f"first"
            )
        return
    try:
        lookup(peaks_choice)
    except ConfigError as exc:
        raise ConfigError(f"--peaks: {exc}") from None


def check_against_server(
    server_info: Mapping[str, Any], model_config: str | None, *, force: bool = False
) -> list[str]:
    """``--model-config`` against the server (before the runs): ConfigError naming the
    mismatching fields, or with ``force`` the same text as a warning to print."""
    if model_config is None:
        return []
    mismatches = model_config_mismatches(Path(model_config), server_info)
    if not mismatches:
        return []
    text = describe(mismatches, model_config)
    if not force:
        raise ConfigError(f"{text} (or --force-model-config to use it anyway)")
    return [f"{text}; used anyway (--force-model-config): the roofline is not this server's"]


def fetch_server_info(
    endpoint: str, api_key: str | None, models: list[dict[str, Any]] | None = None
) -> ServerInfo:
    """What the server says about itself before any run (``/v1/models``, ``/version`` and
    ``vllm:cache_config_info``), the same dict the probe stores as ``server_info``.
    ``models``: ``/v1/models`` when the caller already has it."""
    from phaseprobe.collect.connection import connect

    return connect(endpoint, api_key, models=models).info


def preflight(
    endpoint: str,
    api_key: str | None,
    peaks_choice: str | None,
    model_config: str | None,
    *,
    force: bool = False,
    models: list[dict[str, Any]] | None = None,
) -> list[str]:
    """The server-side half of the checks, before any run: ``--model-config`` against what
    the server reports (ConfigError on a mismatch unless ``force``), and whether the roofline
    will be computable at all. Returns warnings to print."""
    if peaks_choice is None and model_config is None:
        return []
    info = fetch_server_info(endpoint, api_key, models)
    warnings = check_against_server(info, model_config, force=force)
    if peaks_choice is not None and model_config_path(info, model_config) is None:
        warnings.append(
            "--peaks given, but the served model's config.json is not reachable "
            "from here ("
            + (model_root_note(info) or "/v1/models names no local directory")
            + "): pass --model-config PATH, or the "
            "roofline will be skipped"
        )
    return warnings


class EfficiencyReport(TypedDict, total=False):
    """The roofline beside the measured phases (kept with the experiment, shown by `probe`,
    `runs`, the dashboard and the checklist): JSON that passes through, so a TypedDict.
    ``skipped`` alone (with ``model_config_mismatches`` when that is why) when there is none.
    Efficiency = bound / measured (0..1); None where the measured time beat its bound."""

    skipped: str  # why no roofline could be set
    model_config_mismatches: list[str]
    peaks: str  # where the peaks came from (a GPU's datasheet, this machine's calibration)
    peaks_dtype: str | None  # the dtype the peaks are for (the served model's)
    model_config: str  # the config.json the costs came from
    decode_efficiency: float | None
    decode_bound_s_per_token: float | None  # weights + KV bytes / bandwidth, s per token
    decode_measured_s_per_token: float | None  # vLLM's decode / (completion − 1), s
    prefill_efficiency: float | None
    prefill_bound_s: float | None  # the larger of FLOPs / peak and bytes / bandwidth, s
    prefill_bound_kind: str | None  # compute | memory: which of the two set the bound
    prefill_measured_s: float | None  # vLLM's prefill, s
    decode_bound_ratio: float | None  # bound / measured, even above 1
    prefill_bound_ratio: float | None
    decode_bound_beaten: bool  # measured faster than the bound: the peak is underestimated
    prefill_bound_beaten: bool
    bound_beaten: bool
    warnings: list[str]
    runs: list[dict[str, Any]]  # per run: seq + analysis.roofline.RunRoofline fields
    bound_model: str  # which FLOP/byte model set the bounds (BOUND_MODEL)
    work: WorkReport  # vLLM's own FLOPs and bytes beside phaseprobe's, per isolated run


# The roofline's bounds come from phaseprobe's own arithmetic on config.json: vLLM's counters
# bill per scheduled step (a batch's work, not one request's) and exist only with a flag, so
# they are shown beside the bounds (``work``), never used for them.
BOUND_MODEL = (
    "phaseprobe's model-config arithmetic (analysis/roofline.py); vLLM's own "
    "--enable-mfu-metrics counters are beside it under 'work'"
)


class WorkReport(TypedDict, total=False):
    """vLLM's own FLOPs and bytes per isolated run (its ``--enable-mfu-metrics`` counters)
    beside phaseprobe's model-config figures, with vLLM / phaseprobe per quantity
    (``analysis.vllm_work``). ``skipped`` alone when there is nothing to set side by side."""

    skipped: str
    model_config: str  # the config.json phaseprobe's figures came from
    runs: list[dict[str, Any]]  # per run: analysis.vllm_work.WorkComparison fields
    flops_ratio: float | None  # medians over the runs, vLLM / phaseprobe
    read_bytes_ratio: float | None
    write_bytes_ratio: float | None
    findings: list[str]  # each quantity further apart than 20 %, and what each model counts


_WORK_WHY = {
    "flops": "vLLM bills a prefill's attention over every (token, context) pair, phaseprobe "
    "the causal half; both bill the matmuls once per token and the LM head once per "
    "prefill and per decode step",
    "read_bytes": "vLLM also bills each linear layer's input activations and, in prefill, "
    "reading back the K and V just written; phaseprobe reads the weights once "
    "per step and the context's KV in decode only",
    "write_bytes": "vLLM bills every layer's outputs (QKV, attention, MLP, logits) besides the "
    "KV cache; phaseprobe's writes are the KV cache alone",
}


def work_report(
    runs: Sequence[Run],
    server_info: Mapping[str, Any],
    *,
    model_config: str | None,
    force: bool = False,
) -> WorkReport:
    """Each isolated run's FLOPs and bytes by vLLM's counters and by phaseprobe's model, or
    ``{"skipped": reason}`` (no config.json, or vLLM started without the counters)."""
    from phaseprobe.analysis.vllm_work import DISAGREEMENT, compare_work

    try:
        path = model_config_path(server_info, model_config)
        if path is None:
            return {"skipped": _unreachable(server_info)}
        if model_config_mismatches(path, server_info) and not force:
            return {"skipped": f"{path} is not the served model's config"}
        cost = model_cost_from_config(path)
    except PhaseprobeError as exc:
        return {"skipped": str(exc)}
    rows = [w for w in (compare_work(r, cost) for r in runs) if w is not None]
    if not rows:
        return {
            "skipped": "no isolated run has vLLM's FLOP/byte counters: start vLLM (0.32 "
            "or later) with --enable-mfu-metrics"
        }
    report: WorkReport = {"model_config": str(path), "runs": [w.to_dict() for w in rows]}
    findings: list[str] = []
    for key in ("flops", "read_bytes", "write_bytes"):
        ratio = median_or_none([getattr(w, f"{key}_ratio") for w in rows])
        report[f"{key}_ratio"] = ratio  # type: ignore[literal-required]
        if ratio is not None and abs(ratio - 1) > DISAGREEMENT:
            vllm = median_or_none([getattr(w, f"vllm_{key}") for w in rows])
            mine = median_or_none([getattr(w, f"model_{key}") for w in rows])
            what = key.replace("_", " ")
            findings.append(
                f"{what}: vLLM {vllm:.3g} vs phaseprobe {mine:.3g} per request "
                f"(×{ratio:.2f}, medians over {len(rows)} run(s)): {_WORK_WHY[key]}"
            )
    report["findings"] = findings
    return report


def efficiency_report(
    runs: Sequence[Run],
    server_info: Mapping[str, Any],
    *,
    peaks_choice: str | None,
    model_config: str | None,
    force: bool = False,
) -> EfficiencyReport:
    """The roofline (:func:`roofline_report`) with vLLM's own FLOPs and bytes beside
    phaseprobe's under ``work`` (:func:`work_report`), whether or not peaks were given."""
    report = roofline_report(
        runs, server_info, peaks_choice=peaks_choice, model_config=model_config, force=force
    )
    report["work"] = work_report(runs, server_info, model_config=model_config, force=force)
    return report


def roofline_report(
    runs: Sequence[Run],
    server_info: Mapping[str, Any],
    *,
    peaks_choice: str | None,
    model_config: str | None,
    force: bool = False,
) -> EfficiencyReport:
    """Per-run roofline and medians, or ``{"skipped": reason}``.

    A phase whose median bound / measured is above 1 (or any run of it) beat its bound: its
    efficiency is None, ``<phase>_bound_beaten`` is True, ``<phase>_bound_ratio`` keeps the
    raw median and ``warnings`` says which peak is underestimated.
    """
    if peaks_choice is None:
        return {
            "skipped": "no hardware peaks: pass --peaks GPU (e.g. h100-sxm) or run "
            "`phaseprobe calibrate` and pass --peaks calibrated"
        }
    warnings: list[str] = []
    try:
        path = model_config_path(server_info, model_config)
        if path is None:
            return {"skipped": _unreachable(server_info)}
        mismatches = model_config_mismatches(path, server_info)
        if mismatches:
            if not force:
                return {
                    "skipped": describe(mismatches, str(path)),
                    "model_config_mismatches": [str(m) for m in mismatches],
                }
            warnings.append(f"{describe(mismatches, str(path))}; used anyway")
        dtype = served_dtype(path)
        peaks = resolve_peaks(peaks_choice, dtype)
        if peaks is None:
            return {"skipped": "no stored calibration: run `phaseprobe calibrate` first"}
        cost: ModelCost = model_cost_from_config(path)
    except PhaseprobeError as exc:
        return {"skipped": str(exc)}
    done = [r for r in runs if r.status != "error"]
    per_run = [roofline_for_run(r, cost, peaks) for r in done]
    phases: dict[str, Any] = {}
    for phase, bound_key, meas_key, kind in (
        ("decode", "decode_bound_s_per_token", "decode_measured_s_per_token", "memory"),
        ("prefill", "prefill_bound_s", "prefill_measured_s", None),
    ):
        ratio = median_or_none([getattr(r, f"{phase}_bound_ratio") for r in per_run])
        beaten = is_beaten(ratio) or any(getattr(r, f"{phase}_bound_beaten") for r in per_run)
        bound = median_or_none([getattr(r, bound_key) for r in per_run])
        measured = median_or_none([getattr(r, meas_key) for r in per_run])
        phases[bound_key], phases[meas_key] = bound, measured
        phases[f"{phase}_efficiency"] = None if beaten else ratio
        phases[f"{phase}_bound_ratio"] = ratio
        phases[f"{phase}_bound_beaten"] = beaten
        if beaten:
            k = kind or (per_run[0].prefill_bound_kind if per_run else None)
            warnings.append(bound_beaten_message(phase, bound, measured, k, peaks.origin))
    return {
        "peaks": peaks.origin,
        "peaks_dtype": dtype,
        "bound_model": BOUND_MODEL,
        "model_config": str(path),
        "decode_efficiency": phases["decode_efficiency"],
        "decode_bound_s_per_token": phases["decode_bound_s_per_token"],
        "decode_measured_s_per_token": phases["decode_measured_s_per_token"],
        "prefill_efficiency": phases["prefill_efficiency"],
        "prefill_bound_s": phases["prefill_bound_s"],
        "prefill_bound_kind": per_run[0].prefill_bound_kind if per_run else None,
        "prefill_measured_s": phases["prefill_measured_s"],
        "decode_bound_ratio": phases["decode_bound_ratio"],
        "prefill_bound_ratio": phases["prefill_bound_ratio"],
        "decode_bound_beaten": phases["decode_bound_beaten"],
        "prefill_bound_beaten": phases["prefill_bound_beaten"],
        "bound_beaten": phases["decode_bound_beaten"] or phases["prefill_bound_beaten"],
        "warnings": warnings,
        "runs": [{"seq": r.seq, **rl.to_dict()} for r, rl in zip(done, per_run)],
    }


def kv_reservation_report(
    store: Store, result: ProbeResult, *, model_config: str | None
) -> KvReservationDoc:
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
        store.gpu_samples(result.experiment_id),
        run_windows=run_windows(result.runs),
        cache=result.server_info.get("cache_config") or {},
        kv_bytes_per_token=kv_per_token,
    )
    return report.to_dict()
