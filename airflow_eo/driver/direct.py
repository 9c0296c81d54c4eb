"""The direct path: Spark tasks that read their Kafka slices and write the Parquet themselves.

For a transform Spark does not need to see — none (the identity) or a projection of the Kafka
columns (``SELECT topic, partition, offset, value FROM source``) — the records would only
cross from the Python worker into the JVM as Arrow, become Spark rows and be encoded to
Parquet there. On this path each read task (:func:`airflow_eo.driver.source.read_tasks`)
streams its reader's Arrow batches into the tasks' pyarrow writer
(:func:`airflow_eo.driver.writer.task_writer`, the one object stores use) and returns one row
per file: path, size, rows, Delta stats and rows per Kafka partition. No record crosses into
the JVM and the driver reads no file back. Measured on 1M records (docs/performance.md): the
server's CPU per batch halves.

**A small direct batch is read by the driver itself** (:attr:`DirectStage.in_driver`): at most
``driver_read_max_offsets`` offsets (default 100,000: what Spark would read in one task anyway,
:data:`airflow_eo.driver.source.MIN_OFFSETS_PER_TASK`) run the same task function — the same
consumer, the same pyarrow writer, the same file names (``part-<task>-<uuid>.parquet``), stats and
reports — in the driver's process, one task after another, instead of as a Spark job. No job is
scheduled and no Python worker takes a turn; a spark-submit driver then starts no SparkContext at
all (:func:`airflow_eo.driver.main.main`) and a Spark Connect client runs no job on its server (it
still attaches, so a server that is down or refuses the client's token fails the batch as any other). The
plan, its log, the compare-and-set commit and the verification are unchanged: only where step 3-4's
one task runs differs. 0 turns it off.

Everything else takes Spark's path in :mod:`airflow_eo.driver.main`: a SQL statement that is
not a bare column list, a callable, decoding, dedup, a merge by key, and interval batches whose columns leave
out ``timestamp`` (their late records are counted from the source rows). The files are the
same either way: the Delta schema is the Kafka columns' Arrow schema Spark's own conversion
gives (pinned by ``tests/unit/test_compat.py``), timestamps microseconds in UTC.

Example::

    >>> projected_columns(Transform(sql="SELECT topic, partition, offset, value FROM source"))
    ('topic', 'partition', 'offset', 'value')
    >>> projected_columns(Transform(sql="SELECT topic, partition, offset, upper(value) AS v FROM source")) is None
    True
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from airflow_eo.attempt import TIMESTAMP_COLUMN, Attempt, AttemptKind
from airflow_eo.spec import KEY_COLUMNS, IngestSpec, Transform
from airflow_eo.driver.reader import KAFKA_SCHEMA
from airflow_eo.driver.source import read_tasks, task_frame, task_reader
from airflow_eo.sinks import sink_of
from airflow_eo.driver.writer import TaskFiles, staged_from_reports, task_writer, written_struct
from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.files import StagedFile, TableFile
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation

_SELECT = re.compile(r"\s*select\s+(?P<columns>.+?)\s+from\s+`?source`?\s*;?\s*", re.IGNORECASE | re.DOTALL)
_COLUMN = re.compile(r"`?(?P<name>[A-Za-z_][A-Za-z0-9_]*)`?")

log = logging.getLogger(__name__)


def projected_columns(transform: Transform) -> tuple[str, ...] | None:
    """The Kafka columns ``transform`` keeps, in order, when it is the identity, ``SELECT *``
    or a bare list of Kafka column names (spelled as the source spells them) over ``source``;
    None for anything else (expressions, aliases, filters, comments, a callable)."""
    if transform.callable:
        return None
    if not transform.sql:
        return tuple(KAFKA_SCHEMA.names)
    statement = _SELECT.fullmatch(transform.sql)
    if statement is None:
        return None
    names = []
    for item in statement.group("columns").split(","):
        if item.strip() == "*":
            names.extend(KAFKA_SCHEMA.names)
            continue
        column = _COLUMN.fullmatch(item.strip())
        if column is None or column.group("name") not in KAFKA_SCHEMA.names:
            return None
        names.append(column.group("name"))
    return tuple(names) if len(set(names)) == len(names) else None


def direct_columns(spec: IngestSpec) -> tuple[str, ...] | None:
    """The Kafka columns a batch of ``spec`` stages on the direct path, or None when its rows need
    Spark (see the module); an interval batch also needs ``timestamp`` (:meth:`DirectStage.of`)."""
    # decoding, a filter, or a write mode that needs Spark
    if spec.decode.enabled or spec.transform.filter or not sink_of(spec.sink).direct:
        return None
    columns = projected_columns(spec.transform)
    if columns is None or not set(KEY_COLUMNS) <= set(columns) or not set(spec.table.partition_by) <= set(columns):
        return None  # Spark's path reports the missing columns
    return columns


@dataclass(frozen=True)
class DirectStage:
    """Read, project and stage in the read tasks: the attempt's columns and their Arrow schema, and
    whether the driver runs the one task itself."""

    columns: tuple[str, ...]
    in_driver: bool = False

    @classmethod
    def of(cls, attempt: Attempt, features: TableFeatures | None = None) -> "DirectStage | None":
        """The direct path for ``attempt``, or None when its rows need Spark (see the module): also when the
        table has rules for new rows (``features``: constraints, generated columns), which are Spark SQL
        and so are checked on the Spark path (:mod:`airflow_eo.driver.constraints`), or column mapping
        (the Spark path writes the physical names: :func:`airflow_eo.driver.writer.to_physical`)."""
        columns = direct_columns(attempt.spec)
        if columns is None or (features is not None and (features.enforced or features.names.active)):
            return None
        if attempt.plan.interval is not None and attempt.kind is AttemptKind.INGEST and TIMESTAMP_COLUMN not in columns:
            return None
        limit = attempt.spark.driver_read_max_offsets  # 0: off
        return cls(columns, in_driver=limit > 0 and sum(r.size for r in attempt.plan.data_ranges) <= limit)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([KAFKA_SCHEMA.field(c) for c in self.columns])


def read_and_stage(spark, ranges, kafka_config: dict, max_offsets_per_task: int, location: TableLocation,
                   target: str, storage_options: dict | None = None, columns: tuple[str, ...] = tuple(KAFKA_SCHEMA.names),
                   partition_by: tuple[str, ...] = ()) -> tuple[list[StagedFile], dict[str, int]]:
    """Read ``ranges`` and write their ``columns`` as Parquet under ``target`` in the same Spark
    tasks — or, with ``spark`` None, the same tasks one after another in this process; the staged
    files and the rows per Kafka partition (no ledger, no commit: the benchmark's at-least-once
    side calls this too)."""
    tasks = read_tasks(ranges, max_offsets_per_task)
    read = task_reader(tasks, dict(kafka_config))
    schema = pa.schema([KAFKA_SCHEMA.field(c) for c in columns])
    write = task_writer(location.uri, storage_options, target, schema, partition_by)
    selected = None if tuple(columns) == tuple(KAFKA_SCHEMA.names) else list(columns)

    def read_and_write(batches, task: int | None = None):
        records = read(batches)
        yield from write(records if selected is None else (b.select(selected) for b in records), task)

    if spark is None:  # the driver runs the tasks: task i gets the row Spark would give it
        written = [row for i in range(len(tasks))
                   for report in read_and_write(iter([pa.RecordBatch.from_arrays([pa.array([i], pa.int64())], ["id"])]), i)
                   for row in report.to_pylist()]
        return staged_from_reports(location, target, written)
    from airflow_eo.driver.session import for_session

    with for_session(spark):
        frame = task_frame(spark, tasks).mapInArrow(read_and_write, written_struct())
    return staged_from_reports(location, target, frame.collect())

# the column a fan-out's read tasks report their files in
REPORT_COLUMN = "__airflow_eo_report"


@dataclass(frozen=True)
class Destination:
    """One table's share of a fan-out's read that the read tasks write themselves: its planned ranges
    and the Kafka columns it keeps, staged under ``target``."""

    table_uri: str
    target: str
    columns: tuple[str, ...]
    partition_by: tuple[str, ...]
    ranges: tuple[OffsetRange, ...]


def one_partition(batch: pa.RecordBatch) -> tuple[str, int] | None:
    """The topic and partition of ``batch`` when every record of it is of one (a reader's batch is), else None.

    >>> one_partition(pa.RecordBatch.from_pydict({"topic": ["t", "t"], "partition": [3, 3]}))
    ('t', 3)
    >>> one_partition(pa.RecordBatch.from_pydict({"topic": ["t", "t"], "partition": [3, 4]})) is None
    True
    """
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return None
    topics, partitions = batch.column("topic"), batch.column("partition")
    first = (topics[0].as_py(), partitions[0].as_py())
    if pc.all(pc.equal(topics, first[0])).as_py() and pc.all(pc.equal(partitions, first[1])).as_py():
        return first
    return None


def share_of(batch: pa.RecordBatch, spans: dict[tuple[str, int], tuple[int, int]],
             key: tuple[str, int] | None = None) -> pa.RecordBatch | None:
    """The records of ``batch`` within ``spans`` (per topic and partition: start, end); None if none.
    ``key``: the batch's one topic and partition (:func:`one_partition`), None when it has several.

    >>> batch = pa.RecordBatch.from_pydict({"topic": ["t"] * 4, "partition": [0] * 4, "offset": [4, 5, 6, 7]})
    >>> share_of(batch, {("t", 0): (5, 7)}, ("t", 0)).column("offset").to_pylist()
    [5, 6]
    >>> share_of(batch, {("t", 0): (5, 7)}).column("offset").to_pylist()
    [5, 6]
    >>> share_of(batch, {("t", 1): (0, 9)}, ("t", 0)) is None
    True
    """
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return None
    topics, partitions, offsets = batch.column("topic"), batch.column("partition"), batch.column("offset")
    if key is not None:  # a reader batch holds one partition's records: the usual case
        span = spans.get(key)
        if span is None:
            return None
        low, high = pc.min_max(offsets).values()
        if span[0] <= low.as_py() and high.as_py() < span[1]:
            return batch
        keep = pc.and_(pc.greater_equal(offsets, span[0]), pc.less(offsets, span[1]))
    else:
        keep = pa.array([False] * batch.num_rows)
        for (topic, partition), (start, end) in spans.items():
            keep = pc.or_(keep, pc.and_(pc.and_(pc.equal(topics, topic), pc.equal(partitions, partition)),
                                        pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end))))
    share = batch.filter(keep)
    return share if share.num_rows else None


class Shares:
    """Which destinations of a read take a batch of its records, and each one's share. Only the
    destinations that read the batch's partition are asked: a routed read into 200 tables asked every
    table of every batch, 10 s of CPU for 400,000 records. ``spans``: each destination's (topic,
    partition) → (start, end); ``whole``: whether it takes the whole read (then every record as it is)."""

    def __init__(self, spans: list[dict[tuple[str, int], tuple[int, int]]], whole: list[bool]):
        self.spans, self.whole = spans, whole
        self.takers: dict[tuple[str, int], list[int]] = {}
        for i, span in enumerate(spans):
            for key in span:
                self.takers.setdefault(key, []).append(i)

    def of(self, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Each destination's index and share of ``batch``, in the destinations' order."""
        key = one_partition(batch)
        for i in range(len(self.spans)) if key is None else self.takers.get(key, ()):
            share = batch if self.whole[i] else share_of(batch, self.spans[i], key)
            if share is not None and share.num_rows:
                yield i, share


