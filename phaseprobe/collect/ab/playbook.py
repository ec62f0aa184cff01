"""A/B playbooks: TOML data (stdlib ``tomllib``), read and validated before anything starts.

A playbook is the run spec every arm shares plus exactly two arms (A is the baseline, B the
variant)::

    name = "cpu-dtype"
    description = "what this A/B tests"
    model = "local"                 # "local": phaseprobe's embedded tiny model on the CPU vLLM

    [run]
    prompt_tokens = 64              # or: prompt = "fixed text"
    max_tokens = 32
    runs = 12                       # measured runs per arm (fixed-N mode)
    until_decided = true            # or: sequential mode, pairs until the primary is decided
    max_runs = 60                   #   its budget: runs per arm ...
    max_minutes = 20                #   ... and measuring minutes (either ends it)
    primary = "decode"              #   the metric that decides: decode, prefill, or a metric
    warmup = 2                      # per arm, after its server is up
    api = "completions"             # or "chat"
    order = "interleaved"           # A B B A A B ...; or "blocks" (randomised A B / B A blocks)
    min_effect = "5%"
    pause_s = 0.0                   # quiet time before each run

    [[arm]]
    name = "bf16"
    launch = { args = ["--dtype", "bfloat16"], env = { VLLM_CPU_KVCACHE_SPACE = "1" } }

    [[arm]]
    name = "remote"
    endpoint = "http://10.0.0.5:8000"   # already up; model is its served name
    # behind a router: its replicas, each read on its own /metrics (runs name their replica)
    replicas = ["r1=http://10.0.0.6:8000", "r2=http://10.0.0.7:8000"]

An arm can be a disaggregated prefill/decode pair: ``prefill = "URL"`` and ``decode = "URL"``
(each instance's own base URL; ``endpoint``, when given, is a router in P/D mode in front of
them, else phaseprobe sends the two legs itself), or ``launch = { pd = true }``: a local pair
of the embedded tiny model handing KV over with vLLM's ExampleConnector (``router = true``
puts the real vllm-router in P/D mode in front). Its runs keep both legs and whether the
KV moved (:mod:`phaseprobe.collect.pd.collector`).

A launch is an argv list, never a shell string: playbooks are data, nothing in them is handed
to a shell. Every mistake raises :class:`PlaybookError` naming the file and the key.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from phaseprobe.analysis.ab.sequential import SequentialPlan, check_primary
from phaseprobe.errors import ConfigError
from phaseprobe.inputs import PLAYBOOK_CAP, read_input_text
from phaseprobe.records import ArmLaunch, RedactedArm
from phaseprobe.redact import is_secret_env_name, redact_url, redact_urls_in, register_secret
from phaseprobe.store import AbSessionRow

# Only a P/D arm needs its pair's topology; the URL and replica parsers live beside the HTTP
# clients (requests): they load when a playbook names a URL, not for `ab --help`.
if TYPE_CHECKING:
    from phaseprobe.collect.fleet.targets import ReplicaTarget
    from phaseprobe.collect.pd.topology import PdTopology

__all__ = [
    "PlaybookError",
    "Launch",
    "Arm",
    "RunPlan",
    "Playbook",
    "load_playbook",
    "parse_playbook",
    "parse_effect",
    "session_arms",
    "session_plan",
    "is_secret_name",
    "is_secret_value",
    "redact_env",
    "redact_args",
    "redacted_arm",
    "redacted_text",
    "restore_secrets",
    "REDACTED",
    "LOCAL_MODEL",
    "shipped_playbooks",
]

LOCAL_MODEL = "local"  # the embedded tiny model served by phaseprobe's CPU vLLM
_TOP_KEYS = {"name", "description", "model", "run", "arm"}
MAX_RUNS = 100_000  # runs per arm, as --runs/--max-runs allow
_MAX_COUNT = 10**9  # any other count (tokens, warm-ups, seeds): far beyond use, inside int64
_MAX_SECONDS = 7 * 24 * 3600.0  # a week, as every --timeout-like option allows


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


_RUN_KEYS = {
    "prompt",
    "prompt_tokens",
    "max_tokens",
    "runs",
    "warmup",
    "api",
    "order",
    "block_size",
    "seed",
    "min_effect",
    "ignore_eos",
    "timeout_s",
    "deadline_s",
    "pause_s",
    "until_decided",
    "max_runs",
    "max_minutes",
    "primary",
}
_ARM_KEYS = {"name", "description", "model", "endpoint", "launch", "replicas", "prefill", "decode"}
_LAUNCH_KEYS = {"command", "args", "env", "startup_timeout_s", "pd", "router"}
# phaseprobe chooses where a launched server listens (127.0.0.1, a free port).
_RESERVED_ARGS = {"--host", "--port"}
# ... and, for a launched prefill/decode pair, how the two instances hand KV over.
_RESERVED_PD_ARGS = {"--kv-transfer-config"}


class PlaybookError(ConfigError):
    """A playbook that cannot be used; ``key`` is the dotted TOML key at fault."""

    def __init__(self, path: str, key: str, message: str) -> None:
        super().__init__(
            f"playbook {path}: {key}: {message}" if key else f"playbook {path}: {message}"
        )
        self.path = path
        self.key = key


@dataclass(frozen=True)
class Launch:
    """A server phaseprobe starts for an arm. ``command`` None: ``vllm serve`` for a model path,
    phaseprobe's own CPU vLLM for the ``local`` model."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] | None = None
    startup_timeout_s: float = 600.0
    # a local prefill/decode pair (two instances of the tiny model, ExampleConnector) instead
    # of one server; ``router``: the real vllm-router in P/D mode in front of it
    pd: bool = False
    router: bool = False

    def key(self, model: str) -> tuple[Any, ...]:
        """Arms with equal keys share one server (an A/A on one launch starts it once)."""
        return (
            model,
            self.command,
            self.args,
            tuple(sorted(self.env.items())),
            self.pd,
            self.router,
        )


