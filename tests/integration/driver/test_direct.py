"""The direct path's two places to run its read tasks on the real broker, Spark and Delta: Spark
tasks, or the driver itself for a batch within ``driver_read_max_offsets``. Same files, same
statistics, same commit; the driver's own read starts no Spark (no SparkContext in a spark-submit
job, no operation on a Connect server)."""

from __future__ import annotations

import glob
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from airflow_eo.table.ledger import Ledger
from tests.helpers import assert_exactly_once, new_topic, produce, read_table

SQL = "SELECT topic, partition, offset, timestamp, key, value FROM source"


class NoSpark:
    """A submitter whose Spark must not be used: runs the driver with no session at all."""

    def submit(self, attempt, secrets):
        from airflow_eo.driver.main import run_attempt

        run_attempt(None, attempt, secrets)


def files_of(table_uri: str) -> list[dict]:
    """Each file of the table as the log describes it, and its Parquet schema, without its name."""
    actions = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    out = []
    for action in actions:
        path = action.pop("path")
        assert os.path.basename(path).startswith("part-0000"), path  # named like a Spark task's file
        for key in ("size_bytes", "modification_time"):
            action.pop(key)
        action["schema"] = pq.read_schema(os.path.join(table_uri, path))
        out.append(action)
    return sorted(out, key=lambda a: str(sorted((k, str(v)) for k, v in a.items())))


def batch_metadata(table_uri: str) -> list[tuple]:
    return [(m.batch, m.ranges, m.rows, m.rows_per_partition, m.operation)
            for m in (b.meta for b in Ledger.open(table_uri).batches("test"))]


def test_the_driver_stages_what_spark_tasks_stage(broker, kafka_config, spark_path, tmp_path, ingestion):
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 900, partitions=3)
    tables = {}
    for name, limit in (("spark", 0), ("driver", 100_000)):
        uri = tables[name] = str(tmp_path / name)
        ing = ingestion(uri, [topic], kafka_config, spark_path.submitter() if limit == 0 else NoSpark(),
                        transform_sql=SQL, max_records_per_run=600, driver_read_max_offsets=limit)
        results = [ing.run(RunIdentity(uuid.uuid4().hex)) for _ in range(3)]
        assert [r.status for r in results] == ["committed", "committed", "nothing_new"]
        assert assert_exactly_once(uri, broker.bootstrap_servers, [topic]) == 900
    assert files_of(tables["driver"]) == files_of(tables["spark"])
    assert batch_metadata(tables["driver"]) == batch_metadata(tables["spark"])
    assert DeltaTable(tables["driver"]).schema() == DeltaTable(tables["spark"]).schema()
    driver, spark = (read_table(tables[n]).sort_by([("partition", "ascending"), ("offset", "ascending")])
                     for n in ("driver", "spark"))
    assert driver.equals(spark)


@pytest.mark.parametrize("limit, spark_context", [(100_000, False), (0, True)])
def test_a_cold_job_reading_in_the_driver_starts_no_spark_context(broker, kafka_config, table_uri, tmp_path,
                                                                   ingestion, limit, spark_context):
    """spark-submit: with the batch read by the driver, no SparkContext starts (its event log is
    the witness); with the rule off, the same job starts one."""
    events = tmp_path / "events"
    events.mkdir()
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 50, partitions=2)
    submit = LocalSparkSubmit("local[1]", conf={"spark.eventLog.enabled": "true",
                                                "spark.eventLog.dir": f"file://{events}"})
    ing = ingestion(table_uri, [topic], kafka_config, submit, transform_sql=SQL, driver_read_max_offsets=limit)
    result = ing.run(RunIdentity("cold"))
    assert (result.status, result.rows) == ("committed", 50)
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 50
    assert bool(glob.glob(str(events / "*"))) is spark_context
