"""Build vLLM-shaped /metrics exposition text for unit tests (tests write their own fixtures)."""

from __future__ import annotations

PHASES = {
    "request_queue_time_seconds": 0.0,
    "request_prefill_time_seconds": 0.0,
    "request_decode_time_seconds": 0.0,
    "request_inference_time_seconds": 0.0,
    "time_to_first_token_seconds": 0.0,
    "e2e_request_latency_seconds": 0.0,
}


def exposition(
    *,
    sums: dict[str, float],
    count: float,
    prompt_tokens: float = 0.0,
    generation_tokens: float = 0.0,
    running: float = 0.0,
    waiting: float = 0.0,
    model: str = "tiny",
    prefix: str = "vllm:",
    itl_name: str = "inter_token_latency_seconds",
    kv_name: str = "kv_cache_usage_perc",
    counter_suffix: str = "_total",
    counts: dict[str, float] | None = None,
) -> str:
    """Histograms with one +Inf bucket are enough for the parser and for _sum/_count deltas."""
    lab = f'engine="0",model_name="{model}"'
    lines: list[str] = []
    for base in list(PHASES) + [itl_name]:
        name = prefix + base
        c = (counts or {}).get(base, count)
        lines += [
            f"# HELP {name} h",
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{lab},le="+Inf"}} {c}',
            f"{name}_sum{{{lab}}} {sums.get(base, 0.0)}",
            f"{name}_count{{{lab}}} {c}",
        ]
    for base, value in (("prompt_tokens", prompt_tokens), ("generation_tokens", generation_tokens)):
        name = prefix + base
        lines += [
            f"# HELP {name} c",
            f"# TYPE {name} counter",
            f"{name}{counter_suffix}{{{lab}}} {value}",
        ]
    for base, value in (
        ("num_requests_running", running),
        ("num_requests_waiting", waiting),
        (kv_name, 0.01),
    ):
        name = prefix + base
        lines += [f"# HELP {name} g", f"# TYPE {name} gauge", f"{name}{{{lab}}} {value}"]
    info = prefix + "cache_config_info"
    lines += [
        f"# HELP {info} i",
        f"# TYPE {info} gauge",
        f'{info}{{block_size="128",engine="0",num_gpu_blocks="1000"}} 1.0',
    ]
    lines += [
        "# HELP process_cpu_seconds_total c",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 3.5",
    ]
    return "\n".join(lines) + "\n"
