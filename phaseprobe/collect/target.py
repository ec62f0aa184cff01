"""The endpoint a measurement talks to: the user's, or the embedded local vLLM; its API key
and the models it serves.

Shared by every command that measures (through :class:`phaseprobe.collect.session.Session`),
so they agree on where keys come from, on how an endpoint URL is normalised
(:func:`endpoint_url`), on how the local server is started and always stopped, and on
checking a model name before any run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from phaseprobe.collect.notices import Notices
from phaseprobe.errors import ConfigError
from phaseprobe.redact import header_secret_problem, redact_url, register_secret
from phaseprobe.sources.vllm.openai_stream import normalize_base_url

__all__ = [
    "DEFAULT_KEY_VARS",
    "api_key_from_env",
    "endpoint_or_local",
    "served_model",
    "endpoint_models",
    "endpoint_url",
]

# Looked at in this order when no --api-key-env is given.
DEFAULT_KEY_VARS = ("OPENAI_API_KEY", "VLLM_API_KEY")


def api_key_from_env(var: str | None) -> str | None:
    """The API key: from ``var`` when named (it must be set), else the default variables.
    It is registered as a secret (masked wherever it comes back: a server echoing it in an
    error body, a library's exception) and refused, without being shown, when it could not
    be sent in a header (a trailing newline, a control or non-Latin-1 character)."""
    if var:
        if var not in os.environ:
            raise ConfigError(f"--api-key-env {var}: that environment variable is not set")
        name, key = var, os.environ[var]
    else:
        found = next(((v, os.environ[v]) for v in DEFAULT_KEY_VARS if os.environ.get(v)), None)
        if found is None:
            return None
        name, key = found
    register_secret(key)
    problem = header_secret_problem(key)
    if problem:
        raise ConfigError(f"the API key in ${name} cannot be sent: {problem}")
    return key


def endpoint_url(given: str) -> str:
    """An endpoint URL as the user typed it, as every measurement connects to it: the base
    URL phaseprobe appends paths to (``host:8000/v1/`` is ``http://host:8000``), a password in
    it registered as a secret; ConfigError naming it otherwise. The commands normalise what
    they are given here: they open no reader themselves (the rule is the stream client's,
    :func:`~phaseprobe.sources.vllm.openai_stream.normalize_base_url`)."""
    return normalize_base_url(given)


def endpoint_or_local(
    endpoint: str | None,
    stack: ExitStack,
    notices: Notices,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> str:
    """``endpoint``, or start the local CPU vLLM with the tiny model (installing it on first
    use) inside ``stack``, which stops it on exit, Ctrl-C or error."""
    if endpoint is not None:
        return endpoint_url(endpoint)
    from phaseprobe.local import LocalVllm, ensure_model, install
    from phaseprobe.local.process import stop_with_parent

    notices.headline("no endpoint given: using the local CPU vLLM with the tiny model")
    venv = install(progress=notices.detail)
    ensure_model(venv=venv)
    with notices.waiting("starting local vLLM (about 30 s on 2 cores)…"):
        server = stack.enter_context(
            LocalVllm(venv=venv, extra_args=extra_args, extra_env=extra_env)
        )
    stack.enter_context(stop_with_parent(server.pid))  # stopped even after a kill -9
    notices.info(f"local vLLM ready at {server.base_url} (log: {server.log_path})")
    return server.base_url


def endpoint_models(
    endpoint: str,
    api_key: str | None,
    *,
    timeout_s: float | None = None,
    deadline_s: float | None = None,
) -> list[dict[str, Any]]:
    """``/v1/models`` of the endpoint, validated (raises EndpointUnreachable before any run).
    A probe asks once and hands the list on, to the model check, the preflight and the run.
    ``timeout_s``/``deadline_s``: the probe's own, which shorten the preflight's limits."""
    import requests

    from phaseprobe.sources.vllm.openai_stream import PREFLIGHT_TIMEOUT_S, check_endpoint

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return check_endpoint(
        endpoint_url(endpoint),
        session=requests.Session(),
        headers=headers,
        timeout_s=timeout_s or PREFLIGHT_TIMEOUT_S,
        deadline_s=deadline_s,
    )


def served_model(
    endpoint: str,
    api_key: str | None,
    model: str | None,
    option: str = "--model",
    models: list[dict[str, Any]] | None = None,
) -> str:
    """``model`` if the endpoint serves it, else a ConfigError listing what it serves; the
    first listed model when ``model`` is None. Checked before any run: a wrong name would
    otherwise become a whole experiment of 404 error runs. ``models``: the endpoint's
    ``/v1/models`` list when already fetched."""
    endpoint = endpoint_url(endpoint)
    if models is None:
        models = endpoint_models(endpoint, api_key)
    served = [str(m["id"]) for m in models if isinstance(m, dict) and "id" in m]
    if not served:
        raise ConfigError(f"{redact_url(endpoint)}/v1/models lists no model; pass {option}")
    if model is None:
        return served[0]
    if model not in served:
        raise ConfigError(
            f"{option} {model!r} is not served at {redact_url(endpoint)} (it "
            f"serves: {', '.join(served)})"
        )
    return model
