"""Dropping duplicates by a producer-supplied key: the first occurrence in a batch wins, keys
already in the table's files are dropped, null keys are kept, and a bad expression is a
one-line ConfigError (local Spark, and Spark Connect where it matters)."""

from __future__ import annotations

import base64
import json
import os
import random
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_eo.spec.columns import REASON_COLUMN
from airflow_eo.driver.dedup import (
    DEDUP_COLUMN, check_dedup_expression, drop_duplicates,
)
from airflow_eo.driver.reader import KAFKA_SCHEMA, spark_kafka_struct
from airflow_eo.driver.scan import TableFiles
from airflow_eo.core.errors import ConfigError
from airflow_eo.table.files import TableFile

TS = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)


def rec(topic="t", partition=0, offset=0, key=None, value=b"v", headers=None, ts=TS):
    return (topic, partition, offset, ts, 0, key, value, headers)


def frame(spark, rows):
    return spark.createDataFrame(rows, spark_kafka_struct())


def keys_file(path, keys, **columns) -> str:
    pq.write_table(pa.table({DEDUP_COLUMN: pa.array(keys, pa.string()), **columns}), path)
    return str(path)


def stored(paths) -> TableFiles:
    """Local Parquet files in one directory as a table's stored files (read by Spark's reader)."""
    root = os.path.dirname(paths[0])
    return TableFiles(root, tuple(TableFile(os.path.basename(p), os.path.getsize(p)) for p in paths))


def split(out) -> tuple[list, list]:
    """(kept, duplicates) as sorted (topic, partition, offset, key) rows; duplicates also
    checked for their reason."""
    kept = out.kept.select("topic", "partition", "offset", DEDUP_COLUMN).collect()
    dups = out.duplicates.select("topic", "partition", "offset", DEDUP_COLUMN, REASON_COLUMN).collect()
    assert {r[REASON_COLUMN] for r in dups} <= {"duplicate key"}
    return sorted(tuple(r)[:4] for r in kept), sorted(tuple(r)[:4] for r in dups)


@pytest.fixture
def session(spark_path):
    return spark_path.session()


def test_the_first_occurrence_in_a_batch_wins_by_offset_then_partition_then_topic(session):
    rows = [
        rec("t", 1, 0, b"a"), rec("t", 0, 1, b"a"),  # lower offset wins across partitions
        rec("t", 1, 5, b"b"), rec("t", 0, 5, b"b"),  # same offset: lower partition wins
        rec("u", 0, 7, b"c"), rec("t", 0, 7, b"c"),  # same offset and partition: lower topic wins
        rec("t", 0, 2, b"d"), rec("t", 0, 3, b"d"), rec("t", 0, 4, b"d"),
        rec("t", 0, 9, b"e"),
    ]
    kept, dups = split(drop_duplicates(frame(session, rows), "CAST(key AS STRING)", None))
    assert kept == [("t", 0, 2, "d"), ("t", 0, 5, "b"), ("t", 0, 7, "c"), ("t", 0, 9, "e"), ("t", 1, 0, "a")]
    assert dups == [("t", 0, 1, "a"), ("t", 0, 3, "d"), ("t", 0, 4, "d"), ("t", 1, 5, "b"), ("u", 0, 7, "c")]


def test_keys_already_in_the_table_are_dropped_and_files_without_the_column_hold_none(session, tmp_path):
    files = [
        keys_file(tmp_path / "a.parquet", ["a", None, "zz"]),
        str(tmp_path / "old.parquet"),  # written before dedup was turned on
    ]
    pq.write_table(pa.table({"offset": [1, 2], "body": ["b", "c"]}), files[1])
    rows = [rec(offset=0, key=b"a"), rec(offset=1, key=b"b"), rec(offset=2, key=b"a"), rec(offset=3, key=b"c"),
            rec(offset=4, key=None)]
    out = drop_duplicates(frame(session, rows), "CAST(key AS STRING)", stored(files))
    kept, dups = split(out)
    assert kept == [("t", 0, 1, "b"), ("t", 0, 3, "c"), ("t", 0, 4, None)]
    assert dups == [("t", 0, 0, "a"), ("t", 0, 2, "a")]  # one in the table, one a later copy
    assert out.kept.columns == [*KAFKA_SCHEMA.names, DEDUP_COLUMN]
    assert out.duplicates.columns == [*KAFKA_SCHEMA.names, DEDUP_COLUMN, REASON_COLUMN]


def test_only_files_without_the_column_mean_no_keys(spark, tmp_path):
    old = tmp_path / "old.parquet"
    pq.write_table(pa.table({"_dedup_keyx": ["a"], "offset": [1]}), old)
    rows = [rec(offset=0, key=b"a"), rec(offset=1, key=b"a")]
    kept, dups = split(drop_duplicates(frame(spark, rows), "CAST(key AS STRING)", stored([str(old)])))
    assert kept == [("t", 0, 0, "a")] and dups == [("t", 0, 1, "a")]


