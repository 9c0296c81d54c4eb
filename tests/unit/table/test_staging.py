"""Delta stats of a staged file: the key columns, and the Kafka ``timestamp`` that dedup
horizons and late counts prune files by (as delta-rs writes them: ISO-8601 UTC, milliseconds)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_eo.table.staging import file_stats

LOW = datetime(2026, 3, 4, 5, 6, 7, 123999, tzinfo=timezone.utc)
HIGH = datetime(2026, 3, 5, 0, 0, 0, 999, tzinfo=timezone.utc)


def stats_of(tmp_path, timestamp: pa.Array, row_group_size: int = 1) -> dict:
    table = pa.table({"topic": ["t"] * len(timestamp), "partition": pa.array([0] * len(timestamp), pa.int32()),
                      "offset": pa.array(range(len(timestamp)), pa.int64()), "timestamp": timestamp})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=row_group_size)
    return file_stats(pq.read_metadata(tmp_path / "f.parquet"))


def test_timestamp_stats_over_row_groups_truncated_to_the_millisecond(tmp_path):
    stats = stats_of(tmp_path, pa.array([HIGH, None, LOW], pa.timestamp("us", tz="UTC")))
    assert stats["minValues"] == {"topic": "t", "partition": 0, "offset": 0, "timestamp": "2026-03-04T05:06:07.123Z"}
    assert stats["maxValues"]["timestamp"] == "2026-03-05T00:00:00.000Z" and stats["maxValues"]["offset"] == 2
    assert stats["nullCount"]["timestamp"] == 1 and stats["numRecords"] == 3


@pytest.mark.parametrize("column", [
    pa.array([LOW.replace(tzinfo=None)], pa.timestamp("us")),  # no zone: not Kafka's UTC instant
    pa.array(["2026-03-04"]),  # a transform replaced it with text
    pa.array([None, None], pa.timestamp("us", tz="UTC")),  # nothing to bound
])
def test_no_timestamp_stats_unless_it_is_a_utc_timestamp_with_values(tmp_path, column):
    stats = stats_of(tmp_path, column)
    assert "timestamp" not in stats["minValues"] and "timestamp" not in stats["maxValues"]
    assert stats["minValues"]["offset"] == 0  # the key columns' stats are unaffected
