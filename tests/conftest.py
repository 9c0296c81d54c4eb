"""Session-wide real parts: one embedded Kafka broker and one local SparkSession.

Both are started once per test session (spark-submit costs ~15-20 s of JVM start; the
broker ~0.2 s) and stopped by whoever started them. Tests isolate themselves by topic
name and table directory instead.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the streams: a harmless but alarming "--- Logging error ---" otherwise.
logging.getLogger("py4j").setLevel(logging.WARNING)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def broker():
    from airflow_eo.embedded import EmbeddedBroker

    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="session")
def kafka_config(broker) -> dict:
    return dict(broker.config)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from airflow_eo.job import build_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = build_session("airflow-eo tests", {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.sql.shuffle.partitions": "2",
    })
    yield session
    session.stop()


@pytest.fixture
def table_uri(tmp_path) -> str:
    return str(tmp_path / "table")
