"""Partitioned tables (``partition_by``): Hive-style directories, partition values in the add
actions, the layout kept by every later batch, compaction and reprocess, and the refusals."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_eo.spec import Transform
from airflow_eo.core.errors import ConfigError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.table.maintenance import MaintenancePlan, maintain
from airflow_eo.table.partitioning import partition_values_of
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation
from tests.conftest import SparkPath, build_ingestion
from tests.helpers import assert_exactly_once, new_topic, produce, read_table

SQL = "SELECT *, 'first' AS note, to_date(timestamp) AS date, partition % 2 AS shard FROM source"
AGAIN = SQL.replace("'first'", "'again'")  # what a reprocess writes instead
PARTITION_BY = ("date", "shard")


def partitioned(spark, kafka_config, table_uri, topic, sql=SQL, partition_by=PARTITION_BY, **kwargs) -> Ingestion:
    """An ingestion into a partitioned table; ``spark`` is a SparkSession (local path) or a SparkPath."""
    path = spark if isinstance(spark, SparkPath) else SparkPath("local", spark)
    return build_ingestion(table_uri, topic, kafka_config, path.submitter(), transform=Transform(sql=sql),
                           partition_by=partition_by, **kwargs)


def assert_partitioned_as_the_rows_say(table_uri):
    """Every add action's values are its directory's, and every row's date and shard are what
    the transform derives from its own timestamp and partition."""
    table = DeltaTable(table_uri)
    assert table.metadata().partition_columns == list(PARTITION_BY)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    for action in actions:
        assert {k: str(v) for k, v in partition_values_of(action["path"]).items()} == \
               {"date": str(action["partition.date"]), "shard": str(action["partition.shard"])}
        names = pq.read_schema(os.path.join(table_uri, action["path"])).names
        assert "date" not in names and "shard" not in names  # in the add action, not the file
    rows = read_table(table_uri, ["partition", "timestamp", "date", "shard"]).to_pylist()
    assert rows and all(r["date"] == r["timestamp"].date() and r["shard"] == r["partition"] % 2 for r in rows)
    return actions


def test_a_partitioned_table_keeps_its_layout_through_batches_compaction_and_reprocess(broker, kafka_config,
                                                                                       spark_path, table_uri):
    spark = spark_path  # local Spark and Spark Connect write the partitions
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 30, partitions=3)
    ing = partitioned(spark, kafka_config, table_uri, topic, max_records_per_run=15)
    first, second = ing.run(RunIdentity("run1")), ing.run(RunIdentity("run2"))
    assert (first.status, second.status) == ("committed", "committed")
    actions = assert_partitioned_as_the_rows_say(table_uri)
    assert {a["partition.shard"] for a in actions} == {0, 1}
    assert all(a["path"].split("/")[1].startswith("date=") for a in actions)  # <attempt>/date=…/shard=…/part-…
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 30

    maintain(table_uri, plan=MaintenancePlan(vacuum=False))  # bin-packs within each partition
    compacted = assert_partitioned_as_the_rows_say(table_uri)
    dates = {a["partition.date"] for a in compacted}
    assert len(compacted) == 2 * len(dates)  # one file per (date, shard)

    result = Reprocessor(partitioned(spark, kafka_config, table_uri, topic, sql=AGAIN)).run(RunIdentity("run1"))
    assert result.status == RunStatus.REPROCESSED and result.rows == first.rows
    assert_partitioned_as_the_rows_say(table_uri)  # the copies of shared files stayed in their partitions
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 30
    rows = read_table(table_uri, ["partition", "offset", "note"]).to_pylist()
    run1 = {(r["partition"], o) for r in first.ranges for o in range(r["start"], r["end"])}
    assert {(r["partition"], r["offset"]) for r in rows if r["note"] == "again"} == run1  # its rows, only


def test_partitioning_mismatches_are_refused_and_the_table_is_left_as_it_was(kafka_config, spark, table_uri):
    topic = new_topic(kafka_config, 1)
    produce(kafka_config, topic, 4, partitions=1)
    missing = partitioned(spark, kafka_config, table_uri, topic, sql="SELECT * FROM source")
    with pytest.raises(ConfigError, match="lacks the partition column\\(s\\) \\['date', 'shard'\\]"):
        missing.run(RunIdentity("no-date"))
    assert not os.path.exists(os.path.join(table_uri, "_delta_log"))  # nothing created

    assert partitioned(spark, kafka_config, table_uri, topic).run(RunIdentity("first")).status == "committed"
    version = DeltaTable(table_uri).version()
    produce(kafka_config, topic, 2, partitions=1, start=4)
    for other in ((), ("date",)):
        with pytest.raises(ConfigError, match="is partitioned by \\['date', 'shard'\\]"):
            partitioned(spark, kafka_config, table_uri, topic, partition_by=other).run(RunIdentity(f"other-{other}"))
    assert DeltaTable(table_uri).version() == version


def test_the_object_store_writer_lays_out_partitions_as_spark_does(spark, tmp_path):
    """The executors' pyarrow writer (object stores) writes the same directories and values as
    Spark's own partitioned writer (local tables); here both write a local directory."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from airflow_eo.driver.writer import stage_with_arrow

    df = spark.createDataFrame(
        [("t", p, o, dt.date(2026, 3, 4 + o % 2), f"r/{p % 2}") for p in range(2) for o in range(5)],
        "topic string, partition int, offset long, date date, region string")
    location = TableLocation.of(str(tmp_path))
    arrow = stage_with_arrow(df.repartition(2), location, str(tmp_path / "b00000001-aaaaaaaaaaaaaaaa"), None,
                             to_arrow_schema(df.schema), ("date", "region"))
    df.write.partitionBy("date", "region").parquet(f"file://{tmp_path}/b00000001-bbbbbbbbbbbbbbbb")
    spark_files = StagingArea(location).staged_files(str(tmp_path / "b00000001-bbbbbbbbbbbbbbbb"))

    def layout(files):
        return sorted((tuple(sorted(f.partition_values.items())), f.num_records) for f in files)

    def by_partition(files):
        counts = {}
        for values, rows in layout(files):
            counts[values] = counts.get(values, 0) + rows
        return counts

    assert by_partition(arrow) == by_partition(spark_files) == {
        (("date", "2026-03-04"), ("region", "r/0")): 3, (("date", "2026-03-04"), ("region", "r/1")): 3,
        (("date", "2026-03-05"), ("region", "r/0")): 2, (("date", "2026-03-05"), ("region", "r/1")): 2}
    assert {f.path.split("/", 1)[1].rsplit("/", 1)[0] for f in arrow} == \
        {f.path.split("/", 1)[1].rsplit("/", 1)[0] for f in spark_files}  # same directory names, escapes too
    for f in arrow:
        assert pq.read_schema(location.join(f.path)).names == ["topic", "partition", "offset"]


