"""``phaseprobe plan``: the memory budget of a model from its config.json, before serving it.

    phaseprobe plan --config ~/models/Llama-3-70B --gpu-mem-gb 80 --gpus 8 --concurrent 32
    phaseprobe plan --config config.json --gpu-mem-gb 80 --kv-dtype fp8 --bandwidth-tbs 3.35
    phaseprobe plan --config config.json --gpu-mem-gb 80 --kv-transfer 4096 --link nvlink4

Prints the weights, KV bytes per token, the KV budget left beside them, the longest context
each of the concurrent users can hold, users per context length, FLOPs per token, and (with
``--bandwidth-tbs``) the memory-bandwidth floor of a decode step; with ``--kv-transfer P``, the
KV bytes one request of P prompt tokens must move from a prefill to a decode instance
(disaggregated serving) and the time that takes over each ``--link`` (datasheet peaks, one
direction; ``copy``: this machine's ``phaseprobe calibrate`` memory copy). Memory is in GiB
(2³⁰ bytes: an "80 GB" card holds about 80 GiB); bandwidth in decimal TB/s, as data sheets give
it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis import capacity as cap
from phaseprobe.analysis import model_math as mm
from phaseprobe.analysis.pd import transfer_bound as kvt
from phaseprobe.collect.model_config import model_shape_from_config
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in

__all__ = ["register", "run", "plan_document"]

_KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bf16", "fp16", "fp32")


def register(subparsers: Any) -> None:
    """Add the ``plan`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "plan",
        help="memory budget from a config.json: weights, KV per token, max context "
        "per user, decode floor",
        description="Model arithmetic from a Hugging Face config.json (a file or a model "
        "directory): parameters, weight bytes, KV cache bytes per token (GQA/MQA/"
        "MLA aware), the KV budget on the given GPUs and the longest context each "
        "concurrent user can keep. Memory in GiB; bandwidth in TB/s.",
    )
    p.add_argument(
        "--config",
        required=True,
        metavar="PATH",
        help="config.json, or a model directory holding one",
    )
    p.add_argument(
        "--gpu-mem-gb",
        required=True,
        type=float_in(0, 1e5, lo_open=True),
        metavar="G",
        help="memory of one GPU in GiB (e.g. 80 for an H100 80GB)",
    )
    p.add_argument(
        "--gpus",
        type=int_in(1, 65_536),
        default=1,
        metavar="N",
        help="GPUs holding one model copy (tensor parallel; default: 1)",
    )
    p.add_argument(
        "--concurrent",
        type=int_in(1, 10_000_000),
        default=1,
        metavar="U",
        help="users served at once, each with its own context (default: 1)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="weight dtype: fp32, bf16, fp16, fp8, int8, int4 (default: the "
        "config's quantization_config, else its torch dtype)",
    )
    p.add_argument(
        "--kv-dtype",
        default="auto",
        choices=_KV_DTYPES,
        help="KV cache dtype (auto: the model's activation dtype, as vLLM)",
    )
    p.add_argument(
        "--gpu-util",
        type=float_in(0, 1, lo_open=True),
        default=0.9,
        metavar="F",
        help="vLLM --gpu-memory-utilization (default: 0.9)",
    )
    p.add_argument(
        "--reserve-gb",
        type=float_in(0, 1e5),
        default=2.0,
        metavar="G",
        help="per GPU, for activations, CUDA graphs and non-torch memory "
        "(default: 2 GiB; vLLM measures the real peak at start-up)",
    )
    p.add_argument(
        "--context",
        type=int_in(1, 100_000_000),
        default=None,
        metavar="C",
        help="context length for FLOPs and the decode floor (default: the plan's "
        "max context per user, capped at the model's maximum)",
    )
    p.add_argument(
        "--bandwidth-tbs",
        type=float_in(0, 1e3, lo_open=True),
        default=None,
        metavar="X",
        help="HBM bandwidth of ONE GPU in TB/s (H100 SXM: 3.35): adds the decode floor per token",
    )
    p.add_argument(
        "--kv-transfer",
        type=int_in(0, 100_000_000),
        default=None,
        metavar="P",
        help="disaggregated prefill/decode: the KV bytes one request of P prompt "
        "tokens must move to the decode instance, and the time over each --link",
    )
    p.add_argument(
        "--link",
        action="append",
        default=None,
        metavar="LINK",
        choices=(*kvt.link_keys(), "copy"),
        help=f"with --kv-transfer, the link the KV crosses (repeatable; default: "
        f"all): {', '.join(kvt.link_keys())} (datasheet, one direction), or "
        f"copy (this machine's calibrated memory copy)",
    )
    p.add_argument(
        "--kv-block-size",
        type=int_in(1, 1_000_000),
        default=None,
        metavar="B",
        help="with --kv-transfer, count only whole blocks of P - 1 tokens, as "
        "block-wise connectors hand them over (ExampleConnector on the CPU "
        "build: 128; 474 prompt tokens -> 384)",
    )
    p.add_argument(
        "--metrics",
        default=None,
        metavar="URL|FILE",
        help="a running server's /metrics (URL, or a saved page): read vLLM's KV "
        "block residency histograms (vLLM 0.32 --kv-cache-metrics) and say "
        "whether its prefix cache evicts blocks before they are reused",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def _kv_residency(source: str | None) -> dict[str, Any] | None:
    """The served cache's KV residency (totals since the server started), from --metrics."""
    if source is None:
        return None
    from phaseprobe.analysis.kv_residency import kv_residency, residency_line, snapshot_buckets
    from phaseprobe.collect.metrics_view import load_metrics
    from phaseprobe.redact import redact_url

    snap = load_metrics(source)
    res = kv_residency(snapshot_buckets(snap))
    return {
        "source": redact_url(source),
        **res.numbers(),
        "evicted_before_reuse": res.evicted_before_reuse,
        "said": residency_line(res),
    }


def plan_document(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the plan as a JSON-ready dict (bytes, tokens, FLOPs, seconds)."""
    shape, source = model_shape_from_config(args.config)
    params = mm.count_params(shape)
    fmt = mm.weight_format(shape, args.dtype)
    weights = mm.weight_bytes(params, fmt)
    kv_elem = mm.kv_dtype_bytes(args.kv_dtype, fmt)
    kv_token = mm.kv_bytes_per_token(shape, kv_elem)
    plan = cap.plan_capacity(
        shape,
        weights,
        kv_token,
        gpu_mem_bytes=int(args.gpu_mem_gb * cap.GIB),
        gpus=args.gpus,
        concurrent_users=args.concurrent,
        gpu_memory_utilization=args.gpu_util,
        reserve_bytes_per_gpu=int(args.reserve_gb * cap.GIB),
    )
    if args.context is not None:
        context, context_from = args.context, "--context"
    else:
        context = plan.max_context_per_user_tokens
        context_from = "max context per user"
        if shape.max_context_tokens and context > shape.max_context_tokens:
            context, context_from = shape.max_context_tokens, "model maximum"
        if context <= 0:  # nothing fits: FLOPs "of 0 tokens" would say nothing
            context = min(shape.max_context_tokens or 2048, 2048)
            context_from = "2,048 or the model maximum: no KV fits, pass --context"
    doc: dict[str, Any] = {
        "config": source,
        "model_type": shape.model_type,
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "attention": asdict(shape.attention),
        "moe": asdict(shape.moe) if shape.moe else None,
        "params": {
            **asdict(params),
            "total": params.total,
            "active": params.active,
            "matmul_active": params.matmul_active,
        },
        "weights": {
            **asdict(fmt),
            "bytes": weights,
            "active_bytes": mm.weight_bytes(params, fmt, active_only=True),
        },
        "kv": {"dtype": args.kv_dtype, "bytes_per_element": kv_elem, "bytes_per_token": kv_token},
        "plan": {**asdict(plan), "fits": plan.fits},
        "context_tokens": context,
        "context_from": context_from,
        "flops": {
            "decode_per_token": mm.decode_flops_per_token(shape, params, context),
            "prefill_of_context": mm.prefill_flops(shape, params, context),
        },
        "decode_floor": None,
    }
    if args.bandwidth_tbs is not None:
        # Tensor parallel: each GPU reads its shard at once, so bandwidths add up; replicated
        # KV heads are read on every GPU holding a copy.
        bandwidth = args.bandwidth_tbs * 1e12 * args.gpus
        replicated = kv_token * plan.kv_replication
        floors = [
            cap.decode_floor(
                mm.decode_weight_bytes(params, fmt, shape, batch),
                bandwidth,
                kv_token_bytes=replicated,
                context_tokens=context,
                batch_size=batch,
            )
            for batch in sorted({1, args.concurrent})
        ]
        doc["decode_floor"] = [
            {**asdict(f), "tokens_per_s_ceiling": f.tokens_per_s_ceiling} for f in floors
        ]
    doc["kv_transfer"] = _kv_transfer(args, kv_token, shape)
    doc["kv_residency"] = _kv_residency(getattr(args, "metrics", None))
    return doc


def _links(keys: list[str] | None) -> list[kvt.Link]:
    """The chosen links (every datasheet row when none); ``copy`` from the stored calibration."""
    out = []
    for key in keys or kvt.link_keys():
        if key != "copy":
            out.append(kvt.link(key))
            continue
        from phaseprobe import calibrate  # reads the calibration file only when asked

        cal = calibrate.load()
        if cal is None:
            raise ConfigError(
                "--link copy needs this machine's memory copy bandwidth: run "
                "`phaseprobe calibrate` first"
            )
        out.append(kvt.copy_link(cal.mem_bandwidth_best_gb_s, cal.device_name))
    return list(dict.fromkeys(out))


def _kv_transfer(
    args: argparse.Namespace, kv_token: int, shape: mm.ModelShape
) -> dict[str, Any] | None:
    prompt = getattr(args, "kv_transfer", None)
    block = getattr(args, "kv_block_size", None)
    if prompt is None:
        if getattr(args, "link", None) or block is not None:
            raise ConfigError(
                "--link and --kv-block-size need --kv-transfer P (the prompt tokens whose KV moves)"
            )
        return None
    tokens = prompt if block is None else kvt.block_aligned_tokens(prompt, block)
    _, how = kvt.kv_shape_bytes(shape, args.kv_dtype)
    plans = [
        kvt.plan_transfer(kv_token, tokens, lk, how) for lk in _links(getattr(args, "link", None))
    ]
    return {
        "prompt_tokens": prompt,
        "block_size": block,
        "tokens": tokens,
        "bytes_per_token": kv_token,
        "how": how,
        "bytes": kvt.kv_bytes(kv_token, tokens),
        "links": [p.to_dict() for p in plans],
    }


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """The handler: ``(args, out, err) -> exit code`` (1 when the weights do not fit)."""
    doc = plan_document(args)
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        _render(out, doc)
        if doc["kv_residency"] is not None:
            style = "red" if doc["kv_residency"]["evicted_before_reuse"] else "dim"
            out.print(f"[{style}]{escape(doc['kv_residency']['said'])}", highlight=False)
    if not doc["plan"]["fits"]:
        err.print(
            "[yellow]the weights and the reserve leave no room for KV cache: more GPUs, "
            "a smaller --dtype or a lower --reserve-gb"
        )
        return 1
    return 0


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def _flops(n: float) -> str:
    """FLOPs with SI prefixes: ``160.48 GFLOP`` (a bare "B" would read as bytes)."""
    for unit, size in (
        ("PFLOP", 1e15),
        ("TFLOP", 1e12),
        ("GFLOP", 1e9),
        ("MFLOP", 1e6),
        ("kFLOP", 1e3),
    ):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} FLOP"


def _budget_row(plan: dict[str, Any]) -> tuple[str, str]:
    """The KV budget, or by how much the weights and the reserve overrun the usable memory."""
    if plan["kv_budget_bytes"] > 0:
        return _bytes(plan["kv_budget_bytes"]), "usable − weights − reserve"
    short = plan["weight_bytes"] + plan["reserve_bytes"] - plan["usable_bytes"]
    return (
        f"none: short by {_bytes(short)}",
        f"weights {_bytes(plan['weight_bytes'])} + reserve {_bytes(plan['reserve_bytes'])} "
        f"> usable {_bytes(plan['usable_bytes'])}: more GPUs (--gpus), a smaller --dtype, "
        f"or larger GPUs",
    )


def _count(n: float) -> str:
    for unit, size in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f}"


def _render(out: Console, doc: dict[str, Any]) -> None:
    p, plan, w, kv = doc["params"], doc["plan"], doc["weights"], doc["kv"]
    a = doc["attention"]
    table = Table(
        title=escape(f"{doc['config']}  ({doc['model_type']}, {a['kind'].upper()})"),
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("how", style="dim")
    active = f"; {_count(p['active'])} active per token" if doc["moe"] else ""
    table.add_row("parameters", f"{_count(p['total'])}", f"{p['total']:,} parameters{active}")
    table.add_row(
        "weights",
        _bytes(w["bytes"]),
        f"{w['name']} linear layers ({w['source']}), {w['base_dtype']} embeddings",
    )
    layers, elem = doc["num_layers"], f"{kv['bytes_per_element']:g} B ({kv['dtype']})"
    if a["kind"] == "mla":
        how = f"{layers} layers × ({a['kv_lora_rank']} + {a['qk_rope_head_dim']}) latent × {elem}"
    else:
        how = (
            f"2 (K, V) × {layers} layers × {a['num_kv_heads']} KV heads × {a['head_dim']} "
            f"dim × {elem}"
        )
    table.add_row(
        "KV per token", _bytes(kv["bytes_per_token"]), f"{kv['bytes_per_token']:,} B = {how}"
    )
    gib = plan["gpu_mem_bytes_each"] / (1 << 30)
    table.add_row(
        "usable memory",
        _bytes(plan["usable_bytes"]),
        f"{plan['gpus']} × {gib:g} GiB × {plan['gpu_memory_utilization']:g}",
    )
    table.add_row(
        "reserve",
        _bytes(plan["reserve_bytes"]),
        f"{plan['gpus']} × {_bytes(plan['reserve_bytes_per_gpu'])}",
    )
    table.add_row("KV budget", *_budget_row(plan))
    rep = plan["kv_replication"]
    table.add_row(
        "KV capacity",
        f"{plan['kv_capacity_tokens']:,} tokens",
        f"budget / KV per token{f' × {rep} copies (GPUs > KV heads)' if rep > 1 else ''}",
    )
    limit = plan["model_max_context_tokens"]
    note = f"; model maximum {limit:,}" if limit else ""
    n = plan["concurrent_users"]
    table.add_row(
        f"max context per user ({n} user{'s' if n > 1 else ''})",
        f"{plan['max_context_per_user_tokens']:,} tokens",
        f"capacity / users{note}",
    )
    c = doc["context_tokens"]
    table.add_row(
        f"decode FLOPs per token @ {c:,}",
        _flops(doc["flops"]["decode_per_token"]),
        f"2 × {_count(p['matmul_active'])} parameters + attention (context from "
        f"{doc['context_from']})",
    )
    table.add_row(
        f"prefill FLOPs of {c:,} tokens",
        _flops(doc["flops"]["prefill_of_context"]),
        "2 × weights × P + causal attention",
    )
    for f in doc["decode_floor"] or []:
        table.add_row(
            f"decode floor, batch {f['batch_size']} @ {c:,}",
            f"{f['step_floor_s'] * 1e3:.2f} ms/step",
            f"({_bytes(f['weight_bytes_read'])} weights + {_bytes(f['kv_bytes_read'])}"
            f" KV) / {f['bandwidth_bytes_per_s'] / 1e12:g} TB/s; ≤ "
            f"{f['tokens_per_s_ceiling']:,.0f} tokens/s",
        )
    out.print(table)
    users = Table(title="users per context length (KV only)", title_justify="left")
    users.add_column("context", justify="right")
    users.add_column("users", justify="right")
    for row in plan["users_at_context"]:
        over = " (over the model maximum)" if limit and row["context_tokens"] > limit else ""
        users.add_row(f"{row['context_tokens']:,}{over}", f"{row['users']:,}")
    out.print(users)
    if doc.get("kv_transfer"):
        _render_kv_transfer(out, doc["kv_transfer"])


def _seconds(s: float) -> str:
    return f"{s * 1e3:,.3g} ms" if s >= 1e-3 else f"{s * 1e6:,.3g} µs"


def _render_kv_transfer(out: Console, kv: dict[str, Any]) -> None:
    per = kv["bytes_per_token"]
    block = (
        f" (whole blocks of {kv['block_size']} of {kv['prompt_tokens']:,} − 1)"
        if kv["block_size"]
        else ""
    )
    title = (
        f"KV each request must move: {_bytes(per).replace('.00 ', ' ')}/token ({per:,} B"
        f" = {kv['how']}) × {kv['tokens']:,} tokens{block} = {kv['bytes']:,} B "
        f"({_bytes(kv['bytes'])})"
    )
    table = Table(title=escape(title), title_justify="left")
    table.add_column("link")
    table.add_column("GB/s, one way", justify="right")
    table.add_column("time", justify="right")
    table.add_column("figure", style="dim")
    for p in kv["links"]:
        lk = p["link"]
        table.add_row(
            escape(f"{lk['key']}: {lk['name']}"),
            f"{lk['gb_s']:,.3g}",
            _seconds(p["seconds"]),
            escape(lk["direction"]),
        )
    out.print(table)
