"""The page's own error pages: what went wrong in a sentence, a link back to the table list, and Airflow's login when that is what is missing.

Installed on the page's app (:func:`install`): a refused request (401 without a session, 403 with
a bad token or without the rights), an unknown table (404), and a request whose parameters are
missing or malformed (400, not FastAPI's raw JSON 422) each get an HTML page in the page's own
style. The login link goes through Airflow's public ``/api/v2/auth/login`` (which forwards to
whatever auth manager is configured) and comes back to the page in the UI.

Example::

    >>> install(app)                                       # doctest: +SKIP
"""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_eo.ui.urls import URL_PREFIX, URL_ROUTE
from airflow_eo.ui.render import render_message

# what each page's parameters are, for the 400 page
PARAMETERS = {"/table": "a table's page needs ?asset=<the table's Asset id, a number>&ingest=<its ingest id>"}


def root_of(request: Request) -> str:
    """The table list relative to the page asked for (every page sits directly under the mount)."""
    depth = request.url.path.rstrip("/").count("/") - request.scope.get("root_path", "").rstrip("/").count("/")
    return "./" if depth <= 1 else "../" * (depth - 1)


def login_href(request: Request) -> str:
    """Airflow's login, relative to the page, coming back to this page inside the UI."""
    mount = request.scope.get("root_path", "").rstrip("/")
    base = mount[: -len(URL_PREFIX)] if mount.endswith(URL_PREFIX) else ""
    return root_of(request) + "../api/v2/auth/login?" + urlencode({"next": f"{base}/plugin/{URL_ROUTE}"})


def install(app: FastAPI, headers: dict[str, str]) -> None:
    """The error pages of ``app`` (each answer with ``headers``, the page's own)."""

    def page(request: Request, status: int, message: str, detail: str | None = None,
             extra_headers: dict | None = None) -> HTMLResponse:
        login = login_href(request) if status in (401, 403) else None
        html = render_message(status, message, datetime.now(timezone.utc), root=root_of(request), login_href=login,
                              detail=detail)
        response = HTMLResponse(html, status_code=status, headers=headers)
        response.headers.update(extra_headers or {})
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        detail = None
        if exc.status_code == 401:
            detail = "Log in to Airflow (the page opens inside Airflow's UI, under Browse › Exactly-once tables)."
        return page(request, exc.status_code, str(exc.detail), detail, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(request: Request, exc: RequestValidationError) -> HTMLResponse:
        wrong = sorted({".".join(str(p) for p in e.get("loc", ())[1:]) or "request" for e in exc.errors()})
        route = request.url.path[len(request.scope.get("root_path", "").rstrip("/")):] or "/"
        need = PARAMETERS.get(route, "this page's parameters")
        return page(request, 400, f"Missing or malformed: {', '.join(wrong)}. This link is not one the page makes: {need}.",
                    "Open the table from the list.")
