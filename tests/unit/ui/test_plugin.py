"""The plugin's registration: the package's ``airflow.plugins`` entry point names it, its view is a
relative link to its app's mount, and ``[airflow_eo] ui_enabled = False`` turns both off."""

from __future__ import annotations

from importlib.metadata import entry_points

from airflow_eo.ui.plugin import URL_PREFIX, ExactlyOnceTablesPlugin


def test_the_entry_point_names_the_plugin():
    (found,) = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("airflow_eo.")]
    assert found.load() is ExactlyOnceTablesPlugin and found.dist.name == "airflow-eo"


def test_one_app_and_one_navigation_entry_opening_it():
    plugin = ExactlyOnceTablesPlugin()
    (app,) = plugin.fastapi_apps
    (view,) = plugin.external_views
    assert app["url_prefix"] == URL_PREFIX == "/airflow-eo" and app["app"] is plugin.fastapi_apps[0]["app"]
    assert view["name"] == "Exactly-once tables" and view["destination"] == "nav" and view["category"] == "browse"
    # relative: the UI resolves it against Airflow's base URL, so it works under a path prefix too
    assert view["href"] == "airflow-eo/" and not view["href"].startswith(("/", "http"))
    ExactlyOnceTablesPlugin.validate()


def test_ui_enabled_false_registers_nothing(monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_ENABLED", "False")
    plugin = ExactlyOnceTablesPlugin()
    assert plugin.fastapi_apps == [] and plugin.external_views == []
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_ENABLED", "True")
    assert len(plugin.fastapi_apps) == 1
