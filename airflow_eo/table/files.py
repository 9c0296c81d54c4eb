"""A table's data files: the files an attempt staged, the files of a snapshot, and reading one through the table's filesystem.

Reading goes through :class:`~airflow_eo.table.storage.TableLocation` (pyarrow's filesystem of
the table, with the storage options deltalake commits with), so a Spark task reads an
``s3://`` table's files without a Hadoop jar. :func:`read_columns` gives a file's rows as the
caller asks for them: exactly the requested columns, typed as given; a column the file lacks
(written before the column existed) reads as nulls, and a partition column (never stored in
the file) as the file's value from the Delta log.

Example::

    >>> import pyarrow as pa
    >>> rows = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
    >>> wanted = pa.schema([("id", pa.string()), ("date", pa.date32()), ("note", pa.string())])
    >>> conform(rows, TableFile("date=2026-03-04/part-0.parquet", 10, {"date": "2026-03-04"}), wanted).to_pydict()
    {'id': ['1', '2'], 'date': [datetime.date(2026, 3, 4), datetime.date(2026, 3, 4)], 'note': [None, None]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_eo.table.mapping import ColumnNames, rename_columns
from airflow_eo.table.partitioning import format_value, partition_values_of
from airflow_eo.table.storage import TableLocation

# Beside an attempt's directory (b<batch>-<attempt id>): the whole read's records staged for the tables whose
# rows need Spark (airflow_eo.driver.direct.feed_for); never in the table, removed when the attempt's tables are done.
FEED_SUFFIX = "-feed"
# rows per batch a reading task hands on: Arrow's default (a row group can hold millions)
READ_BATCH_ROWS = 65_536
_Rows = TypeVar("_Rows", pa.RecordBatch, pa.Table)


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file an attempt staged, with what its Delta add action needs."""

    path: str  # relative to the table root
    size: int
    modification_time: int  # epoch ms
    num_records: int
    stats: str  # Delta stats JSON
    # column -> value as its add action keeps them (by physical name under column mapping)
    partition_values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TableFile:
    """A data file of the table's snapshot: what reading it and its remove action need."""

    path: str  # relative to the table root
    size: int
    # logical column -> value as Delta writes it (text), or None; the log keys them by physical name
    # under column mapping (:meth:`airflow_eo.table.mapping.ColumnNames.physical_values`)
    partition_values: dict = field(default_factory=dict)
    deleted: tuple[int, ...] = ()  # the row indexes its deletion vector removes (read as absent)

    def __post_init__(self):  # from JSON (a rewrite's record) the rows arrive as a list
        object.__setattr__(self, "deleted", tuple(self.deleted))


def deleted_rows_of(table) -> dict[str, tuple[int, ...]]:
    """Each file of a ``deltalake.DeltaTable`` snapshot that has a deletion vector → the row indexes it
    deletes, by the file's path relative to the root (deltalake decodes the vectors: inline, or in
    their files)."""
    import numpy as np

    vectors = pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all()
    root = unquote(table.table_uri).rstrip("/")
    out = {}
    for uri, keep in zip(vectors["filepath"].to_pylist(), vectors["selection_vector"].to_pylist()):
        path = unquote(uri)
        for prefix in (root + "/", "file://" + root.removeprefix("file://") + "/"):
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        out[path] = tuple(int(i) for i in np.flatnonzero(~np.asarray(keep, dtype=bool)))
    return out


def add_actions_of(table, names: ColumnNames | None = None) -> pa.Table:
    """A snapshot's add actions (``DeltaTable.get_add_actions(flatten=True)``: path, size,
    partition values, stats), each ``path`` decoded: the one place log paths become file paths.

    The log holds a file's path as a URI, escaped once more (delta-rs writes the ``%2F`` of a
    partition directory ``region=eu%2Fwest`` as ``%252F``, the ``%3A`` of a timestamp's as
    ``%253A``): the file's path is its decoding, which is what opening it, an add action and a
    remove action take (``DeltaTable.file_uris()`` decodes too). A remove action given the log's
    form removes nothing, without an error.

    Under column mapping the log keeps statistics and partition values by physical name: they are
    named here by the logical names every reader asks for (``min.<column>``, ``partition.<column>``).
    """
    # through the Arrow C stream, pa.array() only for escaped paths and cast() only when needed:
    # pa.table() of a foreign table and pa.array() of a list import pandas (~0.2 s) to rule it
    # out, cast() pyarrow.compute (~30 ms); the audit reads this on every run
    actions = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()
    column = actions["path"]
    paths = column.to_pylist()
    if any("%" in p for p in paths):
        column = pa.array([unquote(p) for p in paths], pa.string())
    elif column.type != pa.string():
        column = column.cast(pa.string())
    actions = actions.set_column(actions.schema.get_field_index("path"), "path", column)
    if names is None:
        from airflow_eo.table.features import column_names_of

        names = column_names_of(table)
    if not names.active:
        return actions
    renamed = []
    for name in actions.column_names:
        kind, dot, rest = name.partition(".")
        if dot and kind in ("min", "max", "null_count", "partition"):
            top, dot2, nested = rest.partition(".")
            name = f"{kind}.{names.logical(top)}{dot2}{nested}"
        renamed.append(name)
    return actions.rename_columns(renamed)