def test_partition_values_that_need_escaping_reprocess_without_leaving_old_rows(broker, kafka_config, spark,
                                                                               table_uri):
    """A value with '/' or ':' lives in an escaped directory (``region=eu%2F1``), which the Delta
    log escapes once more (``%252F``): a reprocess must remove the batch's files by their real
    path, else the old rows stay beside the new ones (a remove of the log's form removes nothing)."""
    sql = ("SELECT *, 'first' AS note, concat('eu/', CAST(partition % 2 AS STRING), ':', "
           "date_format(timestamp, 'HH:mm')) AS region FROM source")
    topic = new_topic(kafka_config, 3)
    produce(kafka_config, topic, 24, partitions=3)
    ing = partitioned(spark, kafka_config, table_uri, topic, sql=sql, partition_by=("region",), max_records_per_run=12)
    first = ing.run(RunIdentity("run1"))
    assert first.status == "committed" and ing.run(RunIdentity("run2")).status == "committed"
    paths = [a["path"] for a in pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()]
    assert all("%25" in p for p in paths)  # the log's form of the escaped directories
    again = partitioned(spark, kafka_config, table_uri, topic, sql=sql.replace("'first'", "'again'"),
                        partition_by=("region",))
    assert Reprocessor(again).run(RunIdentity("run2")).status == RunStatus.REPROCESSED  # its own files, removed whole
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 24
    maintain(table_uri, plan=MaintenancePlan(vacuum=False))  # files shared by both batches, per partition
    assert Reprocessor(again).run(RunIdentity("run1")).status == RunStatus.REPROCESSED  # shared files rewritten
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 24
    rows = read_table(table_uri, ["partition", "offset", "note", "region"]).to_pylist()
    assert all(r["note"] == "again" for r in rows)  # both batches' rows replaced, none left behind
    assert all(r["region"].startswith(f"eu/{r['partition'] % 2}:") for r in rows)
