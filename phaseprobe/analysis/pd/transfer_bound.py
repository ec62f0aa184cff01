"""The KV hand-over of disaggregated prefill/decode against its bound: the bytes a request's KV
cache must move, and how fast a measured run moved them compared with the link it crossed.

Pure arithmetic (no I/O): a model config dict (or a parsed :class:`ModelShape`) and token
counts in, typed results with ``to_dict()`` and a sentence that quotes the numbers out.

- **Bytes a request must move** = KV bytes per token (:func:`model_math.kv_bytes_per_token`:
  2 × layers × KV heads × head dim × bytes, or the MLA latent) × the tokens whose KV crosses:
  the prompt tokens when planning; for a measured run the decode instance's
  ``prompt_tokens_by_source{source="external_kv_transfer"}`` delta (``PdLegs.tokens_transferred``).
  Connectors move whole KV blocks: the ExampleConnector on the CPU build moved 384 of 474 prompt
  tokens (whole 128-token blocks of prompt − 1, :func:`block_aligned_tokens`) and wrote 256 B per
  token per layer, 512 B per token for the tiny model (2 layers × K,V × 2 KV heads × 32 × 2 B), plus
  an 88-byte safetensors header per layer file that is not counted here
  (research/fleet_pd.md).
- **The KV path of a measured run** = ``hand_over_s`` (where an asynchronous connector such as
  NIXL waits for the KV) + ``decode_prompt_s`` (where a synchronous one such as the
  ExampleConnector loads it inside the forward pass). The decode side's prompt work also computes
  the tokens that were not transferred (the last partial block), so the effective bandwidth
  bytes / KV path is a *lower* bound on the connector's real rate.
- **The link** (:data:`LINKS`): datasheet figures, always **one direction** (the KV flows from
  the prefill instance to the decode instance), in decimal GB/s (1e9 B/s) as vendors give them,
  or this machine's ``phaseprobe calibrate`` copy bandwidth (:func:`copy_link`).

A measured KV path shorter than the link's bound (bytes / link rate) is not "more than 100 % of
the link": it means the bound is wrong (the KV did not cross that link, or fewer bytes moved than
the config says, e.g. a KV cache in fp8), and the result says so instead of a percentage.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis import model_math as mm
from phaseprobe.errors import ConfigError
from phaseprobe.records import PdLegs, Run

__all__ = [
    "Link",
    "LINKS",
    "link",
    "link_keys",
    "copy_link",
    "kv_shape_bytes",
    "kv_bytes",
    "block_aligned_tokens",
    "TransferPlan",
    "plan_transfer",
    "LinkComparison",
    "compare",
    "KvPathRun",
    "KvPathReport",
    "kv_path_run",
    "kv_path_report",
]

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One link the KV can cross, at its one-direction peak."""

    key: str  # what ``plan --link`` takes
    name: str
    bytes_per_s: float  # ONE direction (prefill → decode)
    direction: str  # how the one-direction figure was obtained from the source's
    source: str

    @property
    def gb_s(self) -> float:
        """The one-direction rate in decimal GB/s (1e9 B/s)."""
        return self.bytes_per_s / GB

    def to_dict(self) -> dict[str, Any]:
        """The link as a JSON-ready dict (rates in B/s and GB/s)."""
        return {
            "key": self.key,
            "name": self.name,
            "bytes_per_s": self.bytes_per_s,
            "gb_s": self.gb_s,
            "direction": self.direction,
            "source": self.source,
        }


