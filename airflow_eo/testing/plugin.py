"""The pytest plugin (entry point ``pytest11``: ``airflow_eo``): fixtures to test a DAG that ingests with airflow-eo.

Installed with the extra ``airflow-eo[testing]``; pytest loads it by itself (``-p no:airflow_eo``
turns it off). Importing it imports pytest and nothing heavy: the broker, Kafka clients, deltalake
and Airflow are imported by the fixtures that use them, so a pytest run that uses none of them
pays nothing, and one without the extra fails only where a test asks for a fixture, saying what to
install. Guide: docs/how-to/testing.md.

Fixtures:

* ``kafka_broker`` (session) — the embedded broker (:class:`airflow_eo.testing.kafka.TestBroker`:
  ``bootstrap_servers``, ``config``, ``create_topic``, ``produce``, ``produce_keyed``,
  ``produce_transaction``, ``produce_avro``, ``produce_protobuf``, ``produce_json_schema``, ``records``); while it runs, the Airflow connection
  ``kafka_default`` points at it;
* ``kafka_topic`` — a new topic of 3 partitions on it (its name);
* ``schema_registry`` (session) — a Schema Registry stand-in (``url``, ``config``); the Airflow
  connection ``schema_registry_default`` points at it;
* ``delta_table`` — where a test's table goes (:class:`airflow_eo.testing.tables.TestTable`): a fresh
  local path, or ``s3://`` in a local S3 stand-in (moto) when the test asks with
  ``@pytest.mark.parametrize("delta_table", ["s3"], indirect=True)`` (``["local", "s3"]``: both);
* ``airflow_dag_runner`` — runs a DAG with ``dag.test()`` (:class:`airflow_eo.testing.airflow.DagRunner`),
  optionally killing its ingest at a named protocol step once so the retry must recover;
  ``spark_default`` is spark-submit on ``local[2]`` unless the environment defines it;
* ``spark_jvm_options`` (session) — the Spark JVMs of the session start with a quarter of the CPU
  (:mod:`airflow_eo.testing.spark`); ``airflow_dag_runner`` uses it.

Under pytest-xdist (``-n 2``) each worker has its own broker, Airflow home and database.

Airflow's home: with the extra installed, before test modules are imported, ``AIRFLOW_HOME`` is
pointed at a temporary directory with its own SQLite database (ini option
``airflow_eo_airflow_home = environment`` keeps the environment's Airflow instead). Without the
extra (airflow-eo installed in an image whose tests do not use this plugin) it changes nothing.
"""

from __future__ import annotations

import os
import sys

import pytest

HOME_OPTION = "airflow_eo_airflow_home"


def pytest_addoption(parser) -> None:
    parser.addini(HOME_OPTION, "airflow-eo plugin: 'temp' (default) runs Airflow in a temporary AIRFLOW_HOME with "
                  "its own SQLite database; 'environment' keeps the environment's Airflow configuration",
                  default="temp")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Isolate Airflow before conftests and test modules import it (its configuration is read then)."""
    if early_config.getini(HOME_OPTION) == "environment" or "airflow" in sys.modules or not _extra_installed():
        return  # asked for, too late (airflow's configuration is read), or not this plugin's session
    from airflow_eo.testing.airflow import isolate_airflow

    isolate_airflow()


def _extra_installed() -> bool:
    """Whether ``airflow-eo[testing]`` is installed: without it (airflow-eo in an image whose tests are
    not written with this plugin) the plugin changes nothing of the session, Airflow's home included."""
    from importlib.util import find_spec

    return all(find_spec(name) is not None for name in ("noida_db", "kafka"))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "airflow_eo: a test of a DAG that ingests with airflow-eo (for selection)")


def _needs_extra(what: str, exc: ImportError):
    return pytest.fail(f"the airflow-eo plugin's {what} needs the testing extra ({exc}): "
                       "pip install 'airflow-eo[testing]'", pytrace=False)


