"""Reprocess of a past run (airflow_eo.loop.reprocess) against the real broker, Spark and Delta.

Runs on both in-process paths (local Spark and the warm Spark Connect server, fixture
``spark_path``): the job code is the same as under spark-submit; the Airflow-driven
reprocess is in tests/integration/airflow/test_dag_runs.py.
"""

from __future__ import annotations

import functools
import time

import pytest
from deltalake import DeltaTable

from airflow_eo.core.errors import ConfigError, DataLossError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.spec import Transform
from tests.helpers import committed_offsets, duplicates, keys_of, new_topic, produce, read_table

UPPER = "SELECT topic, partition, offset, upper(CAST(value AS STRING)) AS body FROM source"
PLAIN = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"


class CountingSubmitter:
    """The path's own submitter (local Spark or the warm server), counting its Spark jobs."""

    def __init__(self, spark_path):
        self.inner = spark_path.submitter()
        self.calls = 0

    def submit(self, attempt, secrets):
        self.calls += 1
        self.inner.submit(attempt, secrets)


@pytest.fixture
def ingestion(ingestion):
    return functools.partial(ingestion, ingest_id="orders", transform=Transform(sql=PLAIN))


def bodies(table_uri):
    t = read_table(table_uri)
    return dict(zip(keys_of(t), t["body"].to_pylist()))


def assert_only_run_replaced(table_uri, run, rows: int, replaced: int) -> None:
    """The table holds ``rows`` rows once each; exactly ``run``'s ``replaced`` rows are upper-cased."""
    table = read_table(table_uri)
    assert duplicates(table) == {} and table.num_rows == rows
    after = bodies(table_uri)
    in_run = {k for k in after if any(r["partition"] == k[1] and r["start"] <= k[2] < r["end"]
                                      for r in run.to_dict()["ranges"])}
    assert len(in_run) == replaced
    assert all(after[k].startswith("V") for k in in_run)  # the run's rows, replaced
    assert all(after[k].startswith("v") for k in set(after) - in_run)  # the others, untouched


def test_reprocess_replaces_exactly_one_runs_rows_in_one_commit(spark_path, kafka_config, table_uri, ingestion):
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 30)
    first = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path)).run(RunIdentity("dag/run1/t/-1"))
    produce(kafka_config, topic, 12, start=30)
    second = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path)).run(RunIdentity("dag/run2/t/-1"))
    offsets_before = committed_offsets(table_uri, "orders", topic, 3)
    version_before = DeltaTable(table_uri).version()

    ing = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path), transform=Transform(sql=UPPER))
    result = Reprocessor(ing).run(RunIdentity("dag/run1/t/-1"))

    assert result.status == RunStatus.REPROCESSED and result.batch == first.batch and result.spark_started
    assert result.version == version_before + 1 and result.rows == 30
    assert_only_run_replaced(table_uri, first, rows=42, replaced=30)
    assert committed_offsets(table_uri, "orders", topic, 3) == offsets_before
    history = DeltaTable(table_uri).history(1)[0]  # the one reprocess commit
    assert '"operation": "reprocess"' in history["airflow_eo.batch"]
    assert ing.ledger().reprocess_count("orders", first.batch) == 1
    assert second.batch == first.batch + 1

    # a retry of the same reprocess request: reports it, starts nothing, replaces nothing
    retry_ing = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path), transform=Transform(sql=UPPER))
    # pretend the first try died before recording "done"
    log = Reprocessor(retry_ing).requests
    pending = log.load("dag/run1/t/-1")
    log.record(type(pending)(**{**pending.__dict__, "done": False}))
    again = Reprocessor(retry_ing).run(RunIdentity("dag/run1/t/-1"))
    assert again.status == RunStatus.ALREADY_REPROCESSED and not again.spark_started
    assert retry_ing.submitter.calls == 0
    assert DeltaTable(table_uri).version() == version_before + 1

    # a plain clear of run 1 afterwards: a no-op that reports the batch
    clear = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path)).run(RunIdentity("dag/run1/t/-1"))
    assert clear.status == "already_committed" and not clear.spark_started