@dataclass(frozen=True)
class Arm:
    """One arm of an A/B playbook: the model, and where it runs (an endpoint, a router with its
    replicas, a P/D pair, or a server phaseprobe launches)."""

    name: str
    model: str
    endpoint: str | None = None
    launch: Launch | None = None
    description: str = ""
    # the replicas behind ``endpoint`` when it is a router (``--replica`` of probe)
    replicas: tuple[ReplicaTarget, ...] = ()
    # a prefill/decode pair already up: each instance's base URL (``endpoint``: its router)
    prefill: str | None = None
    decode: str | None = None

    @property
    def is_pd(self) -> bool:
        """A prefill/decode pair: given by its instances' URLs, or launched locally."""
        return self.prefill is not None or (self.launch is not None and self.launch.pd)

    @property
    def pd_topology(self) -> PdTopology | None:
        """The pair given by its URLs (``endpoint``: its router); None for any other arm (a
        launched pair's URLs are known once it is up)."""
        if self.prefill is None or self.decode is None:
            return None
        from phaseprobe.collect.pd.topology import PdTopology

        return PdTopology(prefill=self.prefill, decode=self.decode, router=self.endpoint)

    @property
    def served_model(self) -> str:
        """The model name requests carry: --served-model-name when the launch sets one."""
        if self.launch is None:
            return self.model
        args = list(self.launch.args)
        for i in range(len(args) - 1, -1, -1):  # the last one wins, as in vLLM's argparse
            if args[i] == "--served-model-name" and i + 1 < len(args):
                return args[i + 1]
            if args[i].startswith("--served-model-name="):
                return args[i].split("=", 1)[1]
        if self.model == LOCAL_MODEL and self.launch.command is None:
            from phaseprobe.local.server import DEFAULT_SERVED_NAME

            return DEFAULT_SERVED_NAME
        return self.model


