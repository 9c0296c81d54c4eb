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

    >>> files = stage_with_arrow(df, location, staging.attempt_path(plan), storage_options)  # doctest: +SKIP
    >>> files[0].path
    'b00000003-3f2a9c0d1e6b4a52/part-00000-8c1e….parquet'
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_eo.table.staging import StagedFile, StagingArea
from airflow_eo.table.storage import TableLocation, is_local

WRITTEN_SCHEMA = "path string, size long, rows long"


def _task_writer(table_uri: str, storage_options: dict | None, target: str, arrow_schema: pa.Schema):
    """The function each Spark task runs (pickled to the executors' Python workers)."""

    def write(batches):
        from pyspark import TaskContext

        location = TableLocation.of(table_uri, storage_options)
        task = TaskContext.get().partitionId() if TaskContext.get() else 0
        path = f"{target}/part-{task:05d}-{uuid.uuid4().hex}.parquet"
        writer = stream = None
        rows = 0
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if writer is None:  # empty tasks write no file at all
                    location.fs.create_dir(target, recursive=True)
                    stream = location.fs.open_output_stream(path)
                    writer = pq.ParquetWriter(stream, arrow_schema)
                writer.write_batch(batch.cast(arrow_schema))
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
                stream.close()  # an S3 object exists only once its upload is closed
        if writer is not None:
            size = location.fs.get_file_info(path).size
            yield pa.RecordBatch.from_pydict({"path": [path], "size": [size], "rows": [rows]})

    return write


def stage_with_arrow(df, location: TableLocation, target: str, storage_options: dict | None,
                     arrow_schema: pa.Schema) -> list[StagedFile]:
    """Write ``df`` as Parquet files under ``target`` from the executors; return them staged.

    ``arrow_schema`` is the table's Arrow schema (microsecond UTC timestamps), so the
    files match the Delta schema the commit declares.
    """
    from airflow_eo.driver.session import for_session

    with for_session(df):  # only the plan is built under the mark; running it needs none
        plan = df.mapInArrow(_task_writer(location.uri, storage_options, target, arrow_schema), WRITTEN_SCHEMA)
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
          arrow_schema: pa.Schema) -> list[StagedFile]:
    """Write ``df`` under ``target`` (the attempt's directory) and return the staged files:
    Spark's Parquet writer for local tables, the executors' pyarrow writer for object stores
    (Spark here has no ``hadoop-aws`` jar to write ``s3a://``)."""
    if is_local(location.uri):
        df.write.mode("error").parquet(f"file://{target}")
        return StagingArea(location).staged_files(target)
    return stage_with_arrow(df, location, target, storage_options, arrow_schema)
