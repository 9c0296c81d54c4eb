"""Staging writes: a batch's rows become Parquet files in the attempt's own directory.

Local tables are written by Spark's Parquet writer. On object stores Spark writes
``s3a://`` only with the ``hadoop-aws`` jar, which cannot be installed where this project
runs (no Maven), so the executors write instead, each its own files, with pyarrow through
:mod:`airflow_eo.table.storage` (the same storage options deltalake commits with): ``df.mapInArrow`` hands every task its Arrow batches, the task streams them into
``<table>/b<batch>-<attempt>/part-<task>-<uuid>.parquet`` and yields one row per file it
wrote (path, size, rows) back to the driver.

Only files reported by *successful* tasks are staged: a retried or speculative task
attempt that died after writing leaves a file in the attempt directory that no
successful task reported, and it is never committed (the orphan collector removes it
with the rest of the attempt directory).

Example::

    >>> files = stage_with_arrow(df, location, staging.attempt_path(plan), storage_options,  # doctest: +SKIP
    ...                          arrow_schema)
    >>> files[0].path  # doctest: +SKIP
    'b00000003-3f2a9c0d1e6b4a52/part-00000-8c1e….parquet'
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_eo.table.partitioning import format_value, partition_dir
from airflow_eo.table.staging import StagedFile, StagingArea
from airflow_eo.table.storage import TableLocation, is_local

WRITTEN_SCHEMA = "path string, size long, rows long"


def split_by_partition(batch: pa.RecordBatch, partition_by: tuple[str, ...]):
    """``(directory, rows)`` per distinct partition value set of ``batch``; the rows without the
    partition columns (a Delta file keeps them in its add action, not in the file)."""
    if not partition_by:
        yield "", batch
        return
    table = pa.Table.from_batches([batch])
    for values in table.group_by(list(partition_by)).aggregate([]).to_pylist():
        mask = None
        for column, value in values.items():
            match = pc.is_null(table[column]) if value is None else pc.equal(table[column], value)
            mask = match if mask is None else pc.and_(mask, match)
        rows = table.filter(mask).drop_columns(list(partition_by))
        yield partition_dir({c: format_value(v) for c, v in values.items()}), rows.combine_chunks().to_batches()[0]


def _task_writer(table_uri: str, storage_options: dict | None, target: str, arrow_schema: pa.Schema,
                 partition_by: tuple[str, ...] = ()):
    """The function each Spark task runs (pickled to the executors' Python workers): one file
    per partition directory the task's rows fall into."""
    file_schema = pa.schema([f for f in arrow_schema if f.name not in partition_by])

    def write(batches):
        from pyspark import TaskContext

        location = TableLocation.of(table_uri, storage_options)
        task = TaskContext.get().partitionId() if TaskContext.get() else 0
        open_files: dict[str, list] = {}  # directory -> [path, stream, writer, rows]; empty tasks write none
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                for directory, rows in split_by_partition(batch.cast(arrow_schema), partition_by):
                    entry = open_files.get(directory)
                    if entry is None:
                        folder = f"{target}/{directory}" if directory else target
                        location.fs.create_dir(folder, recursive=True)
                        path = f"{folder}/part-{task:05d}-{uuid.uuid4().hex}.parquet"
                        stream = location.fs.open_output_stream(path)
                        entry = open_files[directory] = [path, stream, pq.ParquetWriter(stream, file_schema), 0]
                    entry[2].write_batch(rows)
                    entry[3] += rows.num_rows
        finally:
            for _, stream, writer, _ in open_files.values():
                writer.close()
                stream.close()  # an S3 object exists only once its upload is closed
        if open_files:
            entries = list(open_files.values())
            yield pa.RecordBatch.from_pydict({"path": [e[0] for e in entries],
                                              "size": [location.fs.get_file_info(e[0]).size for e in entries],
                                              "rows": [e[3] for e in entries]})

    return write


def stage_with_arrow(df, location: TableLocation, target: str, storage_options: dict | None,
                     arrow_schema: pa.Schema, partition_by: tuple[str, ...] = ()) -> list[StagedFile]:
    """Write ``df`` as Parquet files under ``target`` from the executors; return them staged.

    ``arrow_schema`` is the table's Arrow schema (microsecond UTC timestamps), so the
    files match the Delta schema the commit declares.
    """
    from airflow_eo.driver.session import for_session

    with for_session(df):  # only the plan is built under the mark; running it needs none
        plan = df.mapInArrow(_task_writer(location.uri, storage_options, target, arrow_schema, partition_by),
                             WRITTEN_SCHEMA)
    written = plan.collect()
    reported = {row["path"]: row["rows"] for row in written}
    staged = StagingArea(location).staged_files(target, only=set(reported))
    missing = set(reported) - {location.join(f.path) for f in staged}
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} staged file(s) reported by Spark tasks are not readable under {target} "
            f"(e.g. {sorted(missing)[0]}): the object store lost a write; nothing was committed"
        )
    return staged


def stage(df, location: TableLocation, target: str, storage_options: dict | None,
          arrow_schema: pa.Schema, partition_by: tuple[str, ...] = ()) -> list[StagedFile]:
    """Write ``df`` under ``target`` (the attempt's directory) and return the staged files:
    Spark's Parquet writer for local tables, the executors' pyarrow writer for object stores
    (Spark here has no ``hadoop-aws`` jar to write ``s3a://``). A partitioned table's files go
    into Hive-style directories of their partition values (:mod:`airflow_eo.table.partitioning`)."""
    if is_local(location.uri):
        writer = df.write.mode("error")
        (writer.partitionBy(*partition_by) if partition_by else writer).parquet(f"file://{target}")
        return StagingArea(location).staged_files(target)
    return stage_with_arrow(df, location, target, storage_options, arrow_schema, partition_by)
