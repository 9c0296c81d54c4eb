"""`airflow plugins` in the project's environment lists the page's plugin (from the package's
entry point) with its app and navigation entry, and without them when it is turned off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

AIRFLOW = os.path.join(os.path.dirname(sys.executable), "airflow")


def plugins(env: dict) -> dict[str, dict]:
    out = subprocess.run([AIRFLOW, "plugins", "-o", "json"], env=env, check=True, capture_output=True, text=True,
                         timeout=300).stdout
    return {p["name"]: p for p in json.loads(out[out.index("["):])}


def test_airflow_plugins_lists_the_page(airflow_db):
    listed = plugins(os.environ.copy())["airflow_eo"]
    assert listed["source"].startswith("airflow-eo==") and "airflow_eo.ui.plugin:ExactlyOnceTablesPlugin" in listed["source"]
    assert [(a["url_prefix"], a["name"]) for a in listed["fastapi_apps"]] == [("/airflow-eo", "Exactly-once tables")]
    (view,) = listed["external_views"]
    assert (view["name"], view["href"], view["url_route"]) == ("Exactly-once tables", "airflow-eo/", "exactly-once-tables")


def test_turned_off_it_registers_no_page(airflow_db):
    listed = plugins({**os.environ, "AIRFLOW__AIRFLOW_EO__UI_ENABLED": "False"})["airflow_eo"]
    assert listed["fastapi_apps"] == [] and listed["external_views"] == []
