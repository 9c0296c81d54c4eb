"""Staging writes: a batch's rows become Parquet files in the attempt's own directory.

Two writers. Spark's Parquet writer, for local tables whose rows a transform computed in
Spark. And the tasks' own pyarrow writer (:func:`task_writer`): each Spark task streams its
Arrow batches into ``<table>/b<batch>-<attempt>/part-<task>-<uuid>.parquet`` through
:mod:`airflow_eo.table.storage` (the same storage options deltalake commits with) and yields
one row per file it wrote back to the driver: path, size, rows, the Delta stats from the
footer it just wrote, rows per Kafka partition — so the driver reads no file back. It is what
object stores use (Spark writes ``s3a://`` only with the ``hadoop-aws`` jar, which cannot be
installed where this project runs: no Maven, so ``df.mapInArrow`` hands it the rows), and what
the direct path uses (:mod:`airflow_eo.driver.direct`: the reading tasks write their records
themselves, no row crosses into the JVM).

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

from airflow_eo.table.files import StagedFile
from airflow_eo.table.mapping import SPARK_FIELD_ID, ColumnNames, physical_batch
from airflow_eo.table.partitioning import format_value, partition_dir, partition_values_of
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation, is_local

WRITTEN_SCHEMA = pa.schema([("path", pa.string()), ("size", pa.int64()), ("mtime", pa.int64()), ("rows", pa.int64()),
                            ("stats", pa.string()), ("partition_rows", pa.string())])


def written_struct():
    """:data:`WRITTEN_SCHEMA` as a Spark ``StructType``: a plan declares it without Spark's SQL
    parser, whose first use costs a cold spark-submit job about a second (a DDL string would)."""
    from airflow_eo.compat import spark_schema_of

    return spark_schema_of(WRITTEN_SCHEMA)
# Rows buffered into one Parquet row group: a row group per Arrow batch (10,000 records) would make
# files of many small row groups, which compress worse and read slower; Spark writes 128 MB ones.
ROW_GROUP_BYTES = 64 * 2**20


def split_by_partition(batch: pa.RecordBatch, partition_by: tuple[str, ...], names: ColumnNames | None = None):
    """``(directory, rows)`` per distinct partition value set of ``batch``; the rows without the
    partition columns (a Delta file keeps them in its add action, not in the file). ``names``: the
    directories are named by physical column names (column mapping)."""
    physical = (names or ColumnNames()).physical
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
        yield partition_dir({physical(c): format_value(v) for c, v in values.items()}), \
            rows.combine_chunks().to_batches()[0]


def rows_per_kafka_partition(batch: pa.RecordBatch) -> dict[str, int]:
    """``{"topic[partition]": rows}`` of one batch (one pass; a reader's batch holds one partition)."""
    topics, partitions = batch.column("topic"), batch.column("partition")
    if topics.null_count == 0 and partitions.null_count == 0 and pc.count_distinct(topics).as_py() == 1 \
            and pc.count_distinct(partitions).as_py() == 1:
        return {f"{topics[0].as_py()}[{partitions[0].as_py()}]": batch.num_rows}
    counts = pa.Table.from_batches([batch.select(["topic", "partition"])]).group_by(
        ["topic", "partition"]).aggregate([([], "count_all")])
    return {f"{t}[{p}]": n for t, p, n in zip(counts["topic"].to_pylist(), counts["partition"].to_pylist(),
                                              counts["count_all"].to_pylist())}


class _OpenFile:
    """One Parquet file a task is writing: rows are buffered into row groups of ROW_GROUP_BYTES."""

    def __init__(self, location: TableLocation, path: str, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.stream = location.fs.open_output_stream(path)
        self.writer = pq.ParquetWriter(self.stream, schema)
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_bytes = 0
        self.rows = 0

    def add(self, rows: pa.RecordBatch) -> None:
        self.buffered.append(rows)
        self.buffered_bytes += rows.nbytes
        self.rows += rows.num_rows
        if self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            table = pa.Table.from_batches(self.buffered, schema=self.schema)
            self.writer.write_table(table, row_group_size=table.num_rows)
            self.buffered, self.buffered_bytes = [], 0

    def close(self) -> None:
        try:
            self.flush()
            self.writer.close()
        finally:
            self.stream.close()  # an S3 object exists only once its upload is closed


def task_writer(table_uri: str, storage_options: dict | None, target: str, arrow_schema: pa.Schema,
                partition_by: tuple[str, ...] = (), names: ColumnNames | None = None):
    """The function each Spark task runs (pickled to the executors' Python workers; the driver calls it
    with ``task`` for a batch it reads itself): it streams its Arrow batches into a :class:`TaskFiles`
    and yields its report, so the driver reads nothing back."""

    def write(batches, task: int | None = None):
        files = TaskFiles(table_uri, storage_options, target, arrow_schema, partition_by, names, task)
        try:
            for batch in batches:
                files.add(batch)
        finally:
            files.close()
        report = files.report()
        if report is not None:
            yield report

    return write


class TaskFiles:
    """One task's Parquet files under ``target``: one file per partition directory its batches fall
    into; then one report row per file (:data:`WRITTEN_SCHEMA`: path, size, modification time, rows,
    the Delta stats from the file's own footer; the task's rows per Kafka partition as JSON on its
    first file's row). ``names``: the table's column mapping (the files get physical names and field
    ids, their directories physical partition names). Built where the task runs."""

    def __init__(self, table_uri: str, storage_options: dict | None, target: str, arrow_schema: pa.Schema,
                 partition_by: tuple[str, ...] = (), names: ColumnNames | None = None, task: int | None = None):
        if task is None:  # a Spark task; the driver reading a batch itself names its task (no pyspark import)
            from pyspark import TaskContext

            task = TaskContext.get().partitionId() if TaskContext.get() else 0
        self.names = names or ColumnNames()
        self.file_schema = self.names.physical_arrow_schema(
            pa.schema([f for f in arrow_schema if f.name not in partition_by]))
        self.arrow_schema, self.partition_by, self.target, self.task = arrow_schema, partition_by, target, task
        self.location = TableLocation.of(table_uri, storage_options)
        self.open_files: dict[str, _OpenFile] = {}  # directory -> file; empty tasks write none
        self.kafka_rows: dict[str, int] = {}  # the task's rows per Kafka partition, over all its files

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = batch.cast(self.arrow_schema) if batch.schema != self.arrow_schema else batch
        for key, n in rows_per_kafka_partition(batch).items():
            self.kafka_rows[key] = self.kafka_rows.get(key, 0) + n
        for directory, rows in split_by_partition(batch, self.partition_by, self.names):
            rows = physical_batch(rows, self.file_schema) if self.names.active else rows
            entry = self.open_files.get(directory)
            if entry is None:
                folder = f"{self.target}/{directory}" if directory else self.target
                self.location.fs.create_dir(folder, recursive=True)
                entry = self.open_files[directory] = _OpenFile(
                    self.location, f"{folder}/part-{self.task:05d}-{uuid.uuid4().hex}.parquet", self.file_schema)
            entry.add(rows)

    def close(self) -> None:
        for entry in self.open_files.values():
            entry.close()

    def report(self) -> pa.RecordBatch | None:
        """The closed files' report rows (None: the task wrote no file)."""
        import json
        import time

        from airflow_eo.table.staging import file_stats

        if not self.open_files:
            return None
        entries = list(self.open_files.values())
        infos = [self.location.fs.get_file_info(e.path) for e in entries]
        return pa.RecordBatch.from_pydict(schema=WRITTEN_SCHEMA, mapping={
            "path": [e.path for e in entries],
            "size": [i.size for i in infos],
            "mtime": [int(i.mtime.timestamp() * 1000) if i.mtime else int(time.time() * 1000) for i in infos],
            "rows": [e.rows for e in entries],
            "stats": [json.dumps(file_stats(e.writer.writer.metadata, self.names)) for e in entries],
            "partition_rows": [json.dumps(self.kafka_rows if i == 0 else {}) for i in range(len(entries))],
        })


def staged_from_reports(location: TableLocation, target: str, written: list) -> tuple[list[StagedFile], dict[str, int]]:
    """The files the successful tasks reported (rows of :data:`WRITTEN_SCHEMA`) as staged files, and
    the rows per Kafka partition they hold. One listing of ``target`` checks that the store has
    every reported file (no footer is read again)."""
    import json

    present = {info.path: info.size for info in location.list_files(target)}
    missing = sorted(row["path"] for row in written if present.get(row["path"]) != row["size"])
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} staged file(s) reported by Spark tasks are not readable under {target} "
            f"(e.g. {missing[0]}): the object store lost a write; nothing was committed"
        )
    files, rows = [], {}
    for row in written:
        relative = location.relative(row["path"])
        files.append(StagedFile(path=relative, size=row["size"], modification_time=row["mtime"],
                                num_records=row["rows"], stats=row["stats"],
                                partition_values=partition_values_of(relative)))
        for key, n in json.loads(row["partition_rows"]).items():
            rows[key] = rows.get(key, 0) + n
    return sorted(files, key=lambda f: f.path), rows


