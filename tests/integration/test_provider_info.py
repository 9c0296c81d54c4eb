"""Provider registration: `airflow providers list` shows airflow-eo, installed as a package.

The fresh-environment test builds the package and pip-installs it (``--no-deps``) into a
new venv that sees the project's dependencies through a ``.pth`` file instead of
downloading them, then asks that venv's ``airflow providers list``.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys

from airflow_eo.provider_info import provider_info
from airflow_eo.version_compat import UI_PAGE_SUPPORTED
from tests.conftest import REPO

PROVIDER_KEYS = ("hooks", "operators", "sensors", "triggers", "extra-links")


def json_list(out: str, what: str, required: bool = True) -> list[dict]:
    """The JSON list a CLI command printed, after whatever log lines came first (Airflow 3.0 logs
    lines that start with "[" before it, so the first "[" is not the list); ``required=False``: none
    printed is an empty list (`airflow plugins` with no plugin that registers anything)."""
    decoder = json.JSONDecoder()
    for i, char in enumerate(out):
        if char == "[":
            try:
                value, _ = decoder.raw_decode(out, i)
            except ValueError:
                continue
            if isinstance(value, list):
                return value
    if not required:
        return []
    raise AssertionError(f"{what} printed no JSON list: {out[-2000:]}")


def providers_json(airflow_bin: str, env: dict) -> list[dict]:
    out = subprocess.run([airflow_bin, "providers", "list", "-o", "json"], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json_list(out, "airflow providers list")


def test_airflow_providers_list_shows_it(airflow_db):
    listed = {p["package_name"]: p for p in providers_json(os.path.join(os.path.dirname(sys.executable), "airflow"),
                                                           os.environ.copy())}
    assert listed["airflow-eo"]["version"] == provider_info()["versions"][0]


def test_fresh_environment_install_lists_provider(tmp_path, airflow_db):
    """Build the wheel (pip, isolated build), install it --no-deps into a fresh venv."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), REPO],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = wheels.glob("airflow_eo-*.whl")
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin/python")
    fresh_site = subprocess.run([python, "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    # dependencies come from the dev venv (appended after the fresh site-packages), the
    # project itself only from the wheel
    with open(os.path.join(fresh_site, "deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, env=env, timeout=300)
    where = subprocess.run([python, "-c", "import airflow_eo;print(airflow_eo.__file__)"],
                           check=True, capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    assert where.startswith(fresh_site), where
    out = subprocess.run([python, "-m", "airflow", "providers", "list", "-o", "json"],
                         env=env, check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path).stdout
    listed = {p["package_name"]: p for p in json_list(out, "airflow providers list")}
    assert listed["airflow-eo"]["version"] == provider_info()["versions"][0]
    # the UI page's plugin comes with the wheel, its templates and stylesheet too (package data)
    done = subprocess.run([python, "-m", "airflow", "plugins", "-o", "json"],
                          env=env, check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said = done.stdout + done.stderr  # Airflow logs a plugin that fails to load and goes on (exit 0)
    assert "Failed to import plugin" not in said and "Failed to load plugin" not in said, said[-3000:]
    plugins = {p["name"]: p for p in json_list(done.stdout, "airflow plugins", required=UI_PAGE_SUPPORTED)}
    if UI_PAGE_SUPPORTED:
        assert plugins["airflow_eo"]["fastapi_apps"][0]["url_prefix"] == "/airflow-eo"
    else:  # below Airflow 3.1 the plugin loads and registers no page (no external views there)
        assert not (plugins.get("airflow_eo") or {}).get("fastapi_apps"), plugins
    page = subprocess.run([python, "-c", "from datetime import datetime, timezone; from airflow_eo.ui.render import "
                           "render_list; print(render_list([], datetime.now(timezone.utc)))"],
                          env=env, check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    assert "Exactly-once tables" in page and "svg.chart" in page  # the template, with the stylesheet inlined
