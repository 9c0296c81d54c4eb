"""A table's files read into Spark on both Spark paths: in tasks through the table's filesystem
(partition values from the log, nulls for a column a file lacks, types as asked), and the same
rows as Spark's own Parquet reader gives a local table."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from airflow_eo.compat import spark_schema_of
from airflow_eo.driver.scan import TableFiles, column_reader, over_files, read_table_files
from airflow_eo.table.files import add_actions_of, snapshot_files

TS = dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=dt.timezone.utc)
DAY = dt.date(2026, 3, 4)


def write_table(uri: str, partition_by=None) -> TableFiles:
    """Two writes: the first without ``_dedup_key`` (before dedup was turned on), the second with it."""
    first = pa.table({"offset": pa.array([0, 1, 2], pa.int64()), "timestamp": pa.array([TS] * 3, pa.timestamp("us", tz="UTC")),
                      "day": pa.array([DAY] * 3, pa.date32()), "region": ["eu/west", "eu/west", "us"]})
    second = pa.table({"offset": pa.array([3, 4], pa.int64()), "timestamp": pa.array([TS, None], pa.timestamp("us", tz="UTC")),
                       "day": pa.array([DAY] * 2, pa.date32()), "region": ["eu/west", "us"], "_dedup_key": ["k3", None]})
    write_deltalake(uri, first, partition_by=partition_by)
    write_deltalake(uri, second, mode="append", schema_mode="merge", partition_by=partition_by)
    files = snapshot_files(add_actions_of(DeltaTable(uri)))
    return TableFiles(uri, tuple(files))


def rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=lambda r: r[df.columns.index("offset")])


def test_a_partitioned_table_is_read_in_tasks_with_its_partition_values_typed_as_asked(spark_path, tmp_path):
    session = spark_path.session()
    table = write_table(str(tmp_path / "t"), partition_by=["day", "region"])
    wanted = pa.schema([("offset", pa.int64()), ("_dedup_key", pa.string()), ("region", pa.string()),
                        ("day", pa.date32()), ("timestamp", pa.timestamp("us", tz="UTC"))])
    df = read_table_files(session, table, wanted)
    assert df.columns == wanted.names and "MapInArrow" in _plan(df)  # a partition column: read in tasks
    assert [f.dataType.typeName() for f in df.schema.fields] == ["long", "string", "string", "date", "timestamp"]
    got = rows(df)
    assert [r[:4] for r in got] == [(0, None, "eu/west", DAY), (1, None, "eu/west", DAY), (2, None, "us", DAY),
                                    (3, "k3", "eu/west", DAY), (4, None, "us", DAY)]
    assert [r[4].astimezone(dt.timezone.utc) if r[4] else None for r in got] == [TS, TS, TS, TS, None]


def test_spark_reader_and_the_tasks_give_a_local_table_the_same_rows(spark_path, tmp_path):
    """Partitioned, with a directory name Delta's log escapes once more (region=eu%2Fwest is logged
    as eu%252Fwest): asked for no partition column, Spark's reader reads the decoded paths."""
    session = spark_path.session()
    table = write_table(str(tmp_path / "t"), partition_by=["region"])
    assert any("region=eu%2Fwest/" in f.path for f in table.files)
    wanted = pa.schema([("_dedup_key", pa.string()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])
    native = read_table_files(session, table, wanted)  # local, no partition column: Spark's reader
    assert "MapInArrow" not in _plan(native)
    in_tasks = over_files(session, table.files, column_reader(table.uri, None, table.files, wanted),
                          spark_schema_of(wanted))
    assert rows(native) == rows(in_tasks) and len(rows(native)) == 5
    assert [r[0] for r in rows(in_tasks)] == [None, None, None, "k3", None]
    assert read_table_files(session, TableFiles(table.uri), wanted) is None  # no files: no stored rows


def _plan(df) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain()
    return out.getvalue()