def stage_with_arrow(df, location: TableLocation, target: str, storage_options: dict | None,
                     arrow_schema: pa.Schema, partition_by: tuple[str, ...] = (),
                     names: ColumnNames | None = None) -> list[StagedFile]:
    """Write ``df`` as Parquet files under ``target`` from the executors; return them staged.

    ``arrow_schema`` is the table's Arrow schema (microsecond UTC timestamps), so the
    files match the Delta schema the commit declares.
    """
    from airflow_eo.driver.session import for_session

    with for_session(df):  # only the plan is built under the mark; running it needs none
        plan = df.mapInArrow(task_writer(location.uri, storage_options, target, arrow_schema, partition_by, names),
                             written_struct())
    return staged_from_reports(location, target, plan.collect())[0]


def stage(df, location: TableLocation, target: str, storage_options: dict | None,
          arrow_schema: pa.Schema, partition_by: tuple[str, ...] = (), names: ColumnNames | None = None) -> list[StagedFile]:
    """Write ``df`` under ``target`` (the attempt's directory) and return the staged files:
    Spark's Parquet writer for local tables, the executors' pyarrow writer for object stores
    (Spark here has no ``hadoop-aws`` jar to write ``s3a://``). A partitioned table's files go
    into Hive-style directories of their partition values (:mod:`airflow_eo.table.partitioning`).
    ``names``: the table's column mapping: the files get physical column names and field ids."""
    names = names or ColumnNames()
    if is_local(location.uri):
        if names.active:
            df = to_physical(df, names)
            partition_by = tuple(names.physical(c) for c in partition_by)
        writer = df.write.mode("error")
        (writer.partitionBy(*partition_by) if partition_by else writer).parquet(f"file://{target}")
        return StagingArea(location).staged_files(target, names=names)
    return stage_with_arrow(df, location, target, storage_options, arrow_schema, partition_by, names)