LINKS: tuple[Link, ...] = (
    # NVIDIA B200 / GB200 product pages: "Fifth-generation NVLink: 1.8 TB/s" per GPU, the sum
    # of both directions (18 links × 100 GB/s bidirectional).
    Link(
        "nvlink5",
        "NVLink 5 (Blackwell), per GPU",
        900 * GB,
        "1.8 TB/s bidirectional per GPU / 2",
        "NVIDIA Blackwell datasheet https://www.nvidia.com/en-us/data-center/dgx-b200/",
    ),
    # NVIDIA H100 datasheet: "NVLink: 900GB/s" (SXM), per GPU, both directions together
    # (18 NVLink 4 links × 50 GB/s bidirectional).
    Link(
        "nvlink4",
        "NVLink 4 (H100/H200 SXM), per GPU",
        450 * GB,
        "900 GB/s bidirectional per GPU / 2",
        "NVIDIA H100 Tensor Core GPU datasheet "
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    # NVIDIA A100 datasheet: "NVLink: 600GB/s" (SXM), per GPU, both directions together
    # (12 NVLink 3 links × 50 GB/s bidirectional).
    Link(
        "nvlink3",
        "NVLink 3 (A100 SXM), per GPU",
        300 * GB,
        "600 GB/s bidirectional per GPU / 2",
        "NVIDIA A100 Tensor Core GPU datasheet "
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    # PCI-SIG: PCIe 5.0 runs 32 GT/s per lane with 128b/130b encoding: 16 lanes × 32 GT/s ×
    # 128/130 / 8 = 63.0 GB/s per direction (the "~64 GB/s", "128 GB/s" bidirectional).
    Link(
        "pcie5",
        "PCIe Gen5 x16",
        16 * 32e9 * 128 / 130 / 8,
        "per direction (16 lanes × 32 GT/s × 128/130 / 8 bits)",
        "PCI-SIG PCI Express Base Specification 5.0 https://pcisig.com/specifications",
    ),
    # PCI-SIG: PCIe 4.0, 16 GT/s per lane, 128b/130b: 31.5 GB/s per direction ("~32 GB/s").
    Link(
        "pcie4",
        "PCIe Gen4 x16",
        16 * 16e9 * 128 / 130 / 8,
        "per direction (16 lanes × 16 GT/s × 128/130 / 8 bits)",
        "PCI-SIG PCI Express Base Specification 4.0 https://pcisig.com/specifications",
    ),
    # NVIDIA ConnectX-7 / Quantum-2 product briefs: InfiniBand NDR 400 Gb/s per port, each way.
    Link(
        "ib-ndr",
        "InfiniBand NDR (400 Gb/s), one port",
        400e9 / 8,
        "400 Gb/s per direction / 8 bits",
        "NVIDIA ConnectX-7 product brief https://www.nvidia.com/en-us/networking/"
        "infiniband-adapters/",
    ),
    # NVIDIA ConnectX-6 / Quantum product briefs: InfiniBand HDR 200 Gb/s per port, each way.
    Link(
        "ib-hdr",
        "InfiniBand HDR (200 Gb/s), one port",
        200e9 / 8,
        "200 Gb/s per direction / 8 bits",
        "NVIDIA ConnectX-6 product brief https://www.nvidia.com/en-us/networking/"
        "infiniband-adapters/",
    ),
    # IEEE 802.3bs-2017 (200GBASE / 400GBASE), full duplex: the rate each way.
    Link(
        "eth400",
        "400 GbE, one port",
        400e9 / 8,
        "400 Gb/s per direction / 8 bits",
        "IEEE 802.3bs-2017 https://standards.ieee.org/ieee/802.3bs/6100/",
    ),
    Link(
        "eth200",
        "200 GbE, one port",
        200e9 / 8,
        "200 Gb/s per direction / 8 bits",
        "IEEE 802.3bs-2017 https://standards.ieee.org/ieee/802.3bs/6100/",
    ),
    # IEEE 802.3ba-2010 (40/100 GbE), full duplex.
    Link(
        "eth100",
        "100 GbE, one port",
        100e9 / 8,
        "100 Gb/s per direction / 8 bits",
        "IEEE 802.3ba-2010 https://standards.ieee.org/ieee/802.3ba/4238/",
    ),
)


def link_keys() -> tuple[str, ...]:
    """The keys of :data:`LINKS`, what :func:`link` and ``plan --link`` take."""
    return tuple(lk.key for lk in LINKS)


def link(key: str) -> Link:
    """The datasheet link named ``key`` (``nvlink4``, ``pcie5``, ``ib-ndr``...)."""
    for lk in LINKS:
        if lk.key == key.strip().lower():
            return lk
    raise ConfigError(
        f"unknown link {key!r}; known: {', '.join(link_keys())} "
        f"(or 'copy': this machine's calibrated memory copy)"
    )


def copy_link(copy_gb_s: float, device_name: str, measured: str = "") -> Link:
    """This machine's memory copy as the link, from ``phaseprobe calibrate``'s best copy
    bandwidth (``Calibration.mem_bandwidth_best_gb_s``). That figure follows STREAM's copy
    convention, 2·n / time (n bytes read + n written), so copying n bytes of KV takes
    2·n / rate: the link carries half of it in KV bytes per second. On one machine the KV of a
    disk/shared-memory connector is copied at least once on the decode side (into the paged KV
    cache), so this bounds its rate."""
    if copy_gb_s <= 0:
        raise ConfigError(f"calibrated copy bandwidth must be > 0, got {copy_gb_s}")
    when = f", {measured}" if measured else ""
    return Link(
        "copy",
        f"memory copy on {device_name} (calibrated)",
        copy_gb_s * GB / 2,
        f"STREAM copy {copy_gb_s:.3g} GB/s (read + write) / 2",
        f"phaseprobe calibrate{when}",
    )


def kv_shape_bytes(
    model_config: Mapping[str, Any] | mm.ModelShape, kv_dtype: str = "auto"
) -> tuple[int, str]:
    """(KV bytes per token, how: the formula with its numbers) for a config dict as
    :func:`phaseprobe.sources.model_config.read_model_config` returns it, or a parsed shape.
    ``kv_dtype`` ``auto``: the model's activation dtype, as vLLM stores the KV cache by
    default."""
    shape = (
        model_config
        if isinstance(model_config, mm.ModelShape)
        else mm.parse_shape(dict(model_config))
    )
    elem = mm.kv_dtype_bytes(kv_dtype, mm.weight_format(shape))
    per_token = mm.kv_bytes_per_token(shape, elem)
    a = shape.attention
    if a.kind == "mla":
        how = (
            f"{shape.num_layers} layers × ({a.kv_lora_rank} + {a.qk_rope_head_dim}) latent "
            f"× {elem:g} B"
        )
    else:
        how = (
            f"2 (K, V) × {shape.num_layers} layers × {a.num_kv_heads} KV heads × "
            f"{a.head_dim} dim × {elem:g} B"
        )
    return per_token, how


def kv_bytes(bytes_per_token: int, tokens: float) -> int:
    """The KV bytes of ``tokens`` tokens (all layers)."""
    if bytes_per_token < 0 or tokens < 0:
        raise ConfigError(
            f"KV bytes need non-negative figures, got {bytes_per_token} B/token × {tokens} tokens"
        )
    return round(bytes_per_token * tokens)


def block_aligned_tokens(prompt_tokens: int, block_size: int) -> int:
    """The tokens a block-wise connector hands over: whole blocks of (prompt − 1) tokens (the
    decode instance computes the last token itself). Measured with the ExampleConnector on the
    CPU build, block size 128: 474 → 384, 397 → 384, under 129 → 0."""
    if block_size < 1:
        raise ConfigError(f"block size must be at least 1, got {block_size}")
    return max(0, prompt_tokens - 1) // block_size * block_size


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}".replace(".00 ", " ")
    return f"{n:,.0f} B"


def _rate(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bps) >= size:
            return f"{bps / size:,.3g} {unit}"
    return f"{bps:,.3g} B/s"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.3g} ms" if s >= 1e-3 else f"{s * 1e6:,.3g} µs"


