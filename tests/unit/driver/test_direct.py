"""Which transforms take the direct path (read tasks write the Parquet) and which need Spark."""

from __future__ import annotations

import pytest

from airflow_eo.driver.direct import DirectStage, projected_columns
from airflow_eo.driver.tables import needs_spark
from airflow_eo.driver.reader import KAFKA_SCHEMA
from airflow_eo.spec.parts import Transform


@pytest.mark.parametrize("sql, columns", [
    ("SELECT topic, partition, offset, value FROM source", ("topic", "partition", "offset", "value")),
    ("select `topic`,`partition`,`offset`,timestamp,key from `source`;", ("topic", "partition", "offset",
                                                                          "timestamp", "key")),
    ("\n  SELECT *\n  FROM source\n", tuple(KAFKA_SCHEMA.names)),
])
def test_bare_projections_of_the_kafka_columns_are_direct(sql, columns):
    assert projected_columns(Transform(sql=sql)) == columns


def test_no_transform_is_the_identity():
    assert projected_columns(Transform()) == tuple(KAFKA_SCHEMA.names)


@pytest.mark.parametrize("sql", [
    "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source",
    "SELECT topic, partition, offset, value AS v FROM source",
    "SELECT topic, partition, offset, value FROM source WHERE value IS NOT NULL",
    "SELECT topic, partition, offset, Value FROM source",  # not spelled as the source spells it
    "SELECT topic, partition, offset, value, value FROM source",
    "SELECT topic, partition, offset -- the key\n, value FROM source",
    "SELECT topic, partition, offset, value FROM other",
    "SELECT DISTINCT topic, partition, offset FROM source",
])
def test_anything_else_needs_spark(sql):
    assert projected_columns(Transform(sql=sql)) is None


def test_a_callable_needs_spark():
    assert projected_columns(Transform(callable="pkg.mod:fn")) is None


def _attempt(offsets_per_partition: int, interval=None, **options):
    from airflow_eo.attempt import Attempt
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange, RunIdentity
    from airflow_eo.spec import IngestSpec

    spec = IngestSpec.of(table_uri="/data/orders", ingest_id="orders", topics="orders", **options)
    ranges = tuple(OffsetRange("orders", p, 100, 100 + offsets_per_partition) for p in range(4))
    return Attempt(BatchPlan("orders", 1, ranges, RunIdentity("r1"), attempt_id="3f2a9c0d1e6b4a52",
                             interval=interval), spec)


@pytest.mark.parametrize("per_partition, limit, in_driver", [
    (250, None, True),  # 1,000 offsets: the default reads them in the driver
    (25_000, None, True),  # 100,000: the default's limit, what Spark reads in one task anyway
    (25_001, None, False),
    (250, 1000, True),
    (251, 1000, False),
    (250, 0, False),  # 0 turns the rule off
    (0, 0, False),
])
def test_a_direct_batch_within_driver_read_max_offsets_is_read_by_the_driver(per_partition, limit, in_driver):
    options = {} if limit is None else {"driver_read_max_offsets": limit}
    attempt = _attempt(per_partition, transform_sql="SELECT topic, partition, offset, value FROM source", **options)
    direct = DirectStage.of(attempt)
    assert direct is not None and direct.columns == ("topic", "partition", "offset", "value")
    assert direct.in_driver is in_driver and needs_spark([attempt]) is not in_driver


@pytest.mark.parametrize("options", [
    {"transform_sql": "SELECT topic, partition, offset, upper(value) AS v FROM source"},
    {"dedup_key": "key"},
])
def test_a_small_batch_whose_rows_need_spark_still_runs_spark(options):
    attempt = _attempt(10, **options)
    assert DirectStage.of(attempt) is None and needs_spark([attempt])


def _destination(table_uri: str, columns=tuple(KAFKA_SCHEMA.names), partition_by=(), ranges=None):
    from airflow_eo.core.offsets import OffsetRange
    from airflow_eo.driver.direct import Destination

    ranges = ranges or tuple(OffsetRange("orders", p, 100, 110) for p in range(4))
    return Destination(table_uri, f"{table_uri}/b00000001-x", tuple(columns), tuple(partition_by), ranges)


def test_the_tables_through_spark_read_a_raw_tables_staged_files_or_a_staged_copy(tmp_path):
    """A shared read feeds the tables whose rows need Spark from staged Parquet: a destination that holds
    every Kafka column of the whole read unpartitioned, else a copy beside the first such table's attempt;
    a lone Spark table, and decoded records, read as before."""
    from airflow_eo.driver.direct import feed_for
    from airflow_eo.table.files import FEED_SUFFIX
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation

    merge = _attempt(10, write_mode="merge", merge_key="key")
    staging = StagingArea(TableLocation.of(str(tmp_path / "merge")))
    ranges = merge.plan.data_ranges
    raw = _destination("/lake/raw")
    assert feed_for([merge], ranges, [raw], staging, undecoded=True) == raw
    assert feed_for([merge], ranges, [], staging, undecoded=True) is None  # one table: its own job reads Kafka
    assert feed_for([], ranges, [raw], staging, undecoded=True) is None
    assert feed_for([merge, merge], ranges, [], staging, undecoded=False) is None  # decoded: the read is cached
    for unfit in (_destination("/lake/some", columns=("topic", "partition", "offset", "value")),
                  _destination("/lake/by_topic", partition_by=("topic",)),
                  _destination("/lake/part", ranges=ranges[:2])):
        copy = feed_for([merge], ranges, [unfit], staging, undecoded=True)
        assert copy is not None and copy.target == staging.feed_path(merge.plan)
        assert copy.target.endswith(FEED_SUFFIX) and copy.columns == tuple(KAFKA_SCHEMA.names)
        assert copy.ranges == ranges and copy.partition_by == ()
    assert feed_for([merge, merge], ranges, [], staging, undecoded=True).target == staging.feed_path(merge.plan)


def test_a_batch_goes_to_the_tables_that_read_its_partition_each_with_its_share():
    import pyarrow as pa

    from airflow_eo.driver.direct import Shares

    def batch(rows):  # (topic, partition, offset)
        return pa.RecordBatch.from_pydict({"topic": [r[0] for r in rows], "partition": [r[1] for r in rows],
                                           "offset": [r[2] for r in rows]})

    def offered(shares, rows):
        return {i: [tuple(r.values()) for r in share.to_pylist()] for i, share in shares.of(batch(rows))}

    read = {("a", 0): (0, 10), ("b", 0): (0, 10)}
    shares = Shares([{("a", 0): (0, 10)},  # a table routed from topic a
                     {("b", 0): (0, 10)},  # one from topic b
                     {("a", 0): (4, 6)},  # a table whose plan starts later and ends earlier in a
                     read],  # a table of the whole read
                    [False, False, False, True])
    a = [("a", 0, o) for o in range(3, 8)]
    assert offered(shares, a) == {0: a, 2: [("a", 0, 4), ("a", 0, 5)], 3: a}
    assert offered(shares, [("b", 0, 9)]) == {1: [("b", 0, 9)], 3: [("b", 0, 9)]}
    assert offered(shares, [("c", 0, 1)]) == {}  # a partition no table reads
    mixed = [("a", 0, 5), ("b", 0, 5)]  # not a reader's batch: every table is asked
    assert offered(shares, mixed) == {0: [("a", 0, 5)], 1: [("b", 0, 5)], 2: [("a", 0, 5)], 3: mixed}
    assert offered(shares, []) == {}