def to_physical(df, names: ColumnNames):
    """``df`` (the table's logical columns) as column mapping stores it: each column, nested ones too,
    under its physical name with its id as Spark's ``parquet.field.id`` metadata, which Spark's
    Parquet writer writes as the Parquet field id (``spark.sql.parquet.fieldId.write.enabled``, on
    by default). Nested fields are renamed by a cast to the physical type (Spark casts structs by
    position)."""
    from airflow_eo.driver.decode import functions_for

    with functions_for(df) as F:
        columns = []
        for f in df.schema.fields:
            mapped = names.field(f.name)
            if mapped is None:
                columns.append(F.col(f"`{f.name}`"))
                continue
            meta = {SPARK_FIELD_ID: mapped.id} if mapped.id is not None else {}
            columns.append(F.col(f"`{f.name}`").cast(_physical_spark_type(f.dataType, mapped))
                           .alias(mapped.physical, metadata=meta))
        return df.select(*columns)


def _physical_spark_type(kind, mapped):
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(kind, StructType):
        fields = []
        for f in kind.fields:
            child = mapped.child(f.name)
            if child is None:
                fields.append(f)
                continue
            meta = {SPARK_FIELD_ID: child.id} if child.id is not None else {}
            fields.append(StructField(child.physical, _physical_spark_type(f.dataType, child), f.nullable, meta))
        return StructType(fields)
    if isinstance(kind, ArrayType) and mapped.child("element") is not None:
        return ArrayType(_physical_spark_type(kind.elementType, mapped.child("element")), kind.containsNull)
    if isinstance(kind, MapType) and mapped.child("key") is not None:
        return MapType(_physical_spark_type(kind.keyType, mapped.child("key")),
                       _physical_spark_type(kind.valueType, mapped.child("value")), kind.valueContainsNull)
    return kind
