"""The page's app behind Airflow's authentication, with the auth manager's answers stubbed at its
boundary (Airflow's ``get_user`` dependency itself runs: Bearer header or ``_token`` cookie):
refused without a valid token, per-DAG and per-Asset filtering, read-only. The tables are real
Delta tables; Airflow's records of them (the Asset events, task instances) are given as values."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient
from jwt import InvalidTokenError

from airflow_eo.version_compat import UI_PAGE_SUPPORTED

if not UI_PAGE_SUPPORTED:  # the app imports Airflow's FastAPI API server (3.1+)
    pytest.skip("the page's app runs on Airflow 3.1+ only (tests/unit/test_version_compat.py checks that the "
                "plugin registers nothing below)", allow_module_level=True)

from airflow_eo.core.planning import BatchPlan  # noqa: E402
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.ui import app as ui_app  # noqa: E402
from airflow_eo.ui.events import RunSummary, TableRef, TaskRun, Writer  # noqa: E402
from airflow_eo.ui.tables import TableReader  # noqa: E402
from tests.unit.fakes import BatchLog  # noqa: E402

NOW = datetime.now(timezone.utc)


class User:
    def __init__(self, name: str, dags: set[str], assets: bool = True):
        self.name, self.dags, self.assets = name, dags, assets

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


class StubAuthManager:
    """What the page asks Airflow's auth manager: who a token is, which DAGs and Assets they may read."""

    def __init__(self, users: dict[str, User]):
        self.users = users
        self.asked: list[str] = []

    async def get_user_from_token(self, token: str) -> User:
        if token not in self.users:
            raise InvalidTokenError("Not enough segments")
        return self.users[token]

    def is_authorized_asset(self, *, method, user, details=None) -> bool:
        self.asked.append(f"asset {method} {details.id if details else '*'}")
        return user.assets

    def get_authorized_dag_ids(self, *, user, method="GET", session=None) -> set[str]:
        self.asked.append(f"dags {method}")
        return set(user.dags)


def plan(ingest: str, batch: int) -> BatchPlan:
    return BatchPlan(ingest, batch, (OffsetRange("t", 0, batch * 10 - 10, batch * 10),),
                     RunIdentity(f"d/r{batch}/ingest/-1", "d", f"r{batch}", "ingest", 1))


def ref(asset_id: int, uri: str, ingest: str, *dags: str) -> TableRef:
    summary = RunSummary("committed", ingest, uri, batch=1, version=1, rows=10, lag=(("t[0]", 4),))
    return TableRef(asset_id, f"file://{uri}", uri, ingest,
                    tuple(Writer(d, "ingest", -1, i, NOW - timedelta(minutes=i), summary) for i, d in enumerate(dags)))