@dataclass(frozen=True)
class RunPlan:
    """A playbook's run table: what each run asks for (tokens), how many runs and in which order,
    the smallest effect that matters (a fraction) and, for a sequential session, its budget."""

    max_tokens: int
    runs: int
    warmup: int = 1
    prompt: str | None = None
    prompt_tokens: int | None = None
    api: Literal["completions", "chat"] = "completions"
    order: Literal["interleaved", "blocks"] = "interleaved"
    block_size: int = 2
    seed: int = 0
    min_effect: float = 0.05  # a fraction: 0.05 is 5 %
    ignore_eos: bool = True
    timeout_s: float = 120.0  # connect, and each read (no byte for this long)
    deadline_s: float = 600.0  # the whole request, however the server trickles its bytes
    pause_s: float = 0.0  # quiet time before each run (lets the other arm's server settle)
    # Sequential mode (analysis/ab/sequential.py): pairs until ``primary`` is decided or the
    # budget (max_runs per arm, max_minutes of measuring) is spent.
    until_decided: bool = False
    max_runs: int = 60
    max_minutes: float | None = None
    primary: str = "decode"

    def sequential(
        self,
        *,
        max_runs: int | None = None,
        max_minutes: float | None = None,
        min_effect: float | None = None,
        primary: str | None = None,
    ) -> SequentialPlan:
        """The sequential plan of this run table, with command-line overrides."""
        return SequentialPlan(
            min_effect=self.min_effect if min_effect is None else min_effect,
            max_runs=self.max_runs if max_runs is None else max_runs,
            max_minutes=self.max_minutes if max_minutes is None else max_minutes,
            primary=self.primary if primary is None else primary,
        )


@dataclass(frozen=True)
class Playbook:
    """An A/B playbook as read from its file: name, description, path, its text, the run table and
    the two arms."""

    name: str
    description: str
    path: str
    text: str
    run: RunPlan
    arms: tuple[Arm, Arm]


def parse_effect(value: object, where: str = "--min-effect", path: str = "") -> float:
    """``"5%"``, ``"5 %"``, ``5%`` or ``0.05`` → 0.05."""
    try:
        if isinstance(value, str):
            text = value.strip()
            number = float(text.rstrip("%").strip()) / 100 if text.endswith("%") else float(text)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        else:
            raise ValueError
    except ValueError:
        raise PlaybookError(
            path or "(command line)", where, f'{value!r} is not an effect size (e.g. "5%" or 0.05)'
        ) from None
    if not 0 < number < 10:
        raise PlaybookError(
            path or "(command line)", where, f'{value!r} must be a positive effect such as "5%"'
        )
    return number


class _Reader:
    """Typed access to one TOML table; every failure names the file and the dotted key."""

    def __init__(self, path: str, table: dict[str, Any], prefix: str, allowed: set[str]) -> None:
        self.path, self.table, self.prefix = path, table, prefix
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise PlaybookError(
                path,
                self.key(unknown[0]),
                f"unknown key (allowed here: {', '.join(sorted(allowed))})",
            )

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def fail(self, name: str, message: str) -> PlaybookError:
        return PlaybookError(self.path, self.key(name), message)

    def str_(self, name: str, default: str | None = None) -> str | None:
        if name not in self.table:
            return default
        value = self.table[name]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a non-empty string, not {value!r}")
        return value

    def int_(
        self, name: str, default: int | None, minimum: int, maximum: int = _MAX_COUNT
    ) -> int | None:
        value = self.table.get(name, default)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
            raise self.fail(
                name, f"must be an integer from {minimum} to {maximum}, not {_shown(value)}"
            )
        return value

    def seconds(
        self, name: str, default: float, *, zero_ok: bool, maximum: float = _MAX_SECONDS
    ) -> float:
        """A finite number of seconds in (0, maximum] (or [0, maximum] with ``zero_ok``): inf,
        nan and 1e308 would reach a socket timeout or ``time.sleep``."""
        value = self.table.get(name, default)
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (0 <= value if zero_ok else 0 < value)
            and value <= maximum
        )
        if not ok:
            lowest = ">= 0" if zero_ok else "> 0"
            raise self.fail(
                name,
                f"must be a number of seconds {lowest} and at most "
                f"{maximum:g}, not {_shown(value)}",
            )
        return float(value)

    def bool_(self, name: str, default: bool = False) -> bool:
        value = self.table.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, not {_shown(value)}")
        return value

    def argv(self, name: str) -> tuple[str, ...] | None:
        value = self.table.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            raise self.fail(
                name,
                f'must be an argv list such as ["--dtype", "float16"], '
                f"not a shell string ({value!r}): playbooks are never run "
                f"through a shell",
            )
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(name, f"must be a list of strings, not {value!r}")
        for item in value:
            # "--dtype float16" as one element would reach vLLM as one unknown flag.
            if item.startswith("-") and "=" not in item and any(c.isspace() for c in item):
                raise self.fail(
                    name,
                    f"element {item!r} looks like several arguments in one "
                    f"string; split it: {item.split()!r}",
                )
        return tuple(value)


