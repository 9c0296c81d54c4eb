"""The table side of a merge (airflow_eo.table.merge): which files may hold a batch's keys, and
their copies without those keys' rows, on Parquet files written by pyarrow."""

import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.files import TableFile
from airflow_eo.table.merge import (
    DELETE_COLUMN, Rewrite, candidate_files, key_stats, rewrite_file, with_key_stats,
)
from airflow_eo.table.staging import staged_file
from airflow_eo.table.storage import TableLocation


def stats_table(files: list[dict]) -> pa.Table:
    """What ``get_add_actions(flatten=True)`` gives: path, size and flattened min/max/partition columns."""
    return pa.Table.from_pylist(files)


def keys(**columns) -> pa.Table:
    n = len(next(iter(columns.values())))
    return pa.table({**columns, DELETE_COLUMN: [False] * n})


def test_files_are_chosen_by_the_min_max_of_the_key_and_only_keys_inside_travel():
    files = stats_table([
        {"path": "a", "size_bytes": 1, "min.id": 1, "max.id": 100},
        {"path": "b", "size_bytes": 1, "min.id": 101, "max.id": 200},
        {"path": "c", "size_bytes": 1, "min.id": 201, "max.id": 300},
    ])
    found, inside = candidate_files(files, keys(id=[250, 5, 999, 100]), ("id",))
    assert [f.path for f in found] == ["a", "c"]  # 999 is beyond every file: an insert, nothing to read
    assert sorted(inside["id"].to_pylist()) == [5, 100, 250]


def test_a_file_without_statistics_of_the_key_may_hold_any_key():
    files = stats_table([
        {"path": "old", "size_bytes": 1, "min.id": None, "max.id": None},
        {"path": "new", "size_bytes": 1, "min.id": 10, "max.id": 20},
    ])
    found, inside = candidate_files(files, keys(id=[1, 2]), ("id",))
    assert [f.path for f in found] == ["old"] and inside.num_rows == 2
    no_columns = pa.table({"path": ["x"], "size_bytes": [1]})
    assert [f.path for f in candidate_files(no_columns, keys(id=[1]), ("id",))[0]] == ["x"]


def test_every_key_column_must_be_in_range_and_strings_dates_timestamps_compare():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    files = pa.table({
        "path": ["a", "b"], "size_bytes": [1, 1],
        "min.tenant": ["acme", "acme"], "max.tenant": ["acme", "zeta"],
        "min.day": pa.array([dt.date(2026, 1, 1)] * 2), "max.day": pa.array([dt.date(2026, 1, 5)] * 2),
        "min.at": pa.array([t0, t0], pa.timestamp("us", "UTC")),
        "max.at": pa.array([t0 + dt.timedelta(hours=1)] * 2, pa.timestamp("us", "UTC")),
    })
    batch = keys(tenant=["beta", "acme"], day=pa.array([dt.date(2026, 1, 2), dt.date(2026, 2, 1)]),
                 at=pa.array([t0, t0], pa.timestamp("us", "UTC")))
    found, inside = candidate_files(files, batch, ("tenant", "day", "at"))
    # ("beta", Jan 2) fits b only; ("acme", Feb 1) is past both files' days
    assert [f.path for f in found] == ["b"]
    assert inside["tenant"].to_pylist() == ["beta"]


def test_a_key_column_that_partitions_the_table_matches_the_partition_value():
    files = pa.table({"path": ["tenant=a/x", "tenant=b/y", "tenant=__HIVE_DEFAULT_PARTITION__/z"],
                      "size_bytes": [1, 1, 1], "min.id": [1, 1, 1], "max.id": [9, 9, 9],
                      "partition.tenant": ["a", "b", None]})
    found, _ = candidate_files(files, keys(id=[5, 5], tenant=["b", "c"]), ("id", "tenant"), ("tenant",))
    assert [f.path for f in found] == ["tenant=b/y"]
    assert found[0].partition_values == {"tenant": "b"}
    ints = pa.table({"path": ["n=1/x", "n=2/y"], "size_bytes": [1, 1], "partition.n": ["1", "2"]})
    assert [f.path for f in candidate_files(ints, keys(n=pa.array([2], pa.int64())), ("n",), ("n",))[0]] == ["n=2/y"]


def test_nothing_to_choose_from():
    files = stats_table([{"path": "a", "size_bytes": 1, "min.id": 1, "max.id": 9}])
    assert candidate_files(files, keys(id=pa.array([], pa.int64())), ("id",))[0] == []
    assert candidate_files(files.slice(0, 0), keys(id=[1]), ("id",))[0] == []


def write(location: TableLocation, path: str, table: pa.Table) -> TableFile:
    full = location.join(path)
    location.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, full, filesystem=location.fs)
    return TableFile(path, location.fs.get_file_info(full).size, {})