def snapshot_files(actions: pa.Table, deleted: dict[str, tuple[int, ...]] | None = None) -> list[TableFile]:
    """The files of a snapshot's add actions (:func:`add_actions_of`, paths decoded). Partition
    values come from the log's ``partition.<column>`` columns (the truth: another writer may
    name directories differently), from the path when the log has none; ``deleted``: the rows
    deletion vectors remove (:func:`deleted_rows_of`).
    """
    deleted = deleted or {}
    parted = partition_columns_of(actions)
    files = []
    for row in actions.select(["path", "size_bytes", *parted]).to_pylist():
        path = row["path"]
        files.append(TableFile(path, row["size_bytes"], logged_partition_values(row, parted), deleted.get(path, ())))
    return files


def partition_columns_of(actions: pa.Table) -> list[str]:
    """The ``partition.<column>`` columns of a snapshot's add actions (:func:`add_actions_of`)."""
    return [c for c in actions.column_names if c.startswith("partition.")]


def logged_partition_values(row: dict, parted: list[str]) -> dict[str, str | None]:
    """One add action's partition values (``row``: its ``path`` and ``parted`` columns) as text, by the
    logical column names: from the log, the truth (another writer may name directories differently,
    or not by value at all, as deltalake and delta-spark do under column mapping); from the path only
    when the log has none."""
    if not parted:
        return partition_values_of(row["path"])
    return {c.split(".", 1)[1]: format_value(row[c]) for c in parted}


def read_file(location: TableLocation, path: str) -> pa.Table:
    """The whole data file ``path`` (relative to the table root)."""
    with location.fs.open_input_file(location.join(path)) as handle:
        return pq.ParquetFile(handle).read()


def read_columns(location: TableLocation, file: TableFile, schema: pa.Schema,
                 batch_rows: int = READ_BATCH_ROWS, names: dict[str, str] | None = None) -> Iterator[pa.RecordBatch]:
    """``file``'s rows with exactly ``schema``'s columns (:func:`conform`), one row group's share at a
    time; only the columns the file has are read, and the rows its deletion vector removes are left out.
    ``names``: logical → physical column names (column mapping, :meth:`ColumnNames.as_dict`): the file's
    physical columns are read under their logical names."""
    names = names or {}
    logical = {physical: name for name, physical in names.items()}
    with location.fs.open_input_file(location.join(file.path)) as handle:
        parquet = pq.ParquetFile(handle)
        stored = set(parquet.schema_arrow.names)
        present = [names.get(n, n) for n in schema.names if names.get(n, n) in stored and n not in file.partition_values]
        if not present:  # nothing to read: each row group's rows, all from the log or null
            batches: Iterator[pa.RecordBatch] = (
                pa.record_batch([pa.nulls(parquet.metadata.row_group(g).num_rows)], names=["_"])
                for g in range(parquet.metadata.num_row_groups))
        else:
            batches = parquet.iter_batches(batch_size=batch_rows, columns=present)
        first = 0  # the file's row index of the batch's first row
        for batch in batches:
            rows = batch.num_rows
            batch = rename_columns(batch, logical)
            if file.deleted:
                batch = _without(batch, first, file.deleted)
            first += rows
            if batch.num_rows:
                yield conform(batch, file, schema)


def _without(batch: pa.RecordBatch, first: int, deleted: tuple[int, ...]) -> pa.RecordBatch:
    """``batch`` (rows ``first``… of its file) without the rows ``deleted`` names."""
    import numpy as np

    gone = np.asarray(deleted, dtype=np.int64)
    gone = gone[(gone >= first) & (gone < first + batch.num_rows)] - first
    if not gone.size:
        return batch
    keep = np.ones(batch.num_rows, dtype=bool)
    keep[gone] = False
    return batch.filter(pa.array(keep))


def conform(rows: _Rows, file: TableFile, schema: pa.Schema) -> _Rows:
    """``rows`` of ``file`` as ``schema`` says: its columns cast to the given types, a partition
    column the file's value (from the log), a column neither has nulls."""
    columns = []
    for wanted in schema:
        if wanted.name in file.partition_values:
            value = file.partition_values[wanted.name]
            column = pa.nulls(rows.num_rows, wanted.type) if value is None else \
                _cast(pa.array([value] * rows.num_rows, pa.string()), wanted, file.path)
        elif wanted.name in rows.schema.names:
            column = _cast(rows.column(wanted.name), wanted, file.path)
        else:
            column = pa.nulls(rows.num_rows, wanted.type)
        columns.append(column)
    return type(rows).from_arrays(columns, schema=schema)


def _cast(column, wanted: pa.Field, path: str):
    import pyarrow.compute as pc  # here: the audit imports this module and never casts (~30 ms)

    if column.type == wanted.type:
        return column
    try:
        try:
            return pc.cast(column, wanted.type)
        except pa.ArrowInvalid:
            if not (pa.types.is_timestamp(wanted.type) and wanted.type.tz and pa.types.is_string(column.type)):
                raise
            # a partition value: Delta writes timestamps in UTC, without an offset
            return pc.cast(pc.cast(column, pa.timestamp(wanted.type.unit)), wanted.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ValueError(f"{path}: column {wanted.name!r} is {column.type}, which does not read as {wanted.type} "
                         f"({_first_line(exc)})") from exc


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