def _launch(path: str, raw: object, prefix: str) -> Launch:
    if not isinstance(raw, dict):
        raise PlaybookError(path, prefix.rstrip("."), "must be a table (args = [...], env = {})")
    r = _Reader(path, raw, prefix, _LAUNCH_KEYS)
    args = r.argv("args") or ()
    reserved = [a for a in args if a.split("=", 1)[0] in _RESERVED_ARGS]
    if reserved:
        raise r.fail(
            "args",
            f"{reserved[0]} is chosen by phaseprobe (servers it starts listen "
            f"on 127.0.0.1, on a free port)",
        )
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise r.fail("env", f'must be a table of string values (NCCL_ALGO = "Ring"), not {env!r}')
    timeout = r.seconds("startup_timeout_s", 600.0, zero_ok=False)
    command = r.argv("command")
    if command is not None and not command:
        raise r.fail("command", "must not be empty")
    pd, router = r.bool_("pd"), r.bool_("router")
    if router and not pd:
        raise r.fail(
            "router", "puts vllm-router in P/D mode in front of a launched pair: it needs pd = true"
        )
    if pd and command is not None:
        raise r.fail(
            "command",
            "a launched prefill/decode pair is phaseprobe's own CPU vLLM "
            "(no command); for other servers give the running instances "
            'as prefill = "URL" and decode = "URL"',
        )
    taken = [a for a in args if a.split("=", 1)[0] in _RESERVED_PD_ARGS] if pd else []
    if taken:
        raise r.fail(
            "args",
            f"{taken[0]} is chosen by phaseprobe for a launched pair (the "
            f"ExampleConnector on a shared directory)",
        )
    return Launch(
        args=args,
        env=dict(env),
        command=command,
        startup_timeout_s=float(timeout),
        pd=pd,
        router=router,
    )


def _arm(path: str, raw: object, index: int, default_model: str | None) -> Arm:
    prefix = f"arm[{index}]."
    if not isinstance(raw, dict):
        raise PlaybookError(path, f"arm[{index}]", "must be a table ([[arm]])")
    r = _Reader(path, raw, prefix, _ARM_KEYS)
    name = r.str_("name")
    if name is None:
        raise r.fail("name", 'missing (each arm needs a name, e.g. "baseline")')
    model = r.str_("model") or default_model
    if model is None:
        raise r.fail(
            "model",
            "missing: set model at the top of the playbook or in the arm "
            '(a model path, a served model name, or "local")',
        )
    has_launch = "launch" in raw
    # http://host:8000/v1 (an OpenAI base_url) means http://host:8000
    endpoint, prefill, decode = _url(r, "endpoint"), _url(r, "prefill"), _url(r, "decode")
    if (prefill is None) != (decode is None):
        raise r.fail(
            "prefill" if prefill is None else "decode",
            f'arm {name!r}: a prefill/decode pair needs both prefill = "URL" and '
            f'decode = "URL" (each instance\'s own base URL)',
        )
    if (endpoint is None and prefill is None) == (not has_launch):
        raise PlaybookError(
            path,
            f"arm[{index}]",
            f"arm {name!r} needs exactly one of "
            f"endpoint (a server already up), prefill and decode (a prefill/"
            f"decode pair already up) or launch (one phaseprobe starts)",
        )
    if prefill is not None and prefill == decode:
        raise r.fail("decode", f"prefill and decode name the same instance ({decode})")
    launch = _launch(path, raw["launch"], prefix + "launch.") if has_launch else None
    if launch is not None and launch.pd and model != LOCAL_MODEL:
        raise r.fail(
            "launch.pd",
            f"a launched prefill/decode pair serves phaseprobe's tiny "
            f'model (model = "{LOCAL_MODEL}"), not {model!r}: give a '
            f'pair of your model as prefill = "URL" and decode = '
            f'"URL"',
        )
    if prefill is not None and "replicas" in raw:
        raise r.fail(
            "replicas",
            "a prefill/decode arm names its instances with prefill and decode, not replicas",
        )
    replicas = _replicas(r, raw.get("replicas"), endpoint)
    return Arm(
        name=name,
        model=model,
        endpoint=endpoint,
        launch=launch,
        description=r.str_("description", "") or "",
        replicas=replicas,
        prefill=prefill,
        decode=decode,
    )