def rows_of(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "body": [f"v{i}" for i in ids], "topic": ["t"] * n,
                     "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(ids, pa.int64())})


def test_a_file_holding_changed_keys_is_copied_without_them_and_the_counts_say_why(tmp_path):
    location = TableLocation.of(str(tmp_path / "t"))
    file = write(location, "b00000001-aa/part-0.parquet", rows_of(10))
    changed = pa.table({"id": pa.array([2, 3, 7, 42], pa.int64()), DELETE_COLUMN: [False, True, False, True]})
    done = rewrite_file(location, file, changed, ("id",), "b00000002-bb-kept")
    assert (done.updated, done.deleted, done.replaced, done.kept) == (2, 1, 0, 7)
    copy = pq.read_table(location.join(done.copy.path))
    assert sorted(copy["id"].to_pylist()) == [0, 1, 4, 5, 6, 8, 9]
    assert done.copy.path.startswith("b00000002-bb-kept/") and done.copy.num_records == 7
    stats = json.loads(done.copy.stats)
    assert (stats["minValues"]["id"], stats["maxValues"]["id"], stats["minValues"]["offset"]) == (0, 9, 0)
    assert Rewrite.from_json(done.to_json()) == done


def test_a_file_without_changed_keys_is_left_alone_and_one_emptied_gets_no_copy(tmp_path):
    location = TableLocation.of(str(tmp_path / "t"))
    file = write(location, "f.parquet", rows_of(3))
    assert rewrite_file(location, file, pa.table({"id": pa.array([99], pa.int64()), DELETE_COLUMN: [True]}),
                        ("id",), "x-kept") is None
    emptied = rewrite_file(location, file, pa.table({"id": pa.array([0, 1, 2], pa.int64()),
                                                     DELETE_COLUMN: [True] * 3}), ("id",), "x-kept")
    assert emptied.copy is None and emptied.deleted == 3


def test_a_reprocess_also_drops_its_own_rows_by_offset_and_partition_keys_come_from_the_path(tmp_path):
    location = TableLocation.of(str(tmp_path / "t"))
    table = rows_of(6).drop_columns(["id"]).append_column("id", pa.array(["k"] * 6))
    file = write(location, "tenant=a/part-0.parquet", table)
    file = TableFile(file.path, file.size, {"tenant": "a"})
    changed = pa.table({"id": ["k"], "tenant": ["zz"], DELETE_COLUMN: [False]})  # not this partition
    done = rewrite_file(location, file, changed, ("id", "tenant"), "b-kept", (OffsetRange("t", 0, 4, 6),))
    assert (done.updated, done.replaced, done.kept) == (0, 2, 4)
    assert done.copy.path.startswith("b-kept/tenant=a/") and done.copy.partition_values == {"tenant": "a"}
    hit = rewrite_file(location, file, pa.table({"id": ["k"], "tenant": ["a"], DELETE_COLUMN: [True]}),
                       ("id", "tenant"), "b-kept")
    assert hit.deleted == 6 and hit.copy is None


@pytest.mark.parametrize("arrow_type, values, low, high", [
    (pa.int32(), [5, -3, 9], -3, 9),
    (pa.string(), ["m", "a", "z"], "a", "z"),
    (pa.date32(), [dt.date(2026, 1, 2), dt.date(2025, 1, 1)], "2025-01-01", "2026-01-02"),
    # a timestamp's upper bound is rounded up to the millisecond, so it stays a bound
    (pa.timestamp("us", "UTC"), [dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.timezone.utc)],
     "2026-01-01T00:00:00.001Z", "2026-01-01T00:00:00.002Z"),
])
def test_key_statistics_from_the_footer(tmp_path, arrow_type, values, low, high):
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"k": pa.array(values, arrow_type)}), path)
    stats = key_stats(pq.read_metadata(path), ("k",))
    assert (stats["minValues"]["k"], stats["maxValues"]["k"], stats["nullCount"]["k"]) == (low, high, 0)


def test_keys_of_types_without_exact_statistics_get_none_and_files_keep_their_offsets_stats(tmp_path):
    location = TableLocation.of(str(tmp_path / "t"))
    write(location, "f.parquet", rows_of(3).append_column("d", pa.array([1.5, 2.5, 0.5])))
    staged = staged_file(location, location.fs.get_file_info(location.join("f.parquet")))
    assert key_stats(pq.read_metadata(location.join("f.parquet")), ("d",))["minValues"] == {}
    [with_id] = with_key_stats(location, [staged], ("id",))
    stats = json.loads(with_id.stats)
    assert stats["maxValues"] == {"offset": 2, "partition": 0, "topic": "t", "id": 2}
