"""The plugin's FastAPI app: the table list and a table's page, only for users Airflow's auth manager lets read them.

Mounted by Airflow's API server under ``/airflow-eo`` (:mod:`airflow_eo.ui.plugin`). Both pages
are ``GET`` only and write nothing.

Who may see what (Airflow 3.3's own rules, through its auth manager):

* **Authentication** is Airflow's: :func:`airflow.api_fastapi.core_api.security.get_user`
  takes the JWT from the ``Authorization: Bearer`` header (REST clients, ``POST /auth/token``)
  or from the ``_token`` cookie the UI sets at login (the page opens in the UI's frame, which
  sends it). No or a bad token: 401 / 403, before anything is read.
* **Authorization**: the user must be allowed to read Assets
  (``is_authorized_asset(method="GET")``); the list holds a table only if the user may read
  every DAG whose task wrote it (``get_authorized_dag_ids(method="GET")``) and its Asset; a
  table's page answers 403 otherwise. So a user without access to a DAG does not see its
  tables, nor the run ids and offsets in their logs.

Each view reads each table's Delta log once (:class:`~airflow_eo.ui.tables.TableReader`,
tables read in parallel threads); the Airflow records come from the API server's database
session. Table URIs are shown without credentials.

Example::

    >>> app = create_app()                                     # doctest: +SKIP
    >>> TestClient(app).get("/", headers={"Authorization": f"Bearer {token}"}).status_code  # doctest: +SKIP
    200
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from airflow_eo.ui import errors
from airflow_eo.ui.events import TableRef, TaskRun, find_tables, lag_history, last_runs
from airflow_eo.ui.render import ListRow, render_list, render_table, script_source
from airflow_eo.ui.tables import TableReader, TableState

log = logging.getLogger(__name__)

READ_THREADS = 8  # tables read at once (their logs are read in native code, mostly outside the GIL)

# The page embeds nothing from elsewhere and runs one script of its own (allowed by its hash: the
# links to Airflow's pages open in the whole window, airflow_eo/ui/static/ui.js); it may be framed
# by the Airflow UI only.
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": f"default-src 'none'; script-src {script_source()}; style-src 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; form-action 'none'",
}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _page(html: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def readable(user, tables: list[TableRef], session) -> list[TableRef]:
    """The tables ``user`` may see: Assets readable, and every writer DAG readable (403 when the
    user may read no Asset at all)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AssetDetails

    auth = get_auth_manager()
    if not auth.is_authorized_asset(method="GET", user=user):
        raise HTTPException(403, "You may not read Assets, so not the tables airflow-eo's Asset events name.")
    if not tables:
        return []
    dags = auth.get_authorized_dag_ids(user=user, method="GET", session=session)
    return [t for t in tables if t.dag_ids <= dags and
            auth.is_authorized_asset(method="GET", user=user, details=AssetDetails(id=str(t.asset_id)))]


def read_states(reader: TableReader, tables: list[TableRef]) -> dict[tuple[str, str], TableState]:
    """Each table's state, every table's log opened once (its ingest ids read together)."""
    by_uri: dict[str, list[str]] = defaultdict(list)
    for t in tables:
        by_uri[t.table_uri].append(t.ingest_id)
    with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(by_uri)))) as pool:
        found = pool.map(lambda item: (item[0], reader.states(item[0], item[1])), by_uri.items())
        return {(uri, ingest): state for uri, states in found for ingest, state in states.items()}


def newest_run(runs: dict[tuple[str, str, int], TaskRun], table: TableRef) -> TaskRun | None:
    mine = [runs[k] for k in ((w.dag_id, w.task_id, w.map_index) for w in table.writers) if k in runs]
    return max(mine, key=lambda r: r.when or datetime.min.replace(tzinfo=timezone.utc), default=None)


def create_app(reader: TableReader | None = None) -> FastAPI:
    """The app Airflow mounts (one :class:`TableReader`, and its commit cache, per app)."""
    reader = reader or TableReader(storage_options=storage_options_from_config)
    app = FastAPI(title="airflow-eo: exactly-once tables", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.reader = reader
    errors.install(app, HEADERS)  # the page's own error pages, a missing or bad parameter's too

    @app.get("/", response_class=HTMLResponse)
    def table_list(user: GetUserDep, session: SessionDep) -> HTMLResponse:
        tables = readable(user, find_tables(session), session)
        states = read_states(reader, tables)
        runs = last_runs(session, [w for t in tables for w in t.writers])
        rows = [ListRow(t, states[(t.table_uri, t.ingest_id)], newest_run(runs, t)) for t in tables]
        return _page(render_list(rows, _now()))

    @app.get("/table", response_class=HTMLResponse)
    def table_page(user: GetUserDep, session: SessionDep, asset: int = Query(..., description="the table's Asset id"),
                   ingest: str = Query(..., max_length=128, description="the ingest id")) -> HTMLResponse:
        every = [t for t in find_tables(session) if t.asset_id == asset and t.ingest_id == ingest]
        if not every:
            raise HTTPException(404, f"No table of ingest id {ingest!r} at Asset {asset} was written by an airflow-eo task.")
        (table,) = readable(user, every, session) or [None]
        if table is None:
            raise HTTPException(403, "You may not read every DAG that writes this table, or its Asset.")
        detail = reader.detail(table.table_uri, table.ingest_id)
        runs = last_runs(session, table.writers)
        return _page(render_table(table, detail, newest_run(runs, table), lag_history(session, table), _now()))

    return app


def storage_options_from_config(table_uri: str) -> dict[str, str] | None:
    """Object-store tables: the options of the ``aws`` connection named by ``[airflow_eo]
    ui_storage_conn_id`` (none: deltalake's defaults, e.g. the API server's instance role)."""
    from airflow.configuration import conf

    from airflow_eo.table.storage import is_local

    conn_id = conf.get("airflow_eo", "ui_storage_conn_id", fallback="") or ""
    if is_local(table_uri) or not conn_id.strip():
        return None
    from airflow_eo.hooks.storage import storage_options_of

    return storage_options_of(conn_id.strip())