@dataclass(frozen=True)
class TransferPlan:
    """The KV one request must move over one link, before measuring anything."""

    bytes_per_token: int
    tokens: int
    bytes: int
    link: Link
    seconds: float
    how: str = ""  # the bytes-per-token formula

    @property
    def sentence(self) -> str:
        """The plan in words: tokens × bytes per token = bytes, and the time (ms) over the link."""
        return (
            f"{self.tokens:,} tokens × {self.bytes_per_token:,} B "
            f"({_bytes(self.bytes_per_token)}/token) = {self.bytes:,} B "
            f"({_bytes(self.bytes)}): {_ms(self.seconds)} over {self.link.name} at "
            f"{_rate(self.link.bytes_per_s)} ({self.link.direction})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict (bytes, seconds), with the link and ``sentence``."""
        return {
            "bytes_per_token": self.bytes_per_token,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "link": self.link.to_dict(),
            "seconds": self.seconds,
            "how": self.how,
            "sentence": self.sentence,
        }


def plan_transfer(bytes_per_token: int, tokens: int, lk: Link, how: str = "") -> TransferPlan:
    """The bytes of ``tokens`` tokens of KV and the time they take over ``lk`` at its peak."""
    n = kv_bytes(bytes_per_token, tokens)
    return TransferPlan(bytes_per_token, tokens, n, lk, n / lk.bytes_per_s, how)


@dataclass(frozen=True)
class LinkComparison:
    """A measured KV path against one link: ``share`` = effective rate / link rate, None when
    the measurement beats the bound (then ``bound_wrong`` and the sentence says why)."""

    link: Link
    bound_s: float  # bytes / link rate: the shortest the KV path could be over this link
    measured_s: float
    share: float | None
    bound_wrong: bool

    @property
    def sentence(self) -> str:
        """The comparison in words: the share of the link's rate, or why its bound is wrong
        (times in ms or µs)."""
        if self.bound_wrong:
            return (
                f"the KV path took {_ms(self.measured_s)}, less than the {_ms(self.bound_s)} "
                f"its bytes need over {self.link.name} at {_rate(self.link.bytes_per_s)}: "
                f"that bound is wrong (the KV did not cross this link, or fewer bytes moved "
                f"than the config's KV per token says), so no share of the link is given"
            )
        assert self.share is not None
        return (
            f"{self.share:.1%} of {self.link.name} ({_rate(self.link.bytes_per_s)}, "
            f"{self.link.direction}): its bound is {_ms(self.bound_s)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict (times in s, rates in B/s, ``share`` a fraction)."""
        return {
            "link": self.link.key,
            "link_name": self.link.name,
            "link_bytes_per_s": self.link.bytes_per_s,
            "bound_s": self.bound_s,
            "measured_s": self.measured_s,
            "share": self.share,
            "bound_wrong": self.bound_wrong,
            "sentence": self.sentence,
        }


def compare(n_bytes: int, measured_s: float, lk: Link) -> LinkComparison:
    """``n_bytes`` moved in ``measured_s`` against ``lk`` (a measured time under the link's
    bound is a wrong bound, never a share > 100 %)."""
    bound = n_bytes / lk.bytes_per_s
    if measured_s <= 0 or measured_s < bound:
        return LinkComparison(lk, bound, measured_s, None, True)
    return LinkComparison(lk, bound, measured_s, bound / measured_s, False)


@dataclass(frozen=True)
class KvPathRun:
    """One measured P/D request's KV path. ``bytes``/``effective_bytes_per_s`` None (with
    ``note`` saying why) when no KV was transferred or the figures were not measured."""

    seq: int | None
    kv: str  # the PdLegs verdict: transferred, partial, recomputed, cached, unknown
    tokens_transferred: float | None
    bytes: int | None
    hand_over_s: float | None
    decode_prompt_s: float | None
    kv_path_s: float | None
    effective_bytes_per_s: float | None
    comparisons: tuple[LinkComparison, ...]
    note: str

    @property
    def sentence(self) -> str:
        """The run's KV bytes, KV path (hand-over + decode-side prompt work) and effective rate,
        against each link, in words; ``note`` alone when no rate was measured."""
        if self.effective_bytes_per_s is None:
            return self.note
        assert self.bytes is not None and self.kv_path_s is not None
        head = (
            f"{self.tokens_transferred:,.0f} tokens' KV = {self.bytes:,} B "
            f"({_bytes(self.bytes)}) over a KV path of {_ms(self.kv_path_s)} (hand-over "
            f"{_ms(self.hand_over_s or 0.0)} + decode-side prompt work "
            f"{_ms(self.decode_prompt_s or 0.0)}) = {_rate(self.effective_bytes_per_s)} "
            f"effective, at least"
        )
        tail = "; ".join(c.sentence for c in self.comparisons)
        return head + (f"; {tail}" if tail else "") + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        """The run as a JSON-ready dict (bytes, times in s, rates in B/s), comparisons included."""
        return {
            "seq": self.seq,
            "kv": self.kv,
            "tokens_transferred": self.tokens_transferred,
            "bytes": self.bytes,
            "hand_over_s": self.hand_over_s,
            "decode_prompt_s": self.decode_prompt_s,
            "kv_path_s": self.kv_path_s,
            "effective_bytes_per_s": self.effective_bytes_per_s,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "note": self.note,
            "sentence": self.sentence,
        }


def kv_path_run(
    pd: PdLegs, bytes_per_token: int, links: Sequence[Link] = (), seq: int | None = None
) -> KvPathRun:
    """One request's effective KV transfer bandwidth = its transferred tokens' KV bytes over its
    KV path (hand-over + decode-side prompt work), against each of ``links``."""

    def empty(note: str, n: int | None = None) -> KvPathRun:
        return KvPathRun(
            seq,
            pd.kv,
            pd.tokens_transferred,
            n,
            pd.hand_over_s,
            pd.decode_prompt_s,
            None,
            None,
            (),
            note,
        )

    if pd.decode_isolated is False or pd.kv == "unknown":
        return empty(f"not judged: its transferred tokens cannot be told ({pd.kv_reason})")
    if not pd.tokens_transferred:
        return empty(f"no KV crossed: {pd.kv} ({pd.kv_reason})")
    n = kv_bytes(bytes_per_token, pd.tokens_transferred)
    if pd.hand_over_s is None and pd.decode_prompt_s is None:
        return empty(
            f"{n:,} B transferred, but neither the hand-over nor the decode side's "
            f"prompt work was measured",
            n,
        )
    path = (pd.hand_over_s or 0.0) + (pd.decode_prompt_s or 0.0)
    note = ""
    if pd.tokens_computed:
        note = (
            f"the decode side's prompt work also computed {pd.tokens_computed:,.0f} tokens "
            f"itself, so the connector's own rate is higher"
        )
    if path <= 0:
        return KvPathRun(
            seq,
            pd.kv,
            pd.tokens_transferred,
            n,
            pd.hand_over_s,
            pd.decode_prompt_s,
            path,
            None,
            tuple(compare(n, path, lk) for lk in links),
            f"{n:,} B transferred in a KV path measured as 0 s: no rate",
        )
    return KvPathRun(
        seq,
        pd.kv,
        pd.tokens_transferred,
        n,
        pd.hand_over_s,
        pd.decode_prompt_s,
        path,
        n / path,
        tuple(compare(n, path, lk) for lk in links),
        note,
    )


@dataclass(frozen=True)
class KvPathReport:
    """Every P/D run's KV path, and their median against each link."""

    bytes_per_token: int
    how: str
    links: tuple[Link, ...]
    runs: tuple[KvPathRun, ...]
    median_bytes: float | None
    median_kv_path_s: float | None
    median_effective_bytes_per_s: float | None
    comparisons: tuple[LinkComparison, ...]  # the median bytes over the median KV path

    @property
    def measured(self) -> tuple[KvPathRun, ...]:
        """The runs with an effective rate (a KV transfer and a KV path longer than 0 s)."""
        return tuple(r for r in self.runs if r.effective_bytes_per_s is not None)

    @property
    def sentence(self) -> str:
        """The report in words: the KV bytes per token, the medians over the measured runs and
        each link's share, or why no run could be measured."""
        if not self.runs:
            return "no P/D runs: nothing crossed between a prefill and a decode instance"
        done = self.measured
        if not done:
            return (
                f"no run of {len(self.runs)} has a KV transfer to set against a link: "
                f"{self.runs[0].note}"
            )
        assert self.median_effective_bytes_per_s is not None
        assert self.median_bytes is not None and self.median_kv_path_s is not None
        head = (
            f"KV {self.bytes_per_token:,} B/token ({self.how}); median over {len(done)} of "
            f"{len(self.runs)} runs: {self.median_bytes:,.0f} B in a "
            f"{_ms(self.median_kv_path_s)} KV path = "
            f"{_rate(self.median_effective_bytes_per_s)} effective, at least"
        )
        tail = "; ".join(c.sentence for c in self.comparisons)
        return head + (f"; {tail}" if tail else "")

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (bytes, times in s, rates in B/s)."""
        return {
            "bytes_per_token": self.bytes_per_token,
            "how": self.how,
            "links": [lk.to_dict() for lk in self.links],
            "runs": [r.to_dict() for r in self.runs],
            "measured_runs": len(self.measured),
            "median_bytes": self.median_bytes,
            "median_kv_path_s": self.median_kv_path_s,
            "median_effective_bytes_per_s": self.median_effective_bytes_per_s,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "sentence": self.sentence,
        }


def kv_path_report(
    runs: Iterable[Run],
    model_config: Mapping[str, Any] | mm.ModelShape,
    links: Sequence[Link] = (),
    kv_dtype: str = "auto",
) -> KvPathReport:
    """The KV path of every run served by a prefill/decode pair (``run.pd`` set; failed runs
    left out). ``model_config``: the served model's config dict (``read_model_config``'s
    first value) or its parsed shape; ``links``: what to set the KV path against (datasheet
    :func:`link` rows, :func:`copy_link` from a calibration)."""
    per_token, how = kv_shape_bytes(model_config, kv_dtype)
    rows = tuple(
        kv_path_run(r.pd, per_token, links, r.seq)
        for r in runs
        if r.pd is not None and r.status == "ok"
    )
    done = [r for r in rows if r.effective_bytes_per_s is not None]
    if not done:
        return KvPathReport(per_token, how, tuple(links), rows, None, None, None, ())
    med_bytes = statistics.median(r.bytes or 0 for r in done)
    med_path = statistics.median(r.kv_path_s or 0.0 for r in done)
    med_rate = statistics.median(r.effective_bytes_per_s or 0.0 for r in done)
    comps = tuple(compare(round(med_bytes), med_path, lk) for lk in links)
    return KvPathReport(per_token, how, tuple(links), rows, med_bytes, med_path, med_rate, comps)
