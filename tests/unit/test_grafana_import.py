"""``grafana import`` against the Grafana API stand-in: payload, headers, mapping, errors."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest

from phaseprobe.collect.grafana_api import (
    GrafanaClient,
    import_dashboard,
    prepare_dashboard,
    token_from_env,
)
from phaseprobe.errors import (
    ConfigError,
    GrafanaApiError,
    GrafanaAuthError,
    GrafanaConflict,
    GrafanaNotFound,
    GrafanaUnreachable,
)
from phaseprobe.present.grafana import build as gb
from phaseprobe.testing.grafana_stub import GrafanaStub

TOKEN = "glsa_s3cr3t-t0ken-value"
SHIPPED = json.loads(
    (Path(gb.__file__).resolve().parents[2] / "dashboards" / gb.DASHBOARD_FILE).read_text(
        encoding="utf-8"
    )
)
FOLDERS = [{"id": 7, "uid": "ops-uid", "title": "Ops"}]
# A dashboard as Grafana's UI exports it "for sharing externally": only the __inputs entry, no
# datasource variable (vLLM's examples/observability dashboards look like this).
UI_EXPORT = {
    "__inputs": [{"name": "DS_PROM", "type": "datasource", "pluginId": "prometheus"}],
    "id": 12,
    "uid": "ui-export",
    "title": "exported",
    "version": 9,
    "schemaVersion": 39,
    "panels": [
        {
            "id": 1,
            "type": "timeseries",
            "title": "x",
            "datasource": {"type": "prometheus", "uid": "${DS_PROM}"},
            "targets": [
                {
                    "refId": "A",
                    "expr": "vllm:num_requests_running",
                    "datasource": {"type": "prometheus", "uid": "${DS_PROM}"},
                }
            ],
        }
    ],
}


@pytest.fixture
def grafana():
    with GrafanaStub(token=TOKEN, folders=FOLDERS) as stub:
        yield stub


def _client(stub: GrafanaStub, token: str = TOKEN) -> GrafanaClient:
    return GrafanaClient(stub.url, token)


def _posts(stub: GrafanaStub):
    return [r for r in stub.requests if r.method == "POST"]


def test_import_posts_the_dashboard_with_bearer_token(grafana):
    result = import_dashboard(_client(grafana), SHIPPED)
    (post,) = _posts(grafana)
    assert post.path == "/api/dashboards/db"
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    assert post.body["overwrite"] is False and "folderUid" not in post.body
    sent = post.body["dashboard"]
    assert sent["uid"] == gb.DASHBOARD_UID and sent["title"] == SHIPPED["title"]
    assert "id" not in sent and "version" not in sent and "__inputs" not in sent
    assert sent["panels"] == SHIPPED["panels"]  # refs stay on the ${DS_PROMETHEUS} variable
    # The datasource variable resolves it at view time, so no datasource lookup was needed.
    assert [r.path for r in grafana.requests] == ["/api/dashboards/db"]
    assert result.uid == gb.DASHBOARD_UID and result.version == 1
    assert result.url == f"{grafana.url}/d/{gb.DASHBOARD_UID}/vllm-phases-phaseprobe"
    assert result.status == "success" and result.datasource is None
    assert gb.DASHBOARD_UID in grafana.dashboards


def test_datasource_by_name_sets_the_variable_default(grafana):
    result = import_dashboard(_client(grafana), SHIPPED, datasource="Prometheus")
    sent = _posts(grafana)[0].body["dashboard"]
    var = next(v for v in sent["templating"]["list"] if v["name"] == "DS_PROMETHEUS")
    assert var["current"] == {"selected": True, "text": "Prometheus", "value": "prom-main"}
    assert result.datasource == "prom-main"
    assert SHIPPED["templating"]["list"][0]["current"] == {}  # the input was not mutated


def test_input_without_a_variable_is_replaced_by_the_datasource_uid(grafana):
    original = copy.deepcopy(UI_EXPORT)
    result = import_dashboard(_client(grafana), UI_EXPORT)  # no --datasource: the default one
    assert UI_EXPORT == original
    text = json.dumps(_posts(grafana)[0].body["dashboard"])
    assert "${DS_PROM}" not in text and text.count('"uid": "prom-main"') == 2
    assert result.datasource == "prom-main"
    assert "/api/datasources" in [r.path for r in grafana.requests]


def test_datasource_by_uid_and_the_errors_for_wrong_ones(grafana):
    assert (
        import_dashboard(_client(grafana), UI_EXPORT, datasource="prom-main").datasource
        == "prom-main"
    )
    with pytest.raises(ConfigError, match=r"no datasource .*'nope'.*Loki, Prometheus"):
        import_dashboard(_client(grafana), UI_EXPORT, datasource="nope")
    with pytest.raises(ConfigError, match="type 'loki'"):
        import_dashboard(_client(grafana), UI_EXPORT, datasource="Loki")


def test_no_default_prometheus_datasource_asks_for_one():
    two = [
        {"uid": "a", "name": "A", "type": "prometheus"},
        {"uid": "b", "name": "B", "type": "prometheus"},
    ]
    with GrafanaStub(token=TOKEN, datasources=two) as stub:
        with pytest.raises(ConfigError, match="--datasource"):
            import_dashboard(_client(stub), UI_EXPORT)
        assert _posts(stub) == []


@pytest.mark.parametrize(
    "folder, field, value",
    [
        ("Ops", "folderUid", "ops-uid"),
        ("ops-uid", "folderUid", "ops-uid"),
        ("7", "folderId", 7),
    ],
)
def test_folder_by_title_uid_or_legacy_id(grafana, folder, field, value):
    result = import_dashboard(_client(grafana), SHIPPED, folder=folder)
    body = _posts(grafana)[0].body
    assert body[field] == value
    assert result.folder == str(value)


def test_unknown_folder_is_grafanas_own_error(grafana):
    with pytest.raises(GrafanaApiError, match="HTTP 400: folder not found"):
        import_dashboard(_client(grafana), SHIPPED, folder="no-such-folder")


def test_existing_dashboard_conflicts_unless_overwrite(grafana):
    import_dashboard(_client(grafana), SHIPPED)
    with pytest.raises(GrafanaConflict) as info:
        import_dashboard(_client(grafana), SHIPPED)
    assert info.value.status == 412 and "--overwrite" in str(info.value)
    assert "version-mismatch" in str(info.value) and grafana.url in str(info.value)
    result = import_dashboard(_client(grafana), SHIPPED, overwrite=True)
    assert _posts(grafana)[-1].body["overwrite"] is True
    assert result.version == 2


def test_wrong_token_is_401_naming_the_variable_not_the_value(grafana):
    client = GrafanaClient(grafana.url, "wrong-" + TOKEN, token_env="MY_GRAFANA")
    with pytest.raises(GrafanaAuthError) as info:
        import_dashboard(client, SHIPPED)
    message = str(info.value)
    assert info.value.status == 401 and "MY_GRAFANA" in message and "invalid API key" in message
    assert TOKEN not in message and TOKEN not in repr(client)


@pytest.mark.parametrize(
    "status, error, text",
    [
        (403, GrafanaAuthError, "Editor"),
        (404, GrafanaNotFound, "check the Grafana URL"),
        (412, GrafanaConflict, "--overwrite"),
        (500, GrafanaApiError, "HTTP 500"),
    ],
)
def test_each_error_status_is_mapped(grafana, status, error, text):
    grafana.reply("POST", "/api/dashboards/db", status, {"message": f"stub {status}"})
    with pytest.raises(error, match=text) as info:
        import_dashboard(_client(grafana), SHIPPED)
    assert type(info.value) is error
    assert f"stub {status}" in str(info.value) and "/api/dashboards/db" in str(info.value)
    assert TOKEN not in str(info.value)


def test_not_grafana_answers_are_clear(grafana):
    grafana.reply("POST", "/api/dashboards/db", 200, "<html>hello</html>")
    with pytest.raises(GrafanaApiError, match="not a JSON answer.*is this URL Grafana"):
        import_dashboard(_client(grafana), SHIPPED)
    grafana.reply("POST", "/api/dashboards/db", 502, "Bad Gateway from proxy")
    with pytest.raises(GrafanaApiError, match="HTTP 502: Bad Gateway from proxy"):
        import_dashboard(_client(grafana), SHIPPED)


def test_connection_refused_names_the_url_without_credentials():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    # user:password@ would replace the token with Basic auth: refused, the password unshown
    with pytest.raises(ConfigError, match="Basic auth") as refused:
        GrafanaClient(f"http://admin:pw@127.0.0.1:{port}/grafana/", TOKEN)
    assert "pw" not in str(refused.value)
    client = GrafanaClient(f"http://127.0.0.1:{port}/grafana/", TOKEN)
    with pytest.raises(GrafanaUnreachable) as info:
        import_dashboard(client, SHIPPED)
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/grafana/api/dashboards/db" in message
    assert TOKEN not in message


@pytest.mark.parametrize(
    "url, says",
    [("ftp://grafana", "the scheme must be http:// or https://"), ("http://", "names no host")],
)
def test_unusable_url_is_a_config_error_before_any_request(url, says):
    # Issue 43 item 9: the endpoint's rules (EndpointUrl), when the client is made; these
    # were refused at the first request before ("not a usable Grafana URL")
    with pytest.raises(ConfigError, match=f"^Grafana URL {url!r}:? {says}.*127.0.0.1:3000"):
        GrafanaClient(url, TOKEN)


def test_a_bare_host_and_port_is_read_as_http():
    # as the endpoint's: grafana:3000 is what people type (it was an unusable URL)
    assert GrafanaClient("grafana:3000/", TOKEN).url == "http://grafana:3000"


def test_token_comes_from_the_environment_only_by_name():
    assert token_from_env("G", {"G": " abc \n"}) == "abc"
    with pytest.raises(ConfigError, match="GRAFANA_TOKEN is not set"):
        token_from_env(environ={})
    with pytest.raises(ConfigError, match="MY_VAR is not set"):
        token_from_env("MY_VAR", {"MY_VAR": "  "})


def test_dashboard_without_title_is_refused_before_any_request(grafana):
    with pytest.raises(ConfigError, match="no title"):
        import_dashboard(_client(grafana), {"panels": []})
    assert grafana.requests == []


def test_prepare_dashboard_is_pure():
    before = copy.deepcopy(SHIPPED)
    prepared = prepare_dashboard(SHIPPED, {"uid": "u1", "name": "P"})
    assert SHIPPED == before
    assert "__inputs" not in prepared and prepared["panels"] == SHIPPED["panels"]