class _EnvVars:
    """Environment variables set for a fixture's life, the previous values restored after."""

    def __init__(self):
        self.saved: dict[str, str | None] = {}

    def set(self, name: str, value: str) -> None:
        self.saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def restore(self) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def kafka_broker():
    """The embedded Kafka broker of the session; ``kafka_default`` points at it while it runs."""
    try:
        import kafka  # noqa: F401 - the assertions' reader

        from airflow_eo.demo.broker import broker_binary
        from airflow_eo.testing.kafka import TestBroker

        broker_binary()  # noida-db's binary: checked before anything starts
    except (ImportError, FileNotFoundError) as exc:
        _needs_extra("kafka_broker", ImportError(str(exc)))
    env = _EnvVars()
    broker = TestBroker.start()
    env.set("AIRFLOW_CONN_KAFKA_DEFAULT", broker.airflow_connection())
    try:
        yield broker
    finally:
        env.restore()
        broker.close()


@pytest.fixture
def kafka_topic(kafka_broker) -> str:
    """A new topic of 3 partitions on the session's broker."""
    return kafka_broker.create_topic(partitions=3)


@pytest.fixture(scope="session")
def schema_registry():
    """A Schema Registry stand-in (the subset of the REST API producers and airflow-eo call);
    ``schema_registry_default`` points at it while it runs."""
    import json

    from airflow_eo.testing.registry import RegistryDouble

    env = _EnvVars()
    with RegistryDouble() as registry:
        env.set("AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT", json.dumps({"conn_type": "http", "host": registry.url}))
        try:
            yield registry
        finally:
            env.restore()


@pytest.fixture(scope="session")
def s3_stand_in(tmp_path_factory):
    """A local S3 endpoint (moto_server) with one bucket, for ``s3://`` tables."""
    try:
        import boto3  # noqa: F401 - moto[server] brings it

        from airflow_eo.testing.s3 import MotoS3
    except ImportError as exc:
        _needs_extra("s3 stand-in", exc)
    with MotoS3(tmp_path_factory.mktemp("s3")) as s3:
        yield s3


@pytest.fixture
def delta_table(request, tmp_path):
    """Where this test's Delta table goes: a fresh local path; ``s3://`` in the local S3 stand-in when
    parametrized indirectly with ``"s3"``. Its ``storage_conn_id`` (an ``aws`` connection, set for the
    test) and ``storage_options`` reach it."""
    from airflow_eo.testing.tables import TestTable

    where = getattr(request, "param", "local")
    if where == "local":
        yield TestTable.local(tmp_path / "table")
        return
    if where != "s3":
        raise ValueError(f"delta_table is 'local' or 's3', not {where!r}")
    s3 = request.getfixturevalue("s3_stand_in")
    table = TestTable.on_s3(s3, f"{request.node.name}-{os.urandom(4).hex()}".replace("[", "-").replace("]", ""))
    env = _EnvVars()
    env.set(f"AIRFLOW_CONN_{table.storage_conn_id.upper()}", table.airflow_connection)
    try:
        yield table
    finally:
        env.restore()


@pytest.fixture(scope="session")
def airflow_db():
    """``airflow db migrate`` of the session's Airflow (once)."""
    from airflow_eo.testing.airflow import migrate

    migrate()
    return os.environ.get("AIRFLOW_HOME")


@pytest.fixture(scope="session")
def spark_jvm_options():
    """The Spark JVMs this session starts run with the C1 compiler, the serial collector and a class archive
    built once per environment (:mod:`airflow_eo.testing.spark`: a spark-submit's start costs a quarter of
    the CPU); ``AIRFLOW_EO_TEST_JVM=default`` keeps Spark's own settings. Returns ``SPARK_SUBMIT_OPTS``."""
    from airflow_eo.testing.spark import OPTIONS_ENV, ClassArchive

    env = _EnvVars()
    env.set(OPTIONS_ENV, os.environ.get(OPTIONS_ENV, ""))
    archive = ClassArchive()
    archive.apply()
    try:
        yield os.environ[OPTIONS_ENV]
    finally:
        archive.stop()
        env.restore()


@pytest.fixture
def airflow_dag_runner(airflow_db, kafka_broker, spark_jvm_options, tmp_path):
    """Runs a DAG with ``dag.test()`` against the session's broker (``runner.run(dag, fail_at=...)``)."""
    import json

    from airflow_eo.testing.airflow import SPARK_CONNECTION, DagRunner

    env = _EnvVars()
    if "AIRFLOW_CONN_SPARK_DEFAULT" not in os.environ:
        env.set("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(SPARK_CONNECTION))
    env.set("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # Spark's Python workers: this interpreter's
        env.set(name, os.environ.get(name, sys.executable))
    try:
        yield DagRunner(tmp_path)
    finally:
        env.restore()