def test_reprocess_refuses_unknown_run_and_lost_ranges(spark_path, kafka_config, table_uri, ingestion):
    from confluent_kafka.admin import AdminClient

    topic = new_topic(kafka_config, partitions=1)
    produce(kafka_config, topic, 10, partitions=1)
    ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path)).run(RunIdentity("dag/r1/t/-1"))
    with pytest.raises(ConfigError, match="nothing to reprocess"):
        ing = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path))
        Reprocessor(ing).run(RunIdentity("dag/never/t/-1"))

    # recreate the topic with fewer records: Kafka no longer holds run 1's range
    admin = AdminClient(kafka_config)
    for f in admin.delete_topics([topic]).values():
        f.result()
    time.sleep(1)
    new_topic(kafka_config, partitions=1, name=topic)
    produce(kafka_config, topic, 3, partitions=1)
    version = DeltaTable(table_uri).version()
    ing = ingestion(table_uri, topic, kafka_config, CountingSubmitter(spark_path))
    with pytest.raises(DataLossError, match="no longer holds"):
        Reprocessor(ing).run(RunIdentity("dag/r1/t/-1"))
    assert ing.submitter.calls == 0 and DeltaTable(table_uri).version() == version
    assert read_table(table_uri).num_rows == 10


def test_reprocess_after_compaction_replaces_exactly_its_rows(spark, kafka_config, table_uri, ingestion):
    """Compaction mixes batches in one file: the reprocess finds its rows by offset range and
    rewrites the shared file without them, in the same one commit."""
    from airflow_eo.table.maintenance import MaintenancePlan, maintain
    from tests.conftest import SparkPath

    path = SparkPath("local", spark)
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 30)
    first = ingestion(table_uri, topic, kafka_config, CountingSubmitter(path)).run(RunIdentity("dag/run1/t/-1"))
    produce(kafka_config, topic, 12, start=30)
    second = ingestion(table_uri, topic, kafka_config, CountingSubmitter(path)).run(RunIdentity("dag/run2/t/-1"))
    maintain(table_uri, plan=MaintenancePlan(vacuum=False, checkpoint=False, cleanup_log=False))
    assert len(DeltaTable(table_uri).file_uris()) == 1  # both batches in one file now
    offsets_before = committed_offsets(table_uri, "orders", topic, 3)

    upper = ingestion(table_uri, topic, kafka_config, CountingSubmitter(path), transform=Transform(sql=UPPER))
    result = Reprocessor(upper).run(RunIdentity("dag/run1/t/-1"))

    assert result.status == RunStatus.REPROCESSED and result.batch == first.batch and result.rows == 30
    assert_only_run_replaced(table_uri, first, rows=42, replaced=30)  # the rest copied out of the shared file
    assert committed_offsets(table_uri, "orders", topic, 3) == offsets_before
    meta = DeltaTable(table_uri).history(1)[0]["airflow_eo.batch"]
    assert '"rewritten_shared_files": 1' in meta, meta

    # the copy of run 2's rows is a shared file too: reprocessing run 2, then run 1 again,
    # finds each run's rows wherever they are and never drops or doubles the other's
    Reprocessor(ingestion(table_uri, topic, kafka_config, CountingSubmitter(path), transform=Transform(sql=UPPER))).run(
        RunIdentity("dag/run2/t/-1"))
    again = Reprocessor(ingestion(table_uri, topic, kafka_config, CountingSubmitter(path))).run(
        RunIdentity("dag/run9/t/-1"), target_run_key="dag/run1/t/-1")
    assert again.status == RunStatus.REPROCESSED
    assert_only_run_replaced(table_uri, second, rows=42, replaced=12)  # run 2 upper-cased, run 1 plain again
    assert committed_offsets(table_uri, "orders", topic, 3) == offsets_before
