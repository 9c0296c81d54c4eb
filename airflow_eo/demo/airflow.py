"""``airflow-eo demo`` through Airflow: run the example DAG once with ``dag.test()``.

Uses the AIRFLOW_HOME set (the demo sets one in its data directory; else a new temporary
one, SQLite), points the ``kafka_default``
and ``spark_default`` connections at the given broker and ``local[2]`` (environment
variables, as a deployment would), and runs ``dags/kafka_to_delta_scheduled.py``
(sensor → ingest) as a manual run with a logical date (``airflow dags trigger -e``). Returns the
ingest task's summary (its XCom) and the run's identity; the same logical date again re-runs that
run id with its task instances and XCom gone, as a clear does.

Example::

    >>> run_demo_via_airflow("/tmp/demo/orders", "127.0.0.1:9092").summary     # doctest: +SKIP
    {'status': 'committed', 'batch': 1, 'version': 0, 'rows': 1000, ...}
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone

from airflow_eo.attempt import Env

DAGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "dags")
DEMO_DAG_FILE = os.path.join(DAGS_DIR, "kafka_to_delta_scheduled.py")


def prepare_airflow_env(table_uri: str, bootstrap_servers: str, topic: str) -> str:
    """Environment for an in-process Airflow; must run before ``airflow`` is imported."""
    if "airflow" in sys.modules and "AIRFLOW_HOME" not in os.environ:
        raise RuntimeError("airflow was imported before its home was set: call this first")
    if "AIRFLOW_HOME" not in os.environ:  # only then: a temporary home nobody would remove otherwise
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-eo-demo-home-")
    home = os.environ["AIRFLOW_HOME"]
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", DAGS_DIR)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap_servers}})
    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    os.environ[Env.EXAMPLE_TABLE_URI] = table_uri
    os.environ[Env.EXAMPLE_TOPIC] = topic
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"], check=True,
                   stdout=subprocess.DEVNULL, env=os.environ.copy())
    return home


def load_demo_dag():
    spec = importlib.util.spec_from_file_location("kafka_to_delta_scheduled", DEMO_DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


@dataclass(frozen=True)
class DemoRun:
    """One ``dag.test()`` run of the example DAG: the ingest task's summary and the run's identity."""

    summary: dict
    run_id: str
    logical_date: datetime


def run_demo_via_airflow(table_uri: str, bootstrap_servers: str, topic: str = "orders",
                         logical_date: datetime | None = None, ingest_only: bool = False) -> DemoRun:
    """Run the example DAG once. The ``logical_date`` of an earlier run re-runs that run id (what a
    clear does: the same run key, XCom gone; without a logical date dag.test() makes a new random
    run id each time); ``ingest_only`` marks the sensor done, as clearing only the ingest task would."""
    prepare_airflow_env(table_uri, bootstrap_servers, topic)
    from airflow_eo.version_compat import dag_test, task_return_value

    dag = load_demo_dag()
    logical_date = logical_date or datetime.now(timezone.utc).replace(microsecond=0)
    dr = dag_test(dag, logical_date, mark_success_pattern="^wait_for_records$" if ingest_only else None)
    summary = task_return_value(dag.dag_id, dr.run_id, "ingest")
    if summary is None:
        raise RuntimeError(f"the demo DAG run {dr.run_id} ended {dr.state} without an ingest summary; see its log")
    return DemoRun(summary, dr.run_id, logical_date)