def test_null_keys_are_never_duplicates(spark, tmp_path):
    files = [keys_file(tmp_path / "k.parquet", [None, None])]
    rows = [rec(offset=i, key=None) for i in range(4)] + [rec(offset=9, key=b"x")]
    kept, dups = split(drop_duplicates(frame(spark, rows), "CAST(key AS STRING)", stored(files)))
    assert [r[2] for r in kept] == [0, 1, 2, 3, 9] and dups == []


def test_a_binary_key_is_stored_base64_so_invalid_utf8_keys_do_not_collide(spark, tmp_path):
    files = [keys_file(tmp_path / "k.parquet", [base64.b64encode(b"\xfe").decode()])]
    rows = [rec(offset=0, key=b"\xff"), rec(offset=1, key=b"\xfe"), rec(offset=2, key=b"\xfd"),
            rec(offset=3, key=b"\xff")]
    kept, dups = split(drop_duplicates(frame(spark, rows), "key", stored(files)))
    assert kept == [("t", 0, 0, "/w=="), ("t", 0, 2, "/Q==")]
    assert dups == [("t", 0, 1, "/g=="), ("t", 0, 3, "/w==")]


def test_a_header_is_read_by_name_the_last_of_that_name(session, tmp_path):
    def h(*pairs):
        return [{"key": k, "value": v} for k, v in pairs]

    rows = [
        rec(offset=0, headers=h(("event-id", b"e1"), ("trace", b"x"))),
        rec(offset=1, headers=h(("trace", b"y"), ("event-id", b"e1"))),  # a resend of e1
        rec(offset=2, headers=h(("event-id", b"e0"), ("event-id", b"e2"))),  # the last one counts
        rec(offset=3, headers=h(("trace", b"z"))),  # no such header: null, kept
        rec(offset=4, headers=None),
        rec(offset=5, headers=h(("event-id", b"e9"))),  # in the table
    ]
    files = [keys_file(tmp_path / "k.parquet", ["e9"])]
    kept, dups = split(drop_duplicates(frame(session, rows), "CAST(headers['event-id'] AS STRING)", stored(files)))
    assert kept == [("t", 0, 0, "e1"), ("t", 0, 2, "e2"), ("t", 0, 3, None), ("t", 0, 4, None)]
    assert dups == [("t", 0, 1, "e1"), ("t", 0, 5, "e9")]


def test_a_json_path_key(spark):
    values = [{"id": 1}, {"id": 2}, {"id": 1, "v": 2}, {"other": 1}, {"id": 2}]
    rows = [rec(offset=i, value=json.dumps(v).encode()) for i, v in enumerate(values)] + [rec(offset=9, value=b"{bad")]
    kept, dups = split(drop_duplicates(frame(spark, rows), "get_json_object(CAST(value AS STRING), '$.id')", None))
    assert kept == [("t", 0, 0, "1"), ("t", 0, 1, "2"), ("t", 0, 3, None), ("t", 0, 9, None)]
    assert dups == [("t", 0, 2, "1"), ("t", 0, 4, "2")]


def test_a_key_from_the_decoded_data_column(spark):
    df = frame(spark, [rec(offset=i, value=json.dumps({"id": i % 2}).encode()) for i in range(4)])
    decoded = df.selectExpr("*", "from_json(CAST(value AS STRING), 'id INT') AS data")
    with pytest.raises(ConfigError):
        check_dedup_expression(spark, "data.id")  # the plain Kafka source has no data
    check_dedup_expression(spark, "data.id", decoded.schema)
    kept, dups = split(drop_duplicates(decoded, "data.id", None))
    assert [r[2] for r in kept] == [0, 1] and [r[2] for r in dups] == [2, 3]


def test_kept_and_duplicates_partition_the_batch_as_a_plain_reference_does(session, tmp_path):
    rnd = random.Random(7)
    rows = [rec(rnd.choice("tu"), rnd.randrange(3), offset, rnd.choice([None, *(b"k%d" % i for i in range(25))]))
            for offset in range(300)]
    in_table = {f"k{i}" for i in range(0, 25, 4)}
    files = [keys_file(tmp_path / "k1.parquet", sorted(in_table)[:3]),
             keys_file(tmp_path / "k2.parquet", sorted(in_table)[3:] + ["other"])]
    out = drop_duplicates(frame(session, rows), "CAST(key AS STRING)", stored(files))
    kept, dups = split(out)
    seen, want_kept, want_dups = set(in_table), [], []
    for topic, partition, offset, _, _, key, _, _ in sorted(rows, key=lambda r: (r[2], r[1], r[0])):
        k = key.decode() if key is not None else None
        (want_dups if k is not None and k in seen else want_kept).append((topic, partition, offset, k))
        if k is not None:
            seen.add(k)
    assert kept == sorted(want_kept) and dups == sorted(want_dups)
    assert len(kept) + len(dups) == len(rows) and want_dups
    assert {r[:3] for r in kept} | {r[:3] for r in dups} == {r[:3] for r in rows}