def _url(r: _Reader, name: str) -> str | None:
    """A base URL key, normalised (http://host:8000/v1, an OpenAI base_url, is the server)."""
    from phaseprobe.sources.vllm.openai_stream import normalize_base_url

    value = r.str_(name)
    if value is None:
        return None
    try:
        return normalize_base_url(value)
    except ConfigError as exc:
        raise r.fail(name, str(exc)) from None


def _replicas(r: _Reader, raw: object, endpoint: str | None) -> tuple[ReplicaTarget, ...]:
    """An arm's ``replicas = ["NAME=URL", …]``: only beside an ``endpoint`` (a router)."""
    from phaseprobe.collect.fleet.targets import parse_replicas

    if raw is None:
        return ()
    if endpoint is None:
        raise r.fail("replicas", "needs endpoint (the router the replicas are behind)")
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
        raise r.fail(
            "replicas", 'must be a list of "NAME=URL" strings, e.g. ["r1=http://10.0.0.6:8000"]'
        )
    try:
        return parse_replicas(raw)
    except ConfigError as exc:
        raise r.fail("replicas", str(exc)) from None


def _run_plan(path: str, raw: object) -> RunPlan:
    if not isinstance(raw, dict):
        raise PlaybookError(path, "run", "missing or not a table ([run] max_tokens = ...)")
    r = _Reader(path, raw, "run.", _RUN_KEYS)
    prompt = r.str_("prompt")
    prompt_tokens = r.int_("prompt_tokens", None, 1)
    if (prompt is None) == (prompt_tokens is None):
        raise r.fail(
            "prompt",
            "set exactly one of prompt (fixed text) or prompt_tokens "
            "(unique prompts of that many tokens)",
        )
    max_tokens = r.int_("max_tokens", None, 2)
    if max_tokens is None:
        raise r.fail("max_tokens", "missing (the same max_tokens is asked of every arm)")
    api = r.str_("api", "completions")
    if api not in ("completions", "chat"):
        raise r.fail("api", f'must be "completions" or "chat", not {api!r}')
    order = r.str_("order", "interleaved")
    if order not in ("interleaved", "blocks"):
        raise r.fail("order", f'must be "interleaved" or "blocks", not {order!r}')
    ignore_eos = raw.get("ignore_eos", True)
    if not isinstance(ignore_eos, bool):
        raise r.fail("ignore_eos", f"must be true or false, not {ignore_eos!r}")
    timeout = r.seconds("timeout_s", 120.0, zero_ok=False)
    deadline = r.seconds("deadline_s", 600.0, zero_ok=False)
    pause = r.seconds("pause_s", 0.0, zero_ok=True, maximum=3600.0)
    until = raw.get("until_decided", False)
    if not isinstance(until, bool):
        raise r.fail("until_decided", f"must be true or false, not {until!r}")
    max_minutes = raw.get("max_minutes")
    if max_minutes is not None and (
        not isinstance(max_minutes, int | float)
        or isinstance(max_minutes, bool)
        or not 0 < max_minutes <= 7 * 24 * 60
    ):
        raise r.fail(
            "max_minutes", f"must be a number of minutes > 0 (at most a week), not {max_minutes!r}"
        )
    primary = r.str_("primary", "decode") or "decode"
    try:
        check_primary(primary)
    except ValueError as exc:
        raise r.fail("primary", str(exc)) from None
    return RunPlan(
        until_decided=until,
        max_runs=r.int_("max_runs", 60, 2, MAX_RUNS) or 60,
        max_minutes=None if max_minutes is None else float(max_minutes),
        primary=primary,
        pause_s=float(pause),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        runs=r.int_("runs", 10, 1, MAX_RUNS) or 10,
        warmup=r.int_("warmup", 1, 0) or 0,
        api="chat" if api == "chat" else "completions",
        order="blocks" if order == "blocks" else "interleaved",
        block_size=r.int_("block_size", 2, 1) or 2,
        seed=r.int_("seed", 0, 0) or 0,
        min_effect=parse_effect(raw.get("min_effect", 0.05), "run.min_effect", path),
        ignore_eos=ignore_eos,
        timeout_s=float(timeout),
        deadline_s=float(deadline),
    )


