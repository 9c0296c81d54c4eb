"""The Airflow plugin "Exactly-once tables": a page in Airflow's UI, registered by the package's ``airflow.plugins`` entry point.

Installing airflow-eo adds it (``airflow plugins`` lists ``airflow_eo``): the API server
mounts the page's app (:mod:`airflow_eo.ui.app`) under ``/airflow-eo``, with a root middleware
that redirects the bare ``/airflow-eo`` there (:mod:`airflow_eo.ui.redirect`), and the UI shows a
navigation entry "Exactly-once tables" (under Browse) that opens it in the UI's frame. The
app is built only when Airflow asks for it, so the other processes that load plugins (the
scheduler, the workers) import nothing of it.

The page needs Airflow 3.1 or later (a plugin's ``external_views`` arrived in 3.1): on 2.11 and
3.0 the plugin loads and registers no app and no view, and the rest of the provider works as on
3.1+ (:data:`airflow_eo.version_compat.UI_PAGE_SUPPORTED`).

Turn it off with ``[airflow_eo] ui_enabled = False`` (``AIRFLOW__AIRFLOW_EO__UI_ENABLED=False``):
the plugin then registers no app and no view. ``[airflow_eo] ui_storage_conn_id`` names an
``aws`` connection the page reads object-store tables with.

Example::

    >>> [view["url_route"] for view in ExactlyOnceTablesPlugin().external_views]   # doctest: +SKIP
    ['exactly-once-tables']
"""

from __future__ import annotations

from functools import cache

# the Task SDK's class from 3.2 (a worker with the SDK alone loads the plugin too), core's before:
# common-compat picks the one the installed Airflow has
from airflow.providers.common.compat.sdk import AirflowPlugin

from airflow_eo.version_compat import UI_PAGE_SUPPORTED

from airflow_eo.ui.urls import NAME, URL_PREFIX, URL_ROUTE


def enabled() -> bool:
    """The page is served: Airflow 3.1+ and not turned off."""
    if not UI_PAGE_SUPPORTED:
        return False
    from airflow.providers.common.compat.sdk import conf

    return conf.getboolean("airflow_eo", "ui_enabled", fallback=True)


@cache
def _app():
    from airflow_eo.ui.app import create_app

    return create_app()


class ExactlyOnceTablesPlugin(AirflowPlugin):
    """airflow-eo's page of every exactly-once table (see the module doc)."""

    name = "airflow_eo"

    @property  # type: ignore[override]
    def fastapi_apps(self) -> list[dict]:
        if not enabled():
            return []
        return [{"app": _app(), "url_prefix": URL_PREFIX, "name": NAME}]

    @property  # type: ignore[override]
    def fastapi_root_middlewares(self) -> list[dict]:
        if not enabled():
            return []
        from airflow_eo.ui.redirect import TrailingSlash

        # a mount serves only the paths below it: /airflow-eo itself would be the UI's 404
        return [{"middleware": TrailingSlash, "args": [], "kwargs": {"prefix": URL_PREFIX},
                 "name": "airflow-eo: /airflow-eo to /airflow-eo/"}]

    @property  # type: ignore[override]
    def external_views(self) -> list[dict]:
        if not enabled():
            return []
        # href is relative: the UI resolves it against Airflow's base URL (<base href> of its page)
        return [{"name": NAME, "href": URL_PREFIX.lstrip("/") + "/", "destination": "nav", "category": "browse",
                 "url_route": URL_ROUTE}]
