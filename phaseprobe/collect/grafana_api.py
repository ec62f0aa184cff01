"""Import a dashboard into Grafana through its HTTP API (``POST /api/dashboards/db``).

The token comes from an environment variable (``GRAFANA_TOKEN`` unless told otherwise) and goes
only into the ``Authorization`` header: it is never part of a message, a log line or a result.
The HTTP session is injectable; tests drive the real ``requests`` stack against
:class:`phaseprobe.testing.grafana_stub.GrafanaStub` since no Grafana server exists here.

Why the dashboard is rewritten before posting: ``/api/dashboards/db`` stores JSON as is and,
unlike the UI's import screen, ignores ``__inputs``, so a ``${DS_PROMETHEUS}`` input would stay
a dangling reference. An input backed by a datasource *variable* of the same name (the shipped
dashboard) resolves at view time, so only that variable's default is set; any other input is
replaced by the chosen datasource's uid, as the UI would. ``id`` and ``version`` are dropped:
an ``id`` from another Grafana names the wrong row, and without ``version`` an existing uid is a
412 conflict unless ``--overwrite`` is given, instead of silently passing when versions happen
to match.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests

from phaseprobe.endpoint_url import EndpointUrl
from phaseprobe.errors import (
    ConfigError,
    GrafanaApiError,
    GrafanaAuthError,
    GrafanaConflict,
    GrafanaError,
    GrafanaNotFound,
    GrafanaUnreachable,
)
from phaseprobe.inputs import DASHBOARD_CAP
from phaseprobe.redact import header_secret_problem, register_secret
from phaseprobe.sources.http_deadline import AnswerTooLarge, bounded_request, mount_deadlines

__all__ = [
    "DEFAULT_TOKEN_ENV",
    "GrafanaClient",
    "ImportResult",
    "datasource_inputs",
    "import_dashboard",
    "prepare_dashboard",
    "token_from_env",
]

DEFAULT_TOKEN_ENV = "GRAFANA_TOKEN"
_DS_INPUT = "DS_PROMETHEUS"

# Grafana's answers (a dashboard, a search, the data sources) are KB to a few MB: as large as a
# dashboard file phaseprobe reads, and no more (a gzip bomb expands only this far).
MAX_ANSWER_BYTES = DASHBOARD_CAP


def token_from_env(var: str = DEFAULT_TOKEN_ENV, environ: Mapping[str, str] | None = None) -> str:
    """The token held in ``var``; the error names the variable, never a value."""
    env = os.environ if environ is None else environ
    raw = env.get(var, "")
    register_secret(raw)  # masked wherever it comes back (an echoing error body)
    token = raw.strip()
    problem = header_secret_problem(token)
    if token and problem:
        raise ConfigError(f"the Grafana token in ${var} cannot be sent: {problem}")
    if not token:
        raise ConfigError(
            f"environment variable {var} is not set: put a Grafana "
            f"service-account token in it (or name another with --token-env)"
        )
    return token


class GrafanaClient:
    """The few Grafana API calls the importer needs; errors become typed exceptions."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        session: requests.Session | None = None,
        timeout_s: float = 10.0,
        verify: bool | str = True,
        token_env: str = DEFAULT_TOKEN_ENV,
    ) -> None:
        base = EndpointUrl.parse(
            url,
            what="Grafana URL",
            query_hint=f"put the token in ${token_env}",
            example="http://127.0.0.1:3000",
        )
        self.url = str(base)
        self.display_url = base.redacted
        if base.has_userinfo:
            # requests turns user:password@ into Basic auth, which replaces the bearer token
            raise ConfigError(
                f"Grafana URL {self.display_url!r}: user:password@ in the URL "
                f"would be sent as Basic auth instead of the ${token_env} bearer "
                f"token; drop the credentials from the URL"
            )
        self._session = mount_deadlines(session or requests.Session())
        register_secret(token)
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._timeout_s = timeout_s
        self._verify = verify
        self._token_env = token_env  # named in 401 hints; the value never is

    def __repr__(self) -> str:  # the token stays out of reprs and tracebacks' locals views
        return f"GrafanaClient({self.display_url!r})"

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Grafana's JSON answer to ``method path`` (``body`` sent as JSON). Raises
        GrafanaUnreachable when nothing answers in time, on a TLS error or an answer too large;
        ConfigError for an unusable URL; a GrafanaApiError subclass (auth, not found, conflict) for
        an error status or an answer that is not JSON."""
        where = self.display_url + path
        try:
            resp = bounded_request(
                self._session,
                method,
                self.url + path,
                json=body,
                headers=self._headers,
                timeout_s=self._timeout_s,
                deadline_s=max(self._timeout_s, 1.0) * 3,
                max_bytes=MAX_ANSWER_BYTES,
                what=f"{method} {where}",
                verify=self._verify,
            )
        except requests.exceptions.SSLError:
            raise GrafanaUnreachable(where, "TLS error; check the certificate") from None
        except requests.exceptions.Timeout as exc:
            total = "(total deadline)" in str(exc)
            raise GrafanaUnreachable(
                where,
                f"no complete answer within {max(self._timeout_s, 1.0) * 3:g} s (total deadline)"
                if total
                else f"no answer within {self._timeout_s:g} s",
            ) from None
        except (
            requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
        ):
            raise ConfigError(
                f"not a usable Grafana URL: {self.display_url} "
                f"(expected http(s)://host[:port][/sub-path])"
            ) from None
        except AnswerTooLarge as exc:
            raise GrafanaUnreachable(where, str(exc)) from None
        except requests.RequestException as exc:
            raise GrafanaUnreachable(where, type(exc).__name__) from None
        if resp.status_code >= 400:
            raise self._error(where, resp)
        try:
            return resp.json()
        except RecursionError:
            raise GrafanaApiError(
                where, resp.status_code, "answer nested too deeply to read", "is this URL Grafana?"
            ) from None
        except ValueError:
            raise GrafanaApiError(
                where,
                resp.status_code,
                f"not a JSON answer: {_excerpt(resp.text)!r}",
                "is this URL Grafana?",
            ) from None

    def _error(self, where: str, resp: requests.Response) -> GrafanaError:
        status = resp.status_code
        message = _message(resp)
        if status == 401:
            return GrafanaAuthError(
                where, status, message, f"token in {self._token_env} missing, expired or wrong"
            )
        if status == 403:
            return GrafanaAuthError(
                where,
                status,
                message,
                "the token's role may not do this; saving dashboards needs Editor on the folder",
            )
        if status == 404:
            return GrafanaNotFound(
                where, status, message, "check the Grafana URL (and its sub-path), folder and uid"
            )
        if status == 412:
            return GrafanaConflict(
                where,
                status,
                message,
                "a dashboard with this uid or title "
                "exists or changed; pass --overwrite to replace it",
            )
        return GrafanaApiError(where, status, message)

    def datasources(self) -> list[dict[str, Any]]:
        """Grafana's datasources (``/api/datasources``), those that are JSON objects. Raises as
        :meth:`request`, and GrafanaApiError when the answer is not a list."""
        return _list_of_dicts(self.request("GET", "/api/datasources"), self.display_url)

    def folders(self) -> list[dict[str, Any]]:
        """Grafana's folders (``/api/folders``), those that are JSON objects. Raises as
        :meth:`request`, and GrafanaApiError when the answer is not a list."""
        return _list_of_dicts(self.request("GET", "/api/folders"), self.display_url)

    def save_dashboard(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Grafana's answer to saving ``payload`` (``/api/dashboards/db``: uid, url, version,
        status). Raises as :meth:`request`, and GrafanaApiError when the answer is not a JSON
        object."""
        answer = self.request("POST", "/api/dashboards/db", payload)
        if not isinstance(answer, dict):
            raise GrafanaApiError(
                self.display_url + "/api/dashboards/db", 200, "answer is not a JSON object"
            )
        return answer


