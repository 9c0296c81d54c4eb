"""Session-wide real parts: one embedded Kafka broker, one local SparkSession, and Airflow.

The broker and Spark are started once per test session (spark-submit costs ~15-20 s of JVM
start; the broker ~0.2 s) and stopped by whoever started them. Tests isolate themselves by
topic name and table directory instead. The broker, the Airflow database and the throw-away
AIRFLOW_HOME are the pytest plugin's (airflow_eo/testing/plugin.py), which users' tests get too:
the project tests itself with them rather than with a second copy.

Airflow's home is set before anything imports airflow (its config is read at import): the
plugin sets it when pytest starts, this conftest adds the repository's DAGs folder. The
connections are environment variables (AIRFLOW_CONN_*), as a deployment would set them: ``kafka_default`` points at the session's embedded broker,
``spark_default`` at ``local[2]`` so SparkSubmitHook runs the real spark-submit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

import pytest

from airflow_eo.testing.airflow import isolate_airflow
# the suite's scheduling side by side, its areas and its start-up report (tests/scheduling.py)
from tests.scheduling import (  # noqa: F401 - pytest finds hooks by name here
    pytest_addoption, pytest_collection_modifyitems, pytest_configure, pytest_runtest_logreport,
    pytest_sessionfinish, pytest_terminal_summary, pytest_testnodedown,
)

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the streams: a harmless but alarming "--- Logging error ---" otherwise.
logging.getLogger("py4j").setLevel(logging.WARNING)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# A worker holds Spark Connect clients (gRPC) and later starts the local session's JVM, which pyspark
# forks with a preexec_fn: the child then runs gRPC's fork handlers, which with another thread inside
# gRPC are skipped half-way ("skipping fork() handlers", then "Epoll1Poller: Bad file descriptor") and
# the JVM died at start ([JAVA_GATEWAY_EXITED]), failing every Spark test of that worker, depending on
# which tests it had run first. Every child here execs at once and never uses gRPC, so gRPC's fork
# support (read when grpc is first imported, which nothing has done yet) is off for the session.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
if "grpc" in sys.modules:  # pragma: no cover - too late for the setting above
    warnings.warn("grpc was imported before tests/conftest.py: its fork support stays on", stacklevel=1)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)

if "airflow" in sys.modules:  # pragma: no cover - a wrong import order would test the user's home
    warnings.warn("airflow was imported before tests/conftest.py: AIRFLOW_HOME may not be the test one", stacklevel=1)
# the plugin's throw-away Airflow (airflow_eo/testing/airflow.py: made when pytest started), with this
# repository's example DAGs as its DAGs folder
AIRFLOW_HOME = isolate_airflow(dags_folder=os.path.join(REPO, "dags"))
os.environ.update({"SPARK_LOCAL_IP": "127.0.0.1", "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")})
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}


@pytest.fixture(scope="session")
def airflow_connections(broker):
    """``kafka_default`` (set by the plugin's broker) and ``spark_default``: spark-submit on local[2]."""
    from airflow_eo.testing.airflow import SPARK_CONNECTION

    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(SPARK_CONNECTION)
    yield {"kafka_default": broker.bootstrap_servers}
    os.environ.pop("AIRFLOW_CONN_SPARK_DEFAULT", None)


@pytest.fixture(scope="session")
def broker(kafka_broker):
    """The session's embedded broker: the plugin's (airflow_eo/testing/plugin.py), as the tests drive it."""
    return kafka_broker.broker


@pytest.fixture(scope="session")
def kafka_config(broker) -> dict:
    return dict(broker.config)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from airflow_eo.driver.session import build_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    # its scratch (spark-*, blockmgr-*) in the session's temporary directory, not /tmp, where tests look
    # for what a process left behind (tests/integration/test_demo.py) while another worker runs
    scratch = tmp_path_factory.mktemp("spark-scratch")
    session = build_session("airflow-eo tests", {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(scratch),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
    })
    yield session
    session.stop()


@pytest.fixture
def table_uri(tmp_path) -> str:
    return str(tmp_path / "table")


def build_config(table_uri: str, topics, kafka_config: dict, *, ingest_id: str = "test", **options):
    """The ingest's config: ``topics`` (one name or several) into ``table_uri``; ``options`` are its
    settings (``max_records_per_run=...``, ``transform=...``)."""
    from airflow_eo.loop.config import IngestConfig

    names = [topics] if isinstance(topics, str) else list(topics)
    # Tests run their batches as Spark tasks, on the Spark path they name, as their size would not:
    # a batch within driver_read_max_offsets is read by the driver itself (its own tests: the
    # "driver" path of tests/integration/test_ingest.py, tests/integration/driver/test_direct.py,
    # the CLI's and the kill tests, which run with the defaults)
    options.setdefault("driver_read_max_offsets", 0)
    return IngestConfig(table_uri=table_uri, ingest_id=ingest_id, topics=names, kafka_config=kafka_config, **options)


def build_ingestion(table_uri: str, topics, kafka_config: dict, submitter, *, ingest_id: str = "test", **options):
    """An ``Ingestion`` (:func:`build_config`) that runs its attempts with ``submitter``. The one place
    tests build it."""
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.spec import DEFAULT_DRIVER_READ_MAX_OFFSETS

    if isinstance(submitter, DriverSubmitter):  # the spec's own default: small batches read by the driver
        options.setdefault("driver_read_max_offsets", DEFAULT_DRIVER_READ_MAX_OFFSETS)
    return Ingestion(build_config(table_uri, topics, kafka_config, ingest_id=ingest_id, **options), submitter)


@pytest.fixture(scope="session")
def ingestion():
    """Builds an ingestion: ``ingestion(table_uri, topics, kafka_config, submitter, **options)``.
    A module narrows it by overriding the fixture with ``functools.partial(ingestion, ...)``."""
    return build_ingestion


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """One warm Spark Connect server per test session (the path of ``--remote`` / ``spark_connect``)."""
    from airflow_eo.submit.connect_server import ConnectServer

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    from airflow_eo.submit.connect import close_clients

    with ConnectServer(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}, log_file=str(log)) as server:
        try:
            yield server
        finally:  # while the server still answers: no client left to release its session at exit
            close_clients()


