"""The capacity alert's threshold: the largest rate one instance serves within the SLO, from
the newest capacity fit in the store (``phaseprobe model fit``), for the request lengths the
operator names. ``alerts build --capacity`` calls it; the rule compares each instance's
finished-request rate with it."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.errors import ConfigError, PhaseprobeError

__all__ = ["largest_slo_rate"]


def largest_slo_rate(
    store_path: Path,
    prompt_tokens: int,
    output_tokens: int,
    ttft_s: float | None,
    tpot_s: float | None,
    share: float = 0.9,
) -> tuple[float, str]:
    """(rate in requests/s, where it came from in words). ConfigError when there is no fit,
    no target, or no rate meets the SLO."""
    from phaseprobe.analysis.capacity_model.slo import Slo, largest_rate
    from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
    from phaseprobe.collect.capacity.model_fit import FIT_KIND, load_fit
    from phaseprobe.store import Store

    if ttft_s is None and tpot_s is None:
        raise ConfigError("--capacity needs --slo ttft=…,tpot=… (the targets the rate meets)")
    if not store_path.is_file():
        raise ConfigError(f"--capacity: no experiment store at {store_path} (model fit first)")
    try:
        with Store(store_path, readonly=True) as store:
            if not store.analyses(FIT_KIND):
                raise ConfigError(
                    f"--capacity: no capacity fit in {store_path} (run `phaseprobe model fit`)"
                )
            fit = load_fit(store)
    except ConfigError:
        raise
    except PhaseprobeError as exc:
        raise ConfigError(f"--capacity: {exc}") from None
    spec = WorkloadSpec(prompt=Fixed(prompt_tokens), output=Fixed(output_tokens), n=600)
    found = largest_rate(spec.at, fit.cost, fit.limits, Slo(ttft_s, tpot_s, share), fit.overheads)
    targets = ", ".join(
        f"{k} ≤ {v * 1e3:g} ms" for k, v in (("TTFT", ttft_s), ("TPOT", tpot_s)) if v is not None
    )
    if found.rate is None:
        raise ConfigError(
            f"--capacity: the model (fit #{fit.analysis_id}) finds no rate at which {share:.0%} "
            f"of {prompt_tokens} → {output_tokens}-token requests meet {targets}"
        )
    source = (
        f"capacity fit #{fit.analysis_id} for {prompt_tokens} → {output_tokens}-token requests, "
        f"{share:.0%} within {targets}"
    )
    return found.rate, source
