"""Partition directories and values, and the partitioning checks (no table written)."""

from __future__ import annotations

import pytest

from airflow_eo.spec import check_partition_by
from airflow_eo.core.errors import ConfigError
from airflow_eo.table.partitioning import check_table_partitioning, partition_dir, partition_values_of


def test_directories_and_values_round_trip_with_escapes_and_nulls():
    values = {"date": "2026-03-04", "region": "eu/west:1", "note": None}
    directory = partition_dir(values)
    assert directory == "date=2026-03-04/region=eu%2Fwest%3A1/note=__HIVE_DEFAULT_PARTITION__"
    assert partition_values_of(f"b00000001-0123456789abcdef/{directory}/part-0.parquet") == values
    assert partition_values_of("b00000001-0123456789abcdef/part-0.parquet") == {}


@pytest.mark.parametrize("columns, message", [
    (["offset"], "key column"), ([""], "column names"), (["date", "date"], "twice")])
def test_bad_partition_columns_are_refused(columns, message):
    with pytest.raises(ConfigError, match=message):
        check_partition_by(columns)


def test_an_existing_tables_partitioning_must_be_named():
    check_table_partitioning(["date"], ("date",), "/t")
    with pytest.raises(ConfigError, match="is partitioned by \\['date'\\].*set partition_by=\\['date'\\]"):
        check_table_partitioning(["date"], (), "/t")
    with pytest.raises(ConfigError, match="is not partitioned"):
        check_table_partitioning([], ("date",), "/t")
