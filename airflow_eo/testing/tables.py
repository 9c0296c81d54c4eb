"""The plugin's Delta side: a fresh table location, and a table read as a Delta reader reads it.

:class:`TestTable` is what the ``delta_table`` fixture gives a test: a path no table is at yet
(local, or ``s3://`` in the local S3 stand-in), with the storage options and the Airflow
connection that reach it. :func:`read_table` reads a table's current snapshot through
deltalake's ``QueryBuilder`` (DataFusion over the Delta log), so what a Delta reader applies —
deletion vectors, column mapping, partition values from the log — is applied here too; a read of
the Parquet files beside the log would see rows a commit deleted. (``DeltaTable.to_pyarrow_table``
is not used: it refuses tables with deletion vectors, and aborted the interpreter at exit with
some tables, delta-rs #2184.)

Example::

    >>> table = TestTable.local(tmp_path / "orders")                       # doctest: +SKIP
    >>> read_table(table, ["topic", "partition", "offset"]).num_rows       # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

S3_CONN_ID = "airflow_eo_test_s3"  # the aws connection the plugin sets for s3:// tables


@dataclass(frozen=True)
class TestTable:
    """Where a test's table goes: ``uri`` (give it as ``table_uri``), the deltalake ``storage_options``
    and, for ``s3://``, the Airflow ``aws`` connection (``storage_conn_id``) that reach it."""

    __test__ = False  # not a test class, whatever its name

    uri: str
    storage_options: Mapping[str, str] | None = None
    storage_conn_id: str | None = None
    airflow_connection: str | None = field(default=None, repr=False)  # the AIRFLOW_CONN_* value of the conn id

    @classmethod
    def local(cls, path: "Path | str") -> "TestTable":
        return cls(str(path))

    @classmethod
    def on_s3(cls, s3, name: str) -> "TestTable":
        """A table in the stand-in's bucket (:class:`airflow_eo.testing.s3.MotoS3`)."""
        login, password, extra = s3.connection_fields()
        conn = json.dumps({"conn_type": "aws", "login": login, "password": password, "extra": extra})
        return cls(f"s3://{s3.bucket}/{name}", s3.storage_options(), S3_CONN_ID, conn)

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:  # a local table is a path: open(), os.path.join, Path() take it
        if "://" in self.uri:
            raise TypeError(f"{self.uri} is not a local path")
        return self.uri

    @property
    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.uri, storage_options=self.options())

    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The table's rows as a Delta reader sees them (:func:`read_table`)."""
        return read_table(self, columns)

    def committed_offsets(self, ingest_id: str, topic: str, partitions: Sequence[int]) -> dict[int, int | None]:
        """The offset the table committed for each partition (its ``txn`` actions), None where none."""
        from deltalake import DeltaTable

        from airflow_eo.core.offsets import TopicPartition
        from airflow_eo.table.app_ids import partition_app_id

        if not self.exists:
            return {p: None for p in partitions}
        dt = DeltaTable(self.uri, storage_options=self.options())
        return {p: dt.transaction_version(partition_app_id(ingest_id, TopicPartition(topic, p))) for p in partitions}


def table_of(table: "TestTable | str", storage_options: Mapping[str, str] | None = None) -> TestTable:
    return table if isinstance(table, TestTable) else TestTable(str(table), storage_options)


def read_table(table: "TestTable | str", columns: Sequence[str] | None = None,
               storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The rows of ``table``'s current snapshot (``columns``, or all), read through deltalake's
    QueryBuilder: deletion vectors applied, partition values from the log. No table yet: no rows."""
    from deltalake import DeltaTable, QueryBuilder

    t = table_of(table, storage_options)
    if not t.exists:
        return pa.table({c: pa.array([], pa.null()) for c in columns or ()})
    dt = DeltaTable(t.uri, storage_options=t.options())
    names = [f.name for f in dt.schema().fields]
    wanted = list(columns) if columns is not None else names
    missing = [c for c in wanted if c not in names]
    if missing:
        raise ValueError(f"{t.uri} has no column {', '.join(missing)} (its columns: {', '.join(names)})")
    select = ", ".join(f'"{c}"' for c in wanted)
    found = pa.table(QueryBuilder().register("t", dt).execute(f"SELECT {select} FROM t").read_all())
    return _plain(found)


def _plain(table: pa.Table) -> pa.Table:
    """DataFusion's view types as the plain string and binary types the rest of Arrow knows."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    schema = pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema])
    return table.cast(schema) if schema != table.schema else table


def rows(table: "TestTable | str", columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """:func:`read_table` as a list of dicts."""
    return read_table(table, columns).to_pylist()
