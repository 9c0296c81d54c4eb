"""The reading tasks of a table's files, without Spark: the function each task runs, called on the
batches of file indices Spark would hand it, over a local Delta table written here."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_eo.driver.scan import TASK_BYTES, column_reader, tasks_for
from airflow_eo.table.files import TableFile, add_actions_of, snapshot_files

DAY = dt.date(2026, 3, 4)
TS = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)
WANTED = pa.schema([("_dedup_key", pa.string()), ("region", pa.string()), ("day", pa.date32()),
                    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])


@pytest.fixture
def table(tmp_path) -> str:
    """Partitioned by day and region ('eu/west' needs escaping in its directory); the first write
    has no ``_dedup_key`` (written before dedup was turned on), the second adds it."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({
        "offset": pa.array([0, 1, 2], pa.int32()), "timestamp": pa.array([TS] * 3, pa.timestamp("us", tz="UTC")),
        "day": pa.array([DAY] * 3, pa.date32()), "region": ["eu/west", "eu/west", "us"]}), partition_by=["day", "region"])
    write_deltalake(uri, pa.table({
        "offset": pa.array([3, 4], pa.int32()), "timestamp": pa.array([TS, None], pa.timestamp("us", tz="UTC")),
        "day": pa.array([DAY] * 2, pa.date32()), "region": ["eu/west", "us"], "_dedup_key": ["k3", None]}),
        mode="append", schema_mode="merge", partition_by=["day", "region"])
    return uri


def files_of(uri: str) -> list[TableFile]:
    return snapshot_files(add_actions_of(DeltaTable(uri)))


def ids(*indices: int) -> pa.RecordBatch:
    """A batch as ``spark.range`` hands it to a task: one int64 column of file indices."""
    return pa.record_batch({"id": pa.array(indices, pa.int64())})


def rows_of(batches) -> list[tuple]:
    table = pa.Table.from_batches(list(batches), WANTED)
    return sorted(zip(*(table[c].to_pylist() for c in WANTED.names)), key=lambda r: r[3])


def test_each_task_reads_its_files_columns_typed_as_asked_nulls_where_a_file_lacks_one(table):
    files = files_of(table)
    assert len(files) == 4 and {f.partition_values["region"] for f in files} == {"eu/west", "us"}
    assert any("region=eu%2Fwest/" in f.path for f in files)  # the log's path (%252F) decoded: the real one
    read = column_reader(table, None, files, WANTED)
    batches = list(read(iter([ids(0, 1), ids(2, 3)])))  # one task, two batches of indices
    assert batches and all(b.schema == WANTED for b in batches)
    assert rows_of(batches) == [
        (None, "eu/west", DAY, 0, TS), (None, "eu/west", DAY, 1, TS), (None, "us", DAY, 2, TS),  # no key column
        ("k3", "eu/west", DAY, 3, TS), (None, "us", DAY, 4, None),
    ]
    # two tasks sharing the files read each row once between them
    split = [b for i in range(len(files)) for b in column_reader(table, None, files, WANTED)(iter([ids(i)]))]
    assert rows_of(split) == rows_of(batches)


def test_a_file_without_any_stored_column_asked_for_still_gives_its_rows(table):
    """Only a column the file lacks and a partition column: nothing to read from the file itself."""
    files = files_of(table)
    wanted = pa.schema([("_dedup_key", pa.string()), ("region", pa.string())])
    got = pa.Table.from_batches(list(column_reader(table, None, files, wanted)(iter([ids(*range(len(files)))]))), wanted)
    assert got.num_rows == 5 and got.schema == wanted
    assert sorted(got.to_pylist(), key=str) == sorted(
        [{"_dedup_key": None, "region": "eu/west"}] * 2 + [{"_dedup_key": None, "region": "us"}] * 2
        + [{"_dedup_key": "k3", "region": "eu/west"}], key=str)


def test_a_column_of_another_type_fails_naming_the_file_and_the_column(table):
    files = files_of(table)
    wanted = pa.schema([("region", pa.string()), ("offset", pa.list_(pa.int64()))])
    with pytest.raises(ValueError, match=r"part-.*column 'offset' is int32, which does not read as list"):
        list(column_reader(table, None, files, wanted)(iter([ids(0)])))


def test_tasks_read_about_task_bytes_each_and_never_more_tasks_than_files():
    small = [TableFile(f"f{i}", 1000) for i in range(10)]
    big = [TableFile(f"f{i}", TASK_BYTES) for i in range(10)]
    assert tasks_for(small) == 1 and tasks_for(big) == 10
    assert tasks_for([TableFile("a", 3 * TASK_BYTES)]) == 1
    assert tasks_for([TableFile("a", TASK_BYTES), TableFile("b", TASK_BYTES // 2)]) == 2