def read_for_tables(spark, ranges, kafka_config: dict, max_offsets_per_task: int, storage_options: dict | None,
                    destinations: list[Destination]) -> list[list[dict]]:
    """One read of ``ranges`` for the tables of ``destinations``: each read task writes every destination's
    share of the records it read (:class:`Destination`) as that table's staged files and reports them.
    Returns each destination's report rows. A table whose rows need Spark reads a destination's files
    (:func:`feed_for`), not the read. With ``spark`` None the tasks run here,
    one after another."""
    import json

    tasks = read_tasks(ranges, max_offsets_per_task)
    read = task_reader(tasks, dict(kafka_config))
    out_schema = pa.schema([pa.field(REPORT_COLUMN, pa.string())])
    schemas = [pa.schema([KAFKA_SCHEMA.field(c) for c in d.columns]) for d in destinations]
    shares = Shares([{(r.topic, r.partition): (r.start, r.end) for r in d.ranges} for d in destinations],
                    [tuple(d.ranges) == tuple(r for r in ranges if r.size) for d in destinations])
    # each destination's columns, decided once rather than for every batch: None keeps every Kafka column
    selected = [None if d.columns == tuple(KAFKA_SCHEMA.names) else list(d.columns) for d in destinations]

    def read_and_write(batches, task: int | None = None):
        files = [TaskFiles(d.table_uri, storage_options, d.target, schema, d.partition_by, task=task)
                 for d, schema in zip(destinations, schemas)]
        try:
            for records in read(batches):
                for i, share in shares.of(records):
                    files[i].add(share if selected[i] is None else share.select(selected[i]))
        finally:
            for table_files in files:
                table_files.close()
        for i, table_files in enumerate(files):
            report = table_files.report()
            if report is not None:
                rows = [json.dumps({**row, "destination": i}) for row in report.to_pylist()]
                yield pa.RecordBatch.from_arrays([pa.array(rows, pa.string())], schema=out_schema)

    if spark is None:  # the driver runs the tasks: task i gets the row Spark would give it
        rows = [(row[REPORT_COLUMN],) for i in range(len(tasks))
                for out in read_and_write(iter([pa.RecordBatch.from_arrays([pa.array([i], pa.int64())], ["id"])]), i)
                for row in out.to_pylist()]
        return reports_by_destination(rows, len(destinations))

    from airflow_eo.compat import spark_schema_of
    from airflow_eo.driver.session import for_session

    with for_session(spark):
        frame = task_frame(spark, tasks).mapInArrow(read_and_write, spark_schema_of(out_schema))
    return reports_by_destination(frame.collect(), len(destinations))


