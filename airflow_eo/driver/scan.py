"""Reading a table's own data files into Spark: in tasks through the table's filesystem, or by Spark's reader.

Spark opens ``s3://`` files only with the hadoop-aws jar, which cannot be installed where this
project runs (no Maven). So for a table that is not local, Spark does not open the files:
``spark.range`` gives one row per file, ``mapInArrow`` hands each task its share
(:func:`over_files`, about :data:`TASK_BYTES` of files per task), and the task opens them with
pyarrow through :class:`~airflow_eo.table.storage.TableLocation` and the storage options deltalake
commits with. That works on both Spark paths (the workers need airflow_eo and those options, no jar)
and on any store deltalake and pyarrow share. Two users: :func:`read_table_files` (dedup's stored
keys) and merge's rewrite tasks (:mod:`airflow_eo.driver.merge`), which run their own function over
the files.

:func:`read_table_files` gives the requested columns typed as given; a file that lacks one reads
it as nulls, a partition column reads the file's value from the Delta log
(:func:`airflow_eo.table.files.read_columns`). A local table is read by Spark's own Parquet reader
instead (vectorised in the JVM, no rows through Python), unless a requested column partitions the
table (given files, not the table's root, Spark's reader sees no partition values) or a file has a
deletion vector (Spark's Parquet reader would return the rows it deletes; the tasks leave them out).

Example::

    >>> stored = TableFiles(location.uri, tuple(files), storage_options)          # doctest: +SKIP
    >>> keys = read_table_files(spark, stored, pa.schema([("_dedup_key", pa.string())]))  # doctest: +SKIP
    >>> keys.count()                                                               # doctest: +SKIP
    1200
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import pyarrow as pa

from airflow_eo.driver.session import for_session
from airflow_eo.table.files import TableFile, read_columns
from airflow_eo.table.storage import TableLocation, is_local

# a task reads about this much of the table (at least one file): fewer, fuller tasks on small
# tables, one task per file on large ones
TASK_BYTES = 32 * 2**20


@dataclass(frozen=True)
class TableFiles:
    """Some data files of one table and how to reach them: the table's URI, the files (paths
    relative to its root, sizes, partition values from the log), and the storage options its
    filesystem takes (credentials: out of ``repr``, so never in a log line)."""

    uri: str
    files: tuple[TableFile, ...] = ()
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    names: Mapping[str, str] = field(default_factory=dict)  # logical → physical (column mapping)

    @property
    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None


def tasks_for(files: Sequence[TableFile]) -> int:
    """How many tasks read ``files``: one per :data:`TASK_BYTES`, at most one per file."""
    return min(len(files), max(1, -(-sum(f.size for f in files) // TASK_BYTES)))


def over_files(spark, files: Sequence[TableFile], function: Callable, schema):
    """A DataFrame of what ``function`` yields in Spark tasks over ``files``: each task gets Arrow
    batches of one ``id`` column, indices into ``files`` (``function`` is pickled with them to the
    workers); ``schema`` is its output's (a Spark ``StructType`` or DDL string)."""
    with for_session(spark):  # only the plan is built under the mark
        return spark.range(0, len(files), 1, max(1, tasks_for(files))).mapInArrow(function, schema)


def column_reader(table_uri: str, storage_options: dict | None, files: Sequence[TableFile], schema: pa.Schema,
                  names: Mapping[str, str] | None = None):
    """What each reading task runs (pickled to the workers): the rows of its share of ``files``, with
    exactly ``schema``'s columns (:func:`airflow_eo.table.files.read_columns`; ``names``: physical
    column names under column mapping)."""
    files, names = tuple(files), dict(names or {})

    def read(batches):
        location = TableLocation.of(table_uri, storage_options)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                yield from read_columns(location, files[i], schema, names=names)

    return read


def read_table_files(spark, table: TableFiles | None, schema: pa.Schema):
    """A DataFrame of ``table``'s files with ``schema``'s columns (module doc), or None when there
    are no files."""
    if table is None or not table.files:
        return None
    from airflow_eo.compat import spark_schema_of

    struct = spark_schema_of(schema)  # no SQL parser: its first use costs a cold job about a second
    partitioned = any(c in f.partition_values for f in table.files for c in schema.names)
    deleted = any(f.deleted for f in table.files)  # Spark's Parquet reader knows no deletion vectors
    mapped = any(table.names.get(c, c) != c for c in schema.names)  # nor column mapping's physical names
    if is_local(table.uri) and not partitioned and not deleted and not mapped:
        location = TableLocation.of(table.uri)
        with for_session(spark):
            return spark.read.schema(struct).parquet(*[location.join(f.path) for f in table.files])
    return over_files(spark, table.files, column_reader(table.uri, table.options, table.files, schema, table.names),
                      struct)