def test_the_horizon_ignores_table_rows_older_than_it(spark, tmp_path):
    old, new = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 3, 1, tzinfo=timezone.utc)
    files = [keys_file(tmp_path / "k.parquet", ["a", "b", "c"],
                       timestamp=pa.array([old, new, None], pa.timestamp("us", tz="UTC"))),
             keys_file(tmp_path / "no-ts.parquet", ["d"])]
    rows = [rec(offset=i, key=k) for i, k in enumerate([b"a", b"b", b"c", b"d"])]
    horizon = int(datetime(2026, 2, 1, tzinfo=timezone.utc).timestamp() * 1000)
    kept, dups = split(drop_duplicates(frame(spark, rows), "CAST(key AS STRING)", stored(files), horizon_ms=horizon))
    assert [r[3] for r in kept] == ["a"]  # only "a" is older than the horizon
    assert [r[3] for r in dups] == ["b", "c", "d"]  # no timestamp: still counted
    kept, dups = split(drop_duplicates(frame(spark, rows), "CAST(key AS STRING)", stored(files)))
    assert kept == [] and len(dups) == 4


@pytest.mark.parametrize("expr, says", [
    ("foo(", "does not parse"),
    ("nope", "cannot be evaluated"),
    ("count(*)", "MISSING_GROUP_BY"),
    ("explode(headers)", "generator"),
    ("*", "not one"),
    ("  ", "is empty"),
    ("a\nb(", "does not parse"),
])
def test_a_bad_expression_is_a_one_line_config_error(spark, expr, says):
    with pytest.raises(ConfigError) as err:
        check_dedup_expression(spark, expr)
    message = str(err.value)
    assert "\n" not in message and says in message and repr(expr) in message
    assert ";;" not in message and "nothing was committed" in message
    with pytest.raises(ConfigError):
        drop_duplicates(frame(spark, [rec()]), expr, None)


def test_a_bad_expression_fails_before_any_action_on_spark_connect(spark_path):
    session = spark_path.session()
    with pytest.raises(ConfigError, match="cannot be evaluated") as err:
        check_dedup_expression(session, "CAST(nope AS STRING)")
    assert "\n" not in str(err.value)
    check_dedup_expression(session, "headers['event-id']")  # the rewrite analyses on both paths


def test_a_key_stored_twice_drops_its_record_once(session, tmp_path):
    # a duration horizon lets a resend past it be stored again: the table may hold a key twice
    files = [keys_file(tmp_path / "k1.parquet", ["a", "b"]), keys_file(tmp_path / "k2.parquet", ["a"])]
    rows = [rec(offset=0, key=b"a"), rec(offset=1, key=b"c"), rec(offset=2, key=b"a")]
    out = drop_duplicates(frame(session, rows), "CAST(key AS STRING)", stored(files), partitions=2)
    kept, dups = split(out)
    assert kept == [("t", 0, 1, "c")]
    assert dups == [("t", 0, 0, "a"), ("t", 0, 2, "a")]
    assert out.dropped() == 2


def test_dropped_comes_from_the_write_and_is_recounted_exactly_without_one(session, tmp_path):
    """The count of duplicates: before any action there are no observed metrics, so it is a
    recount (one more pass); after the kept rows are written, it is what that write observed."""
    from airflow_eo.driver.dedup import observed_metrics

    rows = [rec(topic, p, o, None if o % 7 == 0 else b"k%d" % (o % 40))
            for topic in ("t", "u") for p in range(3) for o in range(50)]
    files = [keys_file(tmp_path / "k.parquet", ["k1", "k2", "zz"])]
    expected = len(rows) - len(set(r[5] for r in rows if r[5] is not None) - {b"k1", b"k2"}) - \
        sum(1 for r in rows if r[5] is None)
    out = drop_duplicates(frame(session, rows), "CAST(key AS STRING)", stored(files), partitions=3)
    assert out.dropped() == expected  # nothing ran yet: counted exactly
    assert all(observed_metrics(o) == {} for o in out.observed)
    out.kept.write.parquet(str(tmp_path / "kept"))
    ranked, kept = (observed_metrics(o).get("records") for o in out.observed)
    assert ranked == len(rows) and kept == len(rows) - expected  # the write's own metrics
    assert out.dropped() == expected
    assert out.dropped(read_at_most=len(rows) - 1) == expected  # impossible metrics: recounted
    assert pq.read_table(str(tmp_path / "kept")).num_rows == kept


def test_keyless_records_are_spread_over_the_tasks_and_all_kept(session):
    rows = [rec("t", p, o, None) for p in range(4) for o in range(25)] + [rec("t", 0, 99, b"x"), rec("t", 1, 99, b"x")]
    out = drop_duplicates(frame(session, rows), "CAST(key AS STRING)", None, partitions=4)
    with_task = out.kept.selectExpr("spark_partition_id() AS task", "key").where("key IS NULL")
    tasks = {r["task"] for r in with_task.collect()}
    assert len(tasks) > 1  # not one task holding every keyless record
    kept, dups = split(out)
    assert len(kept) == 101 and dups == [("t", 1, 99, "x")]
