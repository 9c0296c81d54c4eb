"""Each key's winner in Spark (:func:`airflow_eo.driver.merge.winners`) against the order rule's Arrow
reference (:func:`airflow_eo.driver.changes.select_winners`), on both Spark paths: keys in one and in
several partitions and topics, ties on the timestamp, a null timestamp, a key of two columns, and a
null key (one row of that key, counting its records, for the caller to refuse)."""

from __future__ import annotations

import random

import pyarrow as pa

from airflow_eo.driver.changes import CHANGES_COLUMN, TS_COLUMN, select_winners
from airflow_eo.driver.decode import functions_for
from airflow_eo.driver.merge import CHANGE_COLUMN, DELETE_COLUMN, winners

KEY = ("id", "tenant")


def records(seed: int) -> pa.Table:
    """Records of 60 keys over 2 topics x 3 partitions, offsets rising per partition, timestamps from a
    small range (ties), some null."""
    rng = random.Random(seed)
    offsets: dict[tuple[str, int], int] = {}
    rows = []
    for _ in range(2000):
        topic, partition = rng.choice(("a", "b")), rng.randrange(3)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + rng.randint(1, 3)
        ts = None if rng.random() < 0.02 else rng.randrange(40)
        rows.append({"id": rng.randrange(30), "tenant": rng.choice(("x", "y")), "body": f"v{len(rows)}", "topic": topic,
                     "partition": partition, "offset": offset, "delete": rng.random() < 0.1, "ts": ts})
    rows.append({"id": None, "tenant": "x", "body": "nokey", "topic": "a", "partition": 0, "offset": 10**6,
                 "delete": False, "ts": 1})
    rows.append({"id": None, "tenant": "x", "body": "nokey2", "topic": "b", "partition": 1, "offset": 10**6,
                 "delete": False, "ts": 2})
    return pa.Table.from_pylist(rows, pa.schema([("id", pa.int64()), ("tenant", pa.string()), ("body", pa.string()),
                                                 ("topic", pa.string()), ("partition", pa.int32()),
                                                 ("offset", pa.int64()), ("delete", pa.bool_()), ("ts", pa.int64())]))


def test_spark_winners_follow_the_order_rule(spark_path):
    table = records(7)
    session = spark_path.session()
    records_df = session.createDataFrame(table.to_pandas())
    with functions_for(records_df) as F:  # a Connect test earlier in this worker must not make these Connect's columns
        df = records_df.select(
            F.col("id").cast("long").alias("id"), "tenant", "body", "topic",
            F.col("partition").cast("int").alias("partition"), "offset",
            F.struct(F.col("delete").alias(DELETE_COLUMN), F.col("ts").cast("long").alias(TS_COLUMN)).alias(CHANGE_COLUMN))
    chosen = winners(df, KEY, 3)
    assert chosen.columns == ["id", "tenant", "body", "topic", "partition", "offset", DELETE_COLUMN, TS_COLUMN,
                              CHANGES_COLUMN]
    got = {(r["id"], r["tenant"]): (r["body"], r[CHANGES_COLUMN]) for r in chosen.collect()}
    reference = select_winners(table.rename_columns([*table.column_names[:6], DELETE_COLUMN, TS_COLUMN]), KEY)
    keyed = {(r["id"], r["tenant"]): (r["body"], r[CHANGES_COLUMN]) for r in reference.to_pylist()
             if r["id"] is not None}
    assert {k: v for k, v in got.items() if k[0] is not None} == keyed
    assert sum(n for _, n in keyed.values()) == 2000  # every keyed record is counted once
    assert got[(None, "x")][1] == 2  # the null key's records, as one row counting both
    if spark_path.url is None:  # hashed by key into the tasks asked for (a Connect frame has no RDD to ask)
        assert chosen.rdd.getNumPartitions() == 3