def parse_playbook(text: str, path: str = "<playbook>") -> Playbook:
    """Validate a playbook's TOML text (``path`` only names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlaybookError(path, "", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise PlaybookError(path, "", "input nested too deeply") from None
    top = _Reader(path, data, "", _TOP_KEYS)
    name = top.str_("name") or Path(path).stem
    model = top.str_("model")
    run = _run_plan(path, data.get("run"))
    raw_arms = data.get("arm")
    if not isinstance(raw_arms, list) or len(raw_arms) != 2:
        n = len(raw_arms) if isinstance(raw_arms, list) else 0
        raise PlaybookError(
            path,
            "arm",
            f"an A/B needs exactly two [[arm]] tables (A: baseline, B: variant); found {n}",
        )
    arms = tuple(_arm(path, raw, i, model) for i, raw in enumerate(raw_arms))
    if arms[0].name == arms[1].name:
        raise PlaybookError(path, "arm[1].name", f"both arms are named {arms[0].name!r}")
    playbook = Playbook(
        name=name,
        description=top.str_("description", "") or "",
        path=path,
        text=text,
        run=run,
        arms=(arms[0], arms[1]),
    )
    for value in _secret_values(playbook):  # a launched server's log may echo them
        register_secret(value)
    return playbook


def shipped_playbooks() -> Path:
    """The directory of the playbooks shipped with phaseprobe (``phaseprobe/playbooks``)."""
    return Path(__file__).resolve().parents[2] / "playbooks"


def load_playbook(path: str | Path) -> Playbook:
    """Read a playbook file; a bare name (``cpu-dtype``) finds a shipped playbook."""
    p = Path(path)
    if not p.exists() and p.parent == Path(".") and not p.suffix:
        shipped = shipped_playbooks() / f"{p.name}.toml"
        if shipped.is_file():
            p = shipped

    def fail(reason: str) -> PlaybookError:  # a FIFO, a device, a file over the cap
        return PlaybookError(str(path), "", reason)

    try:
        # utf-8-sig: a BOM at the start (Windows editors) is not part of the TOML text
        text = read_input_text(p, PLAYBOOK_CAP, fail, encoding="utf-8-sig")
    except OSError as exc:
        raise PlaybookError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PlaybookError(
            str(path),
            "",
            f"not UTF-8 text (TOML must be): byte {exc.start} is {exc.object[exc.start]:#04x}",
        ) from None
    return parse_playbook(text, str(path))


def session_arms(session: AbSessionRow) -> tuple[Playbook, list[tuple[str, int]]]:
    """A stored A/B session (:meth:`Store.ab_session`) as its playbook and its arms in playbook
    order, A first, each with its experiment id. An arm without an experiment (the session
    stopped before its first run) is a :class:`ConfigError`."""
    playbook = parse_playbook(session["playbook_text"], session["playbook_path"])
    arms = []
    for arm in playbook.arms:
        if arm.name not in session["arms"]:
            raise ConfigError(
                f"A/B session {session['id']} has no experiment for arm "
                f"{arm.name} (it stopped before its first run)"
            )
        arms.append((arm.name, int(session["arms"][arm.name])))
    return playbook, arms


def session_plan(session: AbSessionRow, min_effect: float | None = None) -> SequentialPlan | None:
    """A stored session's sequential plan (None: a fixed-N session), optionally re-judged
    at another ``min_effect``; its stop record, when it has one, is ``settings["stop"]``."""
    raw = session["settings"].get("sequential")
    if raw is None:
        return None
    plan = SequentialPlan.from_dict(raw)
    return plan if min_effect is None else replace(plan, min_effect=min_effect)


# Launch environments carry credentials (HF_TOKEN, *_API_KEY, …). Their values reach the
# server phaseprobe starts and nothing else: the store and every output keep the names only.
REDACTED = "<redacted>"
# A value that carries a credential whatever its name: an HTTP header with one
# ("Authorization=Bearer …", '{"Authorization": "Bearer …"}', "x-api-key: …").
_SECRET_VALUE = re.compile(r"AUTHORIZATION|BEARER\s|API[_-]?KEY\W", re.IGNORECASE)


# A name that says it holds a credential is told by the one rule the secret mask uses
# (redact.is_secret_env_name): a launch flag or variable and a child's environment alike.
is_secret_name = is_secret_env_name


def is_secret_value(value: str) -> bool:
    """A value that carries an HTTP credential (an Authorization header, a bearer token, an
    api-key header), whatever the variable or flag holding it is called."""
    return bool(_SECRET_VALUE.search(value))


def _secret_env(name: str, value: str) -> bool:
    return is_secret_name(name) or is_secret_value(value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking variables replaced by :data:`REDACTED`."""
    # an ordinary name may still hold a URL with credentials (PROXY=http://u:pw@host)
    return {k: REDACTED if _secret_env(k, v) else redact_urls_in(v) for k, v in env.items()}