class DriverSubmitter:
    """Runs attempts in this process with the spec's default ``driver_read_max_offsets``: a direct
    batch is read by the driver itself (the session only for batches that need Spark)."""

    def __init__(self, spark):
        self.spark = spark

    def submit(self, attempt, secrets):
        from airflow_eo.driver.main import run_attempt

        run_attempt(self.spark, attempt, secrets)


class SparkPath:
    """One way to run attempts: the session's local SparkSession, the warm Connect server, or the
    driver's own read of small direct batches (``driver``)."""

    def __init__(self, name: str, spark=None, url: str | None = None):
        self.name, self.spark, self.url = name, spark, url
        self._sessions: list = []

    def submitter(self):
        from airflow_eo.driver.main import InProcessSubmitter
        from airflow_eo.submit.connect import ConnectSubmitter

        if self.name == "driver":
            return DriverSubmitter(self.spark)
        return InProcessSubmitter(self.spark) if self.url is None else ConnectSubmitter(self.url)

    def session(self):
        """A session to run the driver with directly (a Connect session of its own per test)."""
        if self.url is None:
            return self.spark
        from pyspark.sql import SparkSession

        from airflow_eo.attempt import SPARK_DEFAULTS

        builder = SparkSession.builder.remote(self.url)
        for key, value in SPARK_DEFAULTS.items():
            builder = builder.config(key, value)
        session = builder.create()
        self._sessions.append(session)
        return session

    def close(self):
        from airflow_eo.compat import release_server_session
        from airflow_eo.submit.connect import detach

        for session in self._sessions:
            release_server_session(session)
            detach(session)


def open_spark_path(request, spark) -> SparkPath:
    url = request.getfixturevalue("connect_server").url if request.param == "connect" else None
    return SparkPath(request.param, spark, url)


@pytest.fixture(params=["local", "connect"])
def spark_path(request, spark):
    """The exactly-once core on both paths: in-process local Spark and Spark Connect."""
    path = open_spark_path(request, spark)
    yield path
    path.close()
