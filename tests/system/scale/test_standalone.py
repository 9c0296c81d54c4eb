"""Ingestion on a real Spark standalone cluster (master + worker on 127.0.0.1).

The driver runs in spark-submit's process (client deploy mode); the Kafka data source
runs in the executor's Python workers, which reach the package through the same
virtualenv (``PYSPARK_PYTHON``). The executor's interpreter here is a wrapper that
records who started it, so the test can see that the data source really ran there.
"""

from __future__ import annotations

import stat
import sys

import pytest

from airflow_eo.core.errors import SparkJobError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.table.ledger import Ledger
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce, read_table

CONF = {"spark.executor.memory": "512m", "spark.cores.max": "1"}


def python_wrapper(tmp_path) -> tuple[str, object]:
    """An interpreter for the executors that logs its parent process, then runs the venv's python."""
    calls = tmp_path / "executor-python.log"
    wrapper = tmp_path / "executor-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$(tr "\\0" " " < /proc/$PPID/cmdline) :: $*" >> {calls}\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), calls


def test_ingestion_on_standalone_cluster_client_mode(spark_cluster, kafka_config, tmp_path):
    topic = new_topic(kafka_config, partitions=3)
    produce(kafka_config, topic, 300)
    table = str(tmp_path / "table")
    wrapper, calls = python_wrapper(tmp_path)
    # the executors read: a batch this small would be read by the driver itself otherwise
    config = IngestConfig(table_uri=table, ingest_id="standalone", topics=[topic], kafka_config=kafka_config,
                          driver_read_max_offsets=0)
    submitter = LocalSparkSubmit(master=spark_cluster.master_url, conf=CONF,
                                 extra_env={"PYSPARK_PYTHON": wrapper}, timeout=150)

    result = Ingestion(config, submitter).run(RunIdentity("cluster-1"))

    assert result.status == "committed" and result.rows == 300
    rows = read_table(table)
    assert not duplicates(rows)
    assert set(keys_of(rows)) == set(broker_records(kafka_config["bootstrap.servers"], topic))
    # The driver JVM starts Python only to create and plan the data source; the rows were
    # read by Python workers that the standalone executor JVM started.
    started = [line.split(" :: ") for line in calls.read_text().splitlines()]
    readers = [parent for parent, args in started if args.strip().endswith("pyspark.worker")]
    assert readers and all("CoarseGrainedExecutorBackend" in parent for parent in readers), started
    in_driver = [args for parent, args in started if "CoarseGrainedExecutorBackend" not in parent]
    assert all("pyspark.sql.worker." in args for args in in_driver), in_driver
    # one commit, by the driver: exactly one table version holds this attempt's batch
    ledger = Ledger.open(table)
    assert ledger.version == 0
    assert [(b.meta.batch, b.meta.attempt_id) for b in ledger.batches("standalone")] == [(1, result.attempt_id)]
    assert "committed batch" not in spark_cluster.executor_logs()


def test_cluster_deploy_mode_is_refused_with_sparks_reason(spark_cluster, kafka_config, tmp_path):
    """Spark standalone cannot run a Python driver inside the cluster; the run says so and
    changes nothing."""
    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 10, partitions=1)
    table = str(tmp_path / "table")
    config = IngestConfig(table_uri=table, ingest_id="standalone_cluster", topics=[topic], kafka_config=kafka_config)
    submitter = LocalSparkSubmit(master=spark_cluster.master_url,
                                 conf={**CONF, "spark.submit.deployMode": "cluster"}, timeout=60)

    with pytest.raises(SparkJobError) as err:
        Ingestion(config, submitter).run(RunIdentity("cluster-deploy"))

    assert "Cluster deploy mode is currently not supported for python applications on standalone clusters" \
        in str(err.value.__cause__ or err.value)
    assert Ledger.open(table).table is None
