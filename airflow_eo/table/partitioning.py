"""Partitioned tables: the columns a table is partitioned by, and the Hive-style directories
(``date=2026-03-04/``) their files live in.

A table is partitioned when the first batch creates it (``partition_by``, e.g. a date the
transform derives from the Kafka timestamp) and keeps that layout for good: every batch
writes each file under the directory of its partition values, and the file's Delta add action
carries those values (the partition columns are not stored in the Parquet files). Spark's
``partitionBy`` writes local tables; the pyarrow writer of object stores uses the same
directory names (:func:`partition_dir`); both are read back from the path
(:func:`partition_values_of`), as are the directories of files deltalake compacted.

The key columns (topic, partition, offset) cannot be partition columns: every file keeps them
with their statistics, which reprocess and the checks read.

Example::

    >>> partition_dir({"date": "2026-03-04", "region": "eu/west"})
    'date=2026-03-04/region=eu%2Fwest'
    >>> partition_values_of("b00000007-3f2a9c0d1e6b4a52/date=2026-03-04/region=eu%2Fwest/part-0.parquet")
    {'date': '2026-03-04', 'region': 'eu/west'}
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable
from urllib.parse import unquote

from airflow_eo.core.errors import ConfigError

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's and Spark's directory for a null value
# Characters Hive and Spark escape in partition directory names (%XX), control characters too
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(0x20)}


def check_table_partitioning(table_columns: Iterable[str], wanted: Iterable[str], table_uri: str) -> None:
    """An existing table keeps the partitioning it was created with: the configuration must say the same."""
    have, want = list(table_columns), list(wanted)
    if have == want:
        return
    if not have:
        raise ConfigError(f"{table_uri} is not partitioned and partition_by={want} applies only when the first "
                          "batch creates a table: remove partition_by, or ingest into a new table")
    raise ConfigError(f"{table_uri} is partitioned by {have}, not {want or 'nothing'}: set partition_by={have} "
                      "(the transform must produce those columns)")


def format_value(value) -> str | None:
    """A partition value as Delta stores it in ``partitionValues`` (and Spark in directory names)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):  # as Spark casts it to text: no fraction when it is zero
        return value.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _escape(text: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def partition_dir(values: dict[str, str | None]) -> str:
    """The relative directory of a file with these partition values (Hive-style, escaped)."""
    return "/".join(f"{_escape(k)}={NULL_PARTITION if v is None else _escape(v)}" for k, v in values.items())


def partition_segments(relative_path: str) -> list[str]:
    """The ``column=value`` directories of a table file's path, as written."""
    return [s for s in relative_path.split("/")[:-1] if "=" in s]


def partition_values_of(relative_path: str) -> dict[str, str | None]:
    """The partition values a table file's path says (none for an unpartitioned file)."""
    values: dict[str, str | None] = {}
    for segment in partition_segments(relative_path):
        key, _, raw = segment.partition("=")
        values[unquote(key)] = None if raw == NULL_PARTITION else unquote(raw)
    return values
