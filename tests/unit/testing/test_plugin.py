"""The pytest plugin as pytest finds it: registered by the package's entry point, light to load (it
imports nothing heavy before a fixture is used), its fixtures listed in a fresh pytest run of a
directory that knows nothing of airflow-eo, its exports resolved on first use."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

HEAVY = ("airflow", "deltalake", "confluent_kafka", "kafka", "pyarrow", "pyspark", "noida_db", "boto3")
FIXTURES = ("kafka_broker", "kafka_topic", "schema_registry", "delta_table", "airflow_dag_runner", "airflow_db",
            "spark_jvm_options")


def test_pytest_finds_the_plugin_by_its_entry_point():
    found = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert found.get("airflow_eo") == "airflow_eo.testing.plugin"


def test_loading_the_plugin_imports_nothing_heavy():
    code = ("import sys, airflow_eo.testing.plugin, airflow_eo.testing; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_a_fresh_pytest_run_lists_the_fixtures_and_isolates_airflow(tmp_path):
    (tmp_path / "test_nothing.py").write_text(
        "import os\n\ndef test_home():\n    assert os.environ['AIRFLOW_HOME'].startswith(os.environ['TMPDIR'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(TMPDIR=str(tmp_path), AIRFLOW_HOME="/nonexistent/user-airflow")
    listed = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "-q", "-p", "no:cacheprovider"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert all(f"{name} " in listed.stdout or f"{name}\n" in listed.stdout for name in FIXTURES), listed.stdout
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_nothing.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-2000:]  # the user's AIRFLOW_HOME was replaced by a temporary one
    kept = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                           "airflow_eo_airflow_home=environment", "test_nothing.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert kept.returncode == 1 and "/nonexistent/user-airflow" in kept.stdout  # kept as the environment has it


def test_the_exports_resolve_and_nothing_else_does():
    import airflow_eo.testing as testing

    for name in testing.__all__:
        assert getattr(testing, name) is not None
    with pytest.raises(AttributeError):
        testing.assert_everything  # noqa: B018


def test_without_the_extra_the_plugin_changes_nothing_and_its_fixtures_name_the_extra(tmp_path):
    """airflow-eo installed without ``[testing]`` (here: noida_db hidden): the session keeps its own
    AIRFLOW_HOME, and a test that asks for the broker fails saying what to install."""
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text("import sys\nsys.modules['noida_db'] = None\n")
    (tmp_path / "test_user.py").write_text(
        "import os\n\ndef test_home():\n    assert os.environ['AIRFLOW_HOME'] == '/srv/their-airflow'\n\n"
        "def test_broker(kafka_broker):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME="/srv/their-airflow", PYTHONPATH=str(tmp_path / "hide"))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "1 passed" in ran.stdout and "1 error" in ran.stdout, ran.stdout[-3000:]
    assert "needs the testing extra" in ran.stdout and "pip install 'airflow-eo[testing]'" in ran.stdout


def test_each_xdist_worker_runs_airflow_in_a_home_of_its_own(tmp_path):
    """Under pytest-xdist, each worker's Airflow home (and SQLite database) is its own: two processes
    writing one SQLite file lock each other out."""
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os, pathlib\n\ndef test_home():\n"
            f"    pathlib.Path({str(tmp_path / name)!r}).write_text(os.environ['PYTEST_XDIST_WORKER'] + ' ' + "
            "os.environ['AIRFLOW_HOME'] + ' ' + os.environ['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(TMPDIR=str(tmp_path))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadfile", "test_a.py", "test_b.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    (worker_a, home_a, db_a), (worker_b, home_b, db_b) = ((tmp_path / n).read_text().split() for n in ("a", "b"))
    assert worker_a != worker_b and home_a != home_b and db_a != db_b
    assert home_a.startswith(str(tmp_path)) and home_b.startswith(str(tmp_path)) and home_a in db_a


def test_the_spark_jvm_options_keep_what_the_environment_chose(monkeypatch, tmp_path):
    from airflow_eo.testing.spark import QUIET, ClassArchive

    archive = ClassArchive(tmp_path)
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:+UseG1GC -Xmx1g")
    assert archive.options().split() == ["-XX:+UseG1GC", "-Xmx1g", "-XX:TieredStopAtLevel=1"]
    archive.path = tmp_path / "spark-0123.jsa"  # named before it exists: a JVM then runs without it, silently
    assert archive.options().split()[-2:] == [f"-XX:SharedArchiveFile={archive.path}", QUIET]
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xshare:off")
    assert "SharedArchiveFile" not in archive.options()
    monkeypatch.setenv("AIRFLOW_EO_TEST_JVM", "default")
    archive.apply()
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-Xshare:off" and archive.state.startswith("off")
    monkeypatch.setenv("AIRFLOW_EO_TEST_JVM", "options")  # the options, no archive built or named
    monkeypatch.delenv("SPARK_SUBMIT_OPTS")
    ClassArchive(tmp_path / "none").apply()
    assert os.environ["SPARK_SUBMIT_OPTS"].split() == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    assert not (tmp_path / "none").exists()
