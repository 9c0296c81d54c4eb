"""The plugin's registration: the package's ``airflow.plugins`` entry point names it, its view is a
relative link to its app's mount, and ``[airflow_eo] ui_enabled = False`` turns both off."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from airflow_eo.ui.plugin import URL_PREFIX, ExactlyOnceTablesPlugin
from airflow_eo.version_compat import UI_PAGE_SUPPORTED

# below 3.1 the plugin registers nothing: tests/unit/test_version_compat.py checks that there
page_only = pytest.mark.skipif(not UI_PAGE_SUPPORTED, reason="the page needs Airflow 3.1+")


def test_the_entry_point_names_the_plugin():
    (found,) = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("airflow_eo.")]
    assert found.load() is ExactlyOnceTablesPlugin and found.dist.name == "airflow-eo"


@page_only
def test_one_app_and_one_navigation_entry_opening_it():
    plugin = ExactlyOnceTablesPlugin()
    (app,) = plugin.fastapi_apps
    (view,) = plugin.external_views
    assert app["url_prefix"] == URL_PREFIX == "/airflow-eo" and app["app"] is plugin.fastapi_apps[0]["app"]
    assert view["name"] == "Exactly-once tables" and view["destination"] == "nav" and view["category"] == "browse"
    # relative: the UI resolves it against Airflow's base URL, so it works under a path prefix too
    assert view["href"] == "airflow-eo/" and not view["href"].startswith(("/", "http"))
    ExactlyOnceTablesPlugin.validate()


@page_only
def test_ui_enabled_false_registers_nothing(monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_ENABLED", "False")
    plugin = ExactlyOnceTablesPlugin()
    assert plugin.fastapi_apps == [] and plugin.external_views == []
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_ENABLED", "True")
    assert len(plugin.fastapi_apps) == 1