def feed_for(through_spark: list[Attempt], ranges: tuple[OffsetRange, ...], destinations: list[Destination],
             staging: StagingArea | None, undecoded: bool) -> Destination | None:
    """Where the tables whose rows need Spark read the batch's records when the read is shared: the read
    tasks' staged files of a table that keeps every Kafka column of the whole read unpartitioned (a raw
    append), else a copy the read tasks stage beside the first such table's attempt
    (:meth:`StagingArea.feed_path`). Spark reads Parquet faster than it caches the read's rows, and
    reading it runs in the JVM. None: no table needs Spark, a single one reads Kafka in its own job, or
    the records are decoded (their columns are the decoder's: the read is cached then)."""
    if not through_spark or not undecoded or staging is None or (not destinations and len(through_spark) == 1):
        return None
    whole = tuple(r for r in ranges if r.size)
    for destination in destinations:
        if destination.columns == tuple(KAFKA_SCHEMA.names) and not destination.partition_by \
                and tuple(destination.ranges) == whole:
            return destination
    first = through_spark[0]
    return Destination(first.table_uri, staging.feed_path(first.plan), tuple(KAFKA_SCHEMA.names), (), whole)


def feed_frame(spark, feed: Destination, files: list[StagedFile], storage_options: dict | None):
    """The records :func:`feed_for` staged, as a DataFrame of the Kafka columns (Spark's Parquet reader
    for a local table, read tasks otherwise: :func:`airflow_eo.driver.scan.read_table_files`)."""
    from airflow_eo.compat import spark_schema_of
    from airflow_eo.driver.scan import TableFiles, read_table_files
    from airflow_eo.driver.session import for_session

    frame = read_table_files(spark, TableFiles(feed.table_uri, tuple(TableFile(f.path, f.size) for f in files),
                                               storage_options), KAFKA_SCHEMA)
    if frame is None:  # nothing was read
        with for_session(spark):
            frame = spark.createDataFrame([], spark_schema_of(KAFKA_SCHEMA))
    return frame