@pytest.fixture
def world(tmp_path, monkeypatch):
    tables = []
    for asset_id, name, dags in ((1, "alpha", ("dag_a",)), (2, "beta", ("dag_b",)), (3, "shared", ("dag_a", "dag_b"))):
        uri = str(tmp_path / name)
        log = BatchLog(uri)
        log.batch(plan(name, 1), {"t[0]": 10})
        tables.append(ref(asset_id, uri, name, *dags))
    auth = StubAuthManager({"tok-admin": User("admin", {"dag_a", "dag_b"}), "tok-a": User("a", {"dag_a"}),
                            "tok-none": User("none", {"dag_a", "dag_b"}, assets=False)})
    import airflow.api_fastapi.app as airflow_app
    import airflow.api_fastapi.core_api.security as security
    from airflow.api_fastapi.common.db.common import _get_session

    monkeypatch.setattr(security, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(ui_app, "find_tables", lambda session: list(tables))
    monkeypatch.setattr(ui_app, "last_runs", lambda session, writers: {
        (w.dag_id, w.task_id, w.map_index): TaskRun(w.dag_id, w.task_id, "r1", -1, "success", 1, NOW, w.summary)
        for w in writers})
    monkeypatch.setattr(ui_app, "lag_history", lambda session, table: [])
    app = ui_app.create_app(TableReader())
    app.dependency_overrides[_get_session] = lambda: "no database in the unit lane"
    return {"client": TestClient(app), "auth": auth, "tables": tables, "tmp": tmp_path}


def get(world, path: str, token: str | None = None, cookie: bool = False):
    if token is None:
        return world["client"].get(path)
    if cookie:
        world["client"].cookies.set("_token", token)
        try:
            return world["client"].get(path)
        finally:
            world["client"].cookies.clear()
    return world["client"].get(path, headers={"Authorization": f"Bearer {token}"})


def text(response) -> str:
    """The page's text as read, without its tags (the <wbr> set into long names, the spans of ranges)."""
    return re.sub(r"<[^>]+>", "", response.text)


def test_without_a_token_nothing_is_served_or_read(world):
    for path in ("/", "/table?asset=1&ingest=alpha"):
        r = get(world, path)
        assert r.status_code == 401 and "Not authenticated" in text(r) and "alpha" not in text(r)
        assert r.headers["content-type"].startswith("text/html")
    assert world["auth"].asked == []  # refused before any question about rights (or any table read)


def test_a_bad_token_is_refused(world):
    r = get(world, "/", "tok-forged")
    assert r.status_code == 403 and "Invalid JWT token" in text(r) and "alpha" not in text(r)


def test_a_user_who_may_read_everything_sees_every_table(world):
    for cookie in (False, True):  # the API's Bearer token, and the UI's session cookie
        r = get(world, "/", "tok-admin", cookie=cookie)
        assert r.status_code == 200, text(r)
        for name in ("alpha", "beta", "shared"):
            assert str(world["tmp"] / name) in text(r)
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    assert r.headers["cache-control"] == "no-store"


def test_a_user_without_a_dag_sees_none_of_its_tables(world):
    r = get(world, "/", "tok-a")
    assert r.status_code == 200
    assert str(world["tmp"] / "alpha") in text(r)
    assert str(world["tmp"] / "beta") not in text(r) and "dag_b" not in text(r)
    assert str(world["tmp"] / "shared") not in text(r)  # written by dag_b too: its log names dag_b's runs
    assert get(world, "/table?asset=1&ingest=alpha", "tok-a").status_code == 200
    for path in ("/table?asset=2&ingest=beta", "/table?asset=3&ingest=shared"):
        refused = get(world, path, "tok-a")
        assert refused.status_code == 403 and str(world["tmp"]) not in text(refused)


def test_a_user_who_may_read_no_asset_is_refused(world):
    for path in ("/", "/table?asset=1&ingest=alpha"):
        r = get(world, path, "tok-none")
        assert r.status_code == 403 and "alpha" not in r.text.split("<main>")[1]


def test_a_tables_page_and_an_unknown_one(world):
    r = get(world, "/table?asset=1&ingest=alpha", "tok-admin")
    assert r.status_code == 200 and "Recent batches" in text(r) and "t[0] 0–10" in text(r)
    assert get(world, "/table?asset=9&ingest=alpha", "tok-admin").status_code == 404
    assert get(world, "/table?asset=1&ingest=beta", "tok-admin").status_code == 404
    bad = get(world, "/table?asset=x&ingest=alpha", "tok-admin")  # the page's own error page, not FastAPI's JSON
    assert bad.status_code == 400 and bad.headers["content-type"].startswith("text/html") and "asset" in text(bad)


def test_nothing_writes(world):
    from deltalake import DeltaTable

    before = {t.table_uri: DeltaTable(t.table_uri).version() for t in world["tables"]}
    listing = {p.name: sorted(q.name for q in p.rglob("*")) for p in world["tmp"].iterdir()}
    client, headers = world["client"], {"Authorization": "Bearer tok-admin"}
    for method in ("post", "put", "patch", "delete"):
        for path in ("/", "/table?asset=1&ingest=alpha"):
            assert getattr(client, method)(path, headers=headers).status_code == 405
    get(world, "/", "tok-admin")
    get(world, "/table?asset=1&ingest=alpha", "tok-admin")
    assert {t.table_uri: DeltaTable(t.table_uri).version() for t in world["tables"]} == before
    assert {p.name: sorted(q.name for q in p.rglob("*")) for p in world["tmp"].iterdir()} == listing


def test_object_store_tables_are_read_with_the_configured_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_UI_TABLES", '{"conn_type": "aws", "login": "AKIAEXAMPLE", "password": "s3cr3t-key", '
                       '"extra": {"endpoint_url": "http://127.0.0.1:9000", "conditional_put": "etag"}}')
    assert ui_app.storage_options_from_config("s3://bucket/orders") is None  # none configured: deltalake's defaults
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_STORAGE_CONN_ID", "ui_tables")
    options = ui_app.storage_options_from_config("s3://bucket/orders")
    assert options["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE" and options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["conditional_put"] == "etag"
    assert ui_app.storage_options_from_config("/data/orders") is None  # local tables need none