@dataclass(frozen=True)
class ImportResult:
    """What Grafana said about one imported dashboard: its uid, absolute URL, version and status,
    and the folder and datasource used."""

    uid: str
    url: str  # absolute link to the dashboard
    version: int | None
    status: str
    folder: str | None  # the folderUid / folderId sent, if any
    datasource: str | None  # uid of the datasource the inputs were mapped to, if any

    def to_dict(self) -> dict[str, Any]:
        """The import's outcome as a JSON-ready dict."""
        return {
            "uid": self.uid,
            "url": self.url,
            "version": self.version,
            "status": self.status,
            "folder": self.folder,
            "datasource": self.datasource,
        }


def datasource_inputs(dashboard: Mapping[str, Any]) -> list[str]:
    """Names of the Prometheus datasource inputs (``__inputs``), ``DS_PROMETHEUS`` if none."""
    inputs = dashboard.get("__inputs")
    names = [
        str(i["name"])
        for i in (inputs if isinstance(inputs, list) else [])
        if isinstance(i, dict)
        and i.get("type") == "datasource"
        and i.get("name")
        and i.get("pluginId", "prometheus") == "prometheus"
    ]
    return names or [_DS_INPUT]


def _variable(dashboard: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    templating = dashboard.get("templating")
    variables = templating.get("list") if isinstance(templating, dict) else None
    for var in variables if isinstance(variables, list) else []:
        if isinstance(var, dict) and var.get("name") == name and var.get("type") == "datasource":
            return var
    return None


def _replace(node: Any, old: str, new: str) -> Any:
    if isinstance(node, str):
        return node.replace(old, new)
    if isinstance(node, list):
        return [_replace(n, old, new) for n in node]
    if isinstance(node, dict):
        return {k: _replace(v, old, new) for k, v in node.items()}
    return node


def prepare_dashboard(
    dashboard: Mapping[str, Any], datasource: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The dashboard as ``/api/dashboards/db`` should get it (see the module docstring)."""
    dash = copy.deepcopy(dict(dashboard))
    inputs = datasource_inputs(dash)
    for key in ("id", "version", "__inputs", "__elements"):
        dash.pop(key, None)
    if datasource is None:
        return dash
    uid, name = str(datasource["uid"]), str(datasource.get("name") or datasource["uid"])
    for input_name in inputs:
        var = _variable(dash, input_name)
        if var is not None:
            var["current"] = {"selected": True, "text": name, "value": uid}
        else:
            dash = _replace(dash, "${" + input_name + "}", uid)
    return dash


def _needs_datasource(dashboard: Mapping[str, Any]) -> bool:
    """True if some input has no same-named variable to resolve it at view time."""
    return any(_variable(dashboard, n) is None for n in datasource_inputs(dashboard))


def _pick_datasource(client: GrafanaClient, wanted: str | None) -> dict[str, Any]:
    sources = client.datasources()
    if wanted is None:
        proms = [d for d in sources if d.get("type") == "prometheus"]
        chosen = [d for d in proms if d.get("isDefault")] or (proms if len(proms) == 1 else [])
        if not chosen:
            raise ConfigError(
                f"Grafana at {client.display_url} has "
                f"{len(proms)} Prometheus datasources and none is the default; "
                f"pick one with --datasource NAME|UID"
            )
        return chosen[0]
    match = (
        [d for d in sources if d.get("uid") == wanted]
        or [d for d in sources if d.get("name") == wanted]
        or [d for d in sources if str(d.get("name", "")).lower() == wanted.lower()]
    )
    if not match:
        names = ", ".join(sorted(str(d.get("name")) for d in sources)) or "none"
        raise ConfigError(
            f"no datasource with uid or name {wanted!r} in Grafana at "
            f"{client.display_url} (it has: {names})"
        )
    if match[0].get("type") != "prometheus":
        raise ConfigError(
            f"datasource {wanted!r} at {client.display_url} is of type "
            f"{match[0].get('type')!r}; the dashboard needs Prometheus"
        )
    return match[0]


def _folder_fields(client: GrafanaClient, folder: str | None) -> dict[str, Any]:
    if folder is None or folder == "":
        return {}
    if folder.isdigit():  # a numeric folder id: only Grafana before 11 accepts folderId
        return {"folderId": int(folder)}
    folders = client.folders()
    for key in ("uid", "title"):
        for f in folders:
            if f.get(key) == folder:
                return {"folderUid": str(f["uid"])}
    # /api/folders lists top-level folders only: a nested folder's uid is passed as given and
    # Grafana itself says whether it exists.
    return {"folderUid": folder}


def import_dashboard(
    client: GrafanaClient,
    dashboard: Mapping[str, Any],
    *,
    folder: str | None = None,
    overwrite: bool = False,
    datasource: str | None = None,
    message: str = "imported by phaseprobe",
) -> ImportResult:
    """Post ``dashboard``; ``datasource`` (name or uid) maps its Prometheus input(s)."""
    if not isinstance(dashboard.get("title"), str) or not dashboard.get("title"):
        raise ConfigError("the dashboard has no title; Grafana would refuse it")
    chosen: dict[str, Any] | None = None
    if datasource is not None or _needs_datasource(dashboard):
        chosen = _pick_datasource(client, datasource)
    payload: dict[str, Any] = {
        "dashboard": prepare_dashboard(dashboard, chosen),
        "overwrite": overwrite,
        "message": message,
        **_folder_fields(client, folder),
    }
    answer = client.save_dashboard(payload)
    rel = str(answer.get("url") or "")
    version = answer.get("version")
    folder_sent = payload.get("folderUid", payload.get("folderId"))
    return ImportResult(
        uid=str(answer.get("uid") or dashboard.get("uid") or ""),
        url=client.display_url + rel if rel.startswith("/") else rel,
        version=int(version) if isinstance(version, int | float) else None,
        status=str(answer.get("status") or ""),
        folder=None if folder_sent is None else str(folder_sent),
        datasource=None if chosen is None else str(chosen["uid"]),
    )


def _message(resp: requests.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return _excerpt(resp.text) or resp.reason or "no message"
    if isinstance(data, dict) and data.get("message"):
        status = f" [{data['status']}]" if data.get("status") else ""
        return f"{data['message']}{status}"
    return _excerpt(resp.text)


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _list_of_dicts(answer: Any, url: str) -> list[dict[str, Any]]:
    if not isinstance(answer, list):
        raise GrafanaApiError(url, 200, "expected a JSON list")
    return [a for a in answer if isinstance(a, dict)]