def redact_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """A launch argv with the values of secret-looking flags (``--api-key X``,
    ``--api-key=X``, ``--otlp-traces-headers X``) and of any argument carrying an HTTP
    credential (``Authorization=Bearer …``) replaced by :data:`REDACTED`."""
    out: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-") and (is_secret_name(flag) or is_secret_value(value)):
            out.append(f"{flag}={REDACTED}")
        elif (
            i > 0
            and args[i - 1].startswith("-")
            and "=" not in args[i - 1]
            and is_secret_name(args[i - 1])
            and not arg.startswith("-")
        ):
            out.append(REDACTED)
        elif is_secret_value(arg):
            out.append(REDACTED)
        else:
            out.append(redact_urls_in(arg))  # --hf-endpoint http://u:pw@host
    return out


def redacted_arm(arm: Arm) -> RedactedArm:
    """An arm's endpoint and launch as an experiment's server info keeps them: no secrets."""
    launch: ArmLaunch | None = None
    if arm.launch is not None:
        launch = {
            "command": arm.launch.command,
            "args": redact_args(arm.launch.args),
            "env": redact_env(arm.launch.env),
        }
        if arm.launch.pd:
            launch |= {"pd": True, "router": arm.launch.router}
    doc: RedactedArm = {
        "endpoint": redact_url(arm.endpoint) if arm.endpoint else None,
        "launch": launch,
    }
    if arm.replicas:
        doc["replicas"] = {t.name: t.shown_url for t in arm.replicas}
    topo = arm.pd_topology
    if topo is not None:
        doc["pd"] = topo.to_dict()
    return doc


def _secret_values(playbook: Playbook) -> set[str]:
    values: set[str] = set()
    for arm in playbook.arms:
        if arm.launch is None:
            continue
        values |= {v for k, v in arm.launch.env.items() if _secret_env(k, v) and v}
        values |= {
            raw.partition("=")[2] if "=" in raw and red.endswith(REDACTED) else raw
            for raw, red in zip(arm.launch.args, redact_args(arm.launch.args))
            if raw != red
        }
    return {v for v in values if v and v != REDACTED}


def redacted_text(playbook: Playbook) -> str:
    """The playbook's text as the store keeps it: every secret launch value replaced, and
    every URL without its credentials (a resumed session then needs an endpoint password
    again: pass credentials as an API key from the environment instead)."""
    text = playbook.text
    for value in sorted(_secret_values(playbook), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    # a value TOML escapes (a JSON header object in a basic string) is not found verbatim:
    # its bearer token still goes
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return redact_urls_in(text)


_BEARER = re.compile(r"(bearer\s+)(?!<redacted>)[^\s\"'\\,}\]]+", re.IGNORECASE)


def restore_secrets(playbook: Playbook, environ: Mapping[str, str] | None = None) -> Playbook:
    """A stored (redacted) playbook made runnable again: each redacted launch value comes
    from the environment variable of the same name, which must be set."""
    environ = os.environ if environ is None else environ
    arms = []
    for arm in playbook.arms:
        env = dict(arm.launch.env) if arm.launch else {}
        for name, value in env.items():
            if value == REDACTED:
                if name not in environ:
                    raise ConfigError(
                        f"arm {arm.name}: {name} is a secret the store does not "
                        f"keep: set {name} in the environment to resume"
                    )
                env[name] = environ[name]
                register_secret(env[name])
        if arm.launch is not None and any(REDACTED in a for a in arm.launch.args):
            raise ConfigError(
                f"arm {arm.name}: a secret launch argument is not kept in the "
                f"store, so this session cannot be resumed; pass secrets "
                f"through the launch env (e.g. VLLM_API_KEY) instead"
            )
        arms.append(replace(arm, launch=replace(arm.launch, env=env)) if arm.launch else arm)
    return replace(playbook, arms=(arms[0], arms[1]))