def remove_feed(feed: Destination, storage_options: dict | None) -> None:
    """Remove the copy :func:`feed_for` staged (best effort: orphan collection removes what is left)."""
    location = TableLocation.of(feed.table_uri, storage_options)
    try:
        location.fs.delete_dir(feed.target)
    except OSError as exc:  # gone already, or not removable now
        log.info("left the staged copy of the read at %s for the next run's tidying: %s", feed.target, exc)


def reports_by_destination(rows: list, destinations: int) -> list[list[dict]]:
    """The report rows :func:`read_for_tables` collected, per destination."""
    import json

    out: list[list[dict]] = [[] for _ in range(destinations)]
    for row in rows:
        report = json.loads(row[0])
        out[report.pop("destination")].append(report)
    return out


def warm_up(spark, tasks: int, rounds: int = 3) -> None:
    """Run what a direct batch's read tasks run, without Kafka, ``rounds`` times on ``tasks`` tasks at
    once: the session's Python workers forked with everything a read task loads (the reader's record
    path over synthetic messages, :func:`airflow_eo.driver.reader.rehearse`; pyarrow's conversions,
    which import pandas; the Parquet writer and its footer stats), the JVM's code for these jobs
    compiled. Each task writes into a scratch directory of its own on its executor and removes it,
    so nothing is left on a cluster's hosts either. What a Spark Connect server runs before it says
    it is ready (:mod:`airflow_eo.submit.connect_server`), so its first batch runs as fast as the
    later ones."""
    from airflow_eo.driver.session import for_session

    def rehearse_task(batches):
        import shutil
        import tempfile

        from airflow_eo.driver.reader import rehearse

        for batch in batches:
            for _ in batch.column(0).to_pylist():
                scratch = tempfile.mkdtemp(prefix="airflow-eo-warm-up-")
                try:
                    yield from task_writer(scratch, None, f"{scratch}/staged", KAFKA_SCHEMA)(rehearse())
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)

    for _ in range(rounds):
        with for_session(spark):
            written = task_frame(spark, [()] * tasks).mapInArrow(rehearse_task, written_struct())
        written.collect()
