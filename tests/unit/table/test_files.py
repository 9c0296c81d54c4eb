"""A table file's rows as a reader asks for them: partition values from the log typed as asked
(timestamps written in UTC without an offset, nulls), columns cast, missing columns null."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.files import TableFile, add_actions_of, conform, snapshot_files

ROWS = pa.table({"offset": pa.array([7, 8], pa.int32())})


def test_partition_values_read_as_the_asked_types_and_null_as_null():
    file = TableFile("at=2026-03-04 05%3A06%3A07/n=__HIVE_DEFAULT_PARTITION__/p.parquet", 1,
                     {"at": "2026-03-04 05:06:07.5", "n": None})
    wanted = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("n", pa.int64()), ("offset", pa.int64())])
    out = conform(ROWS, file, wanted)
    assert out.schema == wanted and isinstance(out, pa.Table)
    assert out.to_pylist() == [
        {"at": dt.datetime(2026, 3, 4, 5, 6, 7, 500000, tzinfo=dt.timezone.utc), "n": None, "offset": o} for o in (7, 8)]


def test_a_partition_value_that_is_not_of_the_asked_type_names_the_file():
    with pytest.raises(ValueError, match=r"p\.parquet: column 'n' is string, which does not read as int64"):
        conform(ROWS, TableFile("n=x/p.parquet", 1, {"n": "x"}), pa.schema([("n", pa.int64())]))


class Snapshot:
    """What add_actions_of reads of a DeltaTable: its add actions as the log spells them."""

    def __init__(self, actions: pa.Table):
        self.actions = actions

    def get_add_actions(self, flatten: bool) -> pa.Table:
        return self.actions


def test_log_paths_are_decoded_once_and_partition_values_come_from_the_log():
    raw = pa.table({"path": ["d=2026-03-04/r=a%252Fb/p.parquet", "d=__HIVE_DEFAULT_PARTITION__/r=x/q.parquet"],
                        "size_bytes": [10, 20], "partition.d": pa.array([dt.date(2026, 3, 4), None], pa.date32()),
                        "partition.r": ["a/b", "x"]})
    actions = add_actions_of(Snapshot(raw), ColumnNames())  # no column mapping: the log's names
    assert actions["path"].to_pylist() == ["d=2026-03-04/r=a%2Fb/p.parquet", "d=__HIVE_DEFAULT_PARTITION__/r=x/q.parquet"]
    assert snapshot_files(actions) == [TableFile("d=2026-03-04/r=a%2Fb/p.parquet", 10, {"d": "2026-03-04", "r": "a/b"}),
                                       TableFile("d=__HIVE_DEFAULT_PARTITION__/r=x/q.parquet", 20, {"d": None, "r": "x"})]
    plain = pa.table({"path": ["b00000001-x/part-0.parquet"], "size_bytes": [5]})
    assert snapshot_files(plain) == [TableFile("b00000001-x/part-0.parquet", 5, {})]
