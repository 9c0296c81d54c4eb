"""``airflow-eo demo`` through Airflow: run the example DAG once with ``dag.test()``.

Uses a throw-away AIRFLOW_HOME (SQLite) unless one is set, points the ``kafka_default``
and ``spark_default`` connections at the given broker and ``local[2]`` (environment
variables, as a deployment would), and runs ``dags/kafka_to_delta_scheduled.py``
(sensor → ingest) as a manual run. Returns the ingest task's summary (its XCom).

Example::

    >>> run_demo_via_airflow("/tmp/demo/orders", "127.0.0.1:9092")     # doctest: +SKIP
    {'status': 'committed', 'batch': 1, 'version': 0, 'rows': 1000, ...}
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from airflow_eo.attempt import Env

DAGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "dags")
DEMO_DAG_FILE = os.path.join(DAGS_DIR, "kafka_to_delta_scheduled.py")


def prepare_airflow_env(table_uri: str, bootstrap_servers: str, topic: str) -> str:
    """Environment for an in-process Airflow; must run before ``airflow`` is imported."""
    if "airflow" in sys.modules and "AIRFLOW_HOME" not in os.environ:
        raise RuntimeError("airflow was imported before its home was set: call this first")
    home = os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-eo-demo-home-"))
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


def run_demo_via_airflow(table_uri: str, bootstrap_servers: str, topic: str = "orders") -> dict:
    """Run the example DAG once (manual run, no logical date) and return the ingest summary."""
    prepare_airflow_env(table_uri, bootstrap_servers, topic)
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = load_demo_dag()
    dr = dag.test(logical_date=None)
    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag.dag_id, run_id=dr.run_id, task_id="ingest",
                                                 key="return_value").one_or_none()
    if row is None:
        raise RuntimeError(f"the demo DAG run {dr.run_id} ended {dr.state} without an ingest summary; see its log above")
    return json.loads(row.value) if isinstance(row.value, str) else row.value
