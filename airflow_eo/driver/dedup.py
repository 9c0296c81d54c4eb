"""Dropping records whose producer-supplied dedup key was already ingested (``dedup_key``).

An at-least-once producer resends an event at a new offset; the table is keyed by
(topic, partition, offset), so both copies would land. With ``dedup_key`` (a Spark SQL
expression over the source columns ``topic, partition, offset, timestamp, timestampType,
key, value, headers``, plus ``data`` when values are decoded) a record is not written when
its key is already in the table, or appears earlier in the same batch: the first occurrence
wins, ordered by offset, then partition, then topic. A null key is never a duplicate.

Each kept row carries its key in :data:`DEDUP_COLUMN` (a string; a binary key such as
``key`` is stored base64-encoded: bytes need not be valid UTF-8, and base64 keeps them apart),
which is how the next batch finds it "already in the table". ``headers['event-id']``
reads the value of the *last* header of that name (as Kafka's ``Headers.lastHeader``;
null when absent): ``headers`` is an array of ``struct(key, value)``, so it is rewritten
before Spark parses the expression. Its value is bytes (stored base64);
``CAST(headers['event-id'] AS STRING)`` stores it as text. Offsets advance past dropped
records anyway; that and sending them to the dead-letter table is the caller's job.

One pass, no cache: the batch is shuffled once by key and ranked, its first copies anti-joined
with the stored keys; :meth:`Deduplicated.dropped` reads the count from the write's observed
metrics (or counts again when there are none). The stored keys are read from the table's files
within the horizon (:func:`key_files`): by Spark's Parquet reader for a local table, in Spark
tasks through the table's own filesystem and storage options for any other (``s3://`` needs no
hadoop-aws jar; :mod:`airflow_eo.driver.scan`).

Example::

    >>> out = drop_duplicates(source, "headers['event-id']", stored)         # doctest: +SKIP
    >>> out.kept.write.parquet(target)                                       # doctest: +SKIP
    >>> out.kept.columns[-1], out.dropped()                                  # doctest: +SKIP
    ('_dedup_key', 2)
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from functools import cached_property

from airflow_eo.attempt import TIMESTAMP_COLUMN, Attempt, AttemptKind
from airflow_eo.spec import KEY_COLUMNS, DedupSpec
from airflow_eo.compat import observation_pending
from airflow_eo.spec.columns import REASON_COLUMN
from airflow_eo.driver.append import SparkStage
from airflow_eo.driver.decode import functions_for
from airflow_eo.driver.scan import TableFiles, read_table_files
from airflow_eo.driver.transforms import join_by_offset
from airflow_eo.core.errors import ConfigError
from airflow_eo.core.intervals import parse_duration
from airflow_eo.core.planning import BatchPlan, read_slices
from airflow_eo.table.files import TableFile, snapshot_files
from airflow_eo.table.ledger import Ledger, batch_of_path
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

DEDUP_COLUMN = "_dedup_key"
# Observed metrics reach the driver through the listener bus just after the write returns
# (seen: not yet there right after it); without them the duplicates are counted again.
OBSERVED_WAIT = 2.0
REASON = "duplicate key"
ORDER = ("offset", "partition", "topic")  # which copy of a key survives within a batch
_FIRST = "_airflow_eo_first"

# A quoted string or identifier (copied as is, so a literal that spells headers['x'] is not
# rewritten), or headers['name'] outside quotes (not a field such as s.headers['x']).
_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`"
_TOKENS = re.compile(rf"({_QUOTED})|(?<![\w.`])headers\s*\[\s*('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\s*\]",
                     re.IGNORECASE)


@dataclass(frozen=True)
class Deduplicated:
    """The batch split by its dedup key: ``kept`` (the source columns and :data:`DEDUP_COLUMN`)
    and :attr:`duplicates`; plans over one ranked plan, computed by whichever action runs first
    (no cache)."""

    kept: object  # DataFrame, observed when ``observed``
    ranked: object  # DataFrame: the batch with :data:`_FIRST` (not observed)
    known: object  # DataFrame of the stored keys, or None
    columns: tuple
    observed: tuple = ()  # Observations of the write: (ranked records, kept records)

    @cached_property
    def unobserved(self):
        """``kept`` without the observations, for a second plan over the batch (a join-back, a
        count): a plan may hold each observation once (Spark Connect), and the shuffle is shared."""
        return _first_copies(self.ranked, self.known, self.columns)

    @cached_property
    def keys(self):
        """The kept records' key columns and :data:`DEDUP_COLUMN`, for a join-back."""
        return self.unobserved.select(*KEY_COLUMNS, DEDUP_COLUMN)

    @cached_property
    def duplicates(self):
        """The dropped records: the source columns, :data:`DEDUP_COLUMN` and their dead-letter reason
        ``'duplicate key'`` in :data:`~airflow_eo.spec.columns.REASON_COLUMN` (built when asked
        for: the write of ``kept`` does not need it)."""
        with functions_for(self.ranked) as F:
            dropped = self.ranked.where(~F.col(_FIRST))
            if self.known is not None:  # a semi join: a key stored twice matches once
                stored = self.ranked.where(F.col(_FIRST)).join(self.known, on=DEDUP_COLUMN, how="left_semi")
                dropped = dropped.unionByName(stored)
            return dropped.select(*self.columns, F.lit(REASON).alias(REASON_COLUMN))

    def dropped(self, read_at_most: int | None = None) -> int:
        """Records dropped as duplicates, once the batch's write has run.

        Spark's observed metrics of that write (ranked - kept), counted after the shuffle by
        key, i.e. in the stage that writes the batch unless the transform shuffles again.
        Without them (no action ran over ``kept``), or when they cannot be right (more records
        than the plan's ``read_at_most`` offsets: a Spark stage retry counted twice, SPARK-58183),
        the duplicates are counted again, exactly, by one more pass.
        """
        if self.observed:
            ranked, kept = (observed_metrics(o).get("records") for o in self.observed)
            if ranked is not None and kept is not None and kept <= ranked <= (read_at_most or ranked):
                return int(ranked - kept)
        return self.duplicates.count()


def _first_copies(ranked, known, columns: tuple):
    """The records of ``ranked`` that are first in the batch and whose key is not in ``known``."""
    with functions_for(ranked) as F:
        kept = ranked.where(F.col(_FIRST))
        if known is not None:  # an anti join: a key stored twice matches once
            kept = kept.join(known, on=DEDUP_COLUMN, how="left_anti")
        return kept.select(*columns)


def observed_metrics(observation) -> dict:
    """An Observation's metrics, or {} when none arrived within :data:`OBSERVED_WAIT` seconds."""
    try:
        if observation_pending(observation, OBSERVED_WAIT):  # classic: .get would wait for an action that never ran
            return {}
        return dict(observation.get or {})
    except Exception:  # no metrics is an answer here: the caller recounts
        return {}


def header_expression(expr: str) -> str:
    """``expr`` with each ``headers['name']`` turned into the value of the last header of that name."""

    def rewrite(m: re.Match) -> str:
        if m.group(1) is not None:
            return m.group(1)
        # try_element_at: null, not an error under ANSI mode, when no header has the name.
        return f"try_element_at(filter(headers, h -> h.key = {m.group(2)}), -1).value"

    return _TOKENS.sub(rewrite, expr)


def check_dedup_expression(spark, expr: str, schema=None) -> None:
    """Raise :class:`ConfigError` (one line) unless ``expr`` is one Spark SQL value over the
    source columns (``schema``: a ``StructType``, by default the Kafka source's)."""
    if schema is None:
        from airflow_eo.driver.reader import spark_kafka_struct

        schema = spark_kafka_struct()
    with functions_for(spark):
        empty = spark.createDataFrame([], schema)
    _with_key(empty, expr)


def _with_key(df, expr: str):
    """``df`` with :data:`DEDUP_COLUMN`; the expression is analysed here, not at the first action."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(f"dedup_key {expr!r} is empty; give a Spark SQL expression over the source "
                          "columns, e.g. CAST(key AS STRING) or headers['event-id']; nothing was committed")
    with functions_for(df) as F:
        try:
            value = F.expr(header_expression(expr))
            fields = df.select(value).schema.fields  # .schema: Spark Connect analyses lazily
            if len(fields) != 1:
                raise ValueError(f"it gives {len(fields)} columns, not one")
            # base64: bytes need not be UTF-8; as base64 every key stays distinct, valid text.
            key = F.base64(value) if fields[0].dataType.typeName() == "binary" else value.cast("string")
            # withColumn, not select: an aggregate (no GROUP BY) and a generator (nested in the
            # cast, so it cannot add rows) fail analysis here instead of changing the batch.
            out = df.withColumn(DEDUP_COLUMN, key)
            _ = out.schema  # analysed here, not at the write
        except Exception as exc:  # ParseException, AnalysisException: the user's expression
            what = "does not parse" if "Parse" in type(exc).__name__ else "cannot be evaluated over the source columns"
            raise ConfigError(
                f"dedup_key {expr!r} {what}: {_first_line(exc)}; fix the expression (one Spark SQL "
                "expression over topic, partition, offset, timestamp, timestampType, key, value, headers "
                "and data when decoded, e.g. CAST(key AS STRING) or headers['event-id']); nothing was committed"
            ) from exc
    return out


def table_keys(spark, table_files: TableFiles | None, horizon_ms: int | None = None, exclude=()):
    """The non-null keys of ``table_files`` (not made distinct: the anti and semi joins that
    read them match a key once however often it is stored), or None when there are no files.

    The columns are given, not inferred: a file written before dedup was turned on (no
    :data:`DEDUP_COLUMN`) reads as nulls, i.e. holds no keys, and no job reads the footers.
    A local table's files are read by Spark's Parquet reader, any other table's in Spark tasks
    through its own filesystem (:func:`airflow_eo.driver.scan.read_table_files`).
    With ``horizon_ms`` (epoch milliseconds), rows whose ``timestamp`` is before it are
    ignored; rows without one (no such column, or null) still count, so this only narrows
    what the caller's file pruning left. A table whose ``timestamp`` column is not a
    timestamp (a transform replaced it) cannot be read with a horizon: the read fails.
    """
    import pyarrow as pa

    columns = [pa.field(DEDUP_COLUMN, pa.string())]
    if horizon_ms is not None:
        columns.append(pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC")))
    if exclude:  # a reprocess: the batch's own rows are not "already in the table"
        columns += [pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64())]
    rows = read_table_files(spark, table_files, pa.schema(columns))
    if rows is None:
        return None
    with functions_for(spark) as F:
        present = F.col(DEDUP_COLUMN).isNotNull()
        for r in exclude:
            present = present & ~((F.col("topic") == r.topic) & (F.col("partition") == r.partition)
                                  & (F.col("offset") >= r.start) & (F.col("offset") < r.end))
        if horizon_ms is not None:
            ts = F.col(TIMESTAMP_COLUMN)
            present = present & (ts.isNull() | (ts >= F.timestamp_millis(F.lit(int(horizon_ms)))))
        return rows.where(present).select(DEDUP_COLUMN)


def drop_duplicates(source, expr: str, table_files: TableFiles | None, horizon_ms: int | None = None, exclude=(),
                    partitions: int | None = None, observe: bool = True) -> Deduplicated:
    """Split the batch ``source`` by the dedup key ``expr`` against the keys in ``table_files``.

    ``table_files``: the data files of the table's snapshot, pruned by the caller to the
    horizon; None (or no files) for a new table. ``partitions``: how many tasks rank the
    batch's keys (default: Spark's shuffle partitions). One pass over ``source``: the batch is
    shuffled once by key and ranked, then its first copies are anti-joined with the stored
    keys (a broadcast when Spark finds them small); kept + duplicates = the batch's rows.
    ``observe``: count the duplicates from Spark's observed metrics of the write (False: by
    one more pass, e.g. when ``source`` is cached anyway).
    """
    keyed = _with_key(source, expr)
    columns = tuple(keyed.columns)
    known = table_keys(source.sparkSession, table_files, horizon_ms, exclude)
    with functions_for(keyed) as F:
        from pyspark.sql import Observation, Window

        key = F.col(DEDUP_COLUMN)
        # A null key is never a duplicate: each such record is a group of its own, so keyless
        # records spread over the tasks instead of filling one.
        alone = F.when(key.isNull(), F.struct(*[F.col(c) for c in KEY_COLUMNS]))
        if partitions:  # the window's clustering: no second shuffle
            keyed = keyed.repartition(partitions, key, alone)
        order = Window.partitionBy(key, alone).orderBy(*[F.col(c).asc() for c in ORDER])
        ranked = keyed.withColumn(_FIRST, F.row_number().over(order) == 1)
        if not observe:
            return Deduplicated(kept=_first_copies(ranked, known, columns), ranked=ranked, known=known,
                                columns=columns)
        count = F.count(F.lit(1)).alias("records")
        tag = uuid.uuid4().hex[:12]  # observation names: unique in a shared (warm) session
        observed = tuple(Observation(f"airflow_eo_dedup_{what}_{tag}") for what in ("ranked", "kept"))
        # after the shuffle by key: counted by the tasks that write the batch
        kept = _first_copies(ranked.observe(observed[0], count), known, columns).observe(observed[1], count)
        return Deduplicated(kept=kept, ranked=ranked, known=known, columns=columns, observed=observed)


def key_files(location: TableLocation, storage_options, spec: DedupSpec, plan: BatchPlan,
              now_ms: int) -> tuple[list[TableFile], int | None, dict[str, str]]:
    """The table's data files that may hold keys within ``spec``'s horizon, and the horizon as
    epoch ms for a duration. ``"<n> batches"`` keeps the files of the last n batches' attempt
    directories (and every file outside them: a compaction mixes batches); a duration keeps the
    files whose ``timestamp`` statistics reach it (or that have none); and the table's column mapping
    (logical → physical names: the files are read by them)."""
    ledger = Ledger.open(location.uri, storage_options)
    if ledger.table is None:
        return [], None, {}
    actions = ledger.add_actions()
    newest = actions["max.timestamp"].to_pylist() if "max.timestamp" in actions.column_names else None
    batches = spec.horizon_batches()
    horizon_ms = None if batches or not spec.horizon else now_ms - int(parse_duration(spec.horizon) * 1000)
    kept = []
    for i, file in enumerate(snapshot_files(actions, ledger.deleted_rows())):  # rows deleted since: not stored
        batch = batch_of_path(file.path)
        if batches and batch is not None and batch < plan.batch - batches:
            continue
        if horizon_ms is not None and newest is not None and newest[i] is not None \
                and newest[i].timestamp() * 1000 < horizon_ms:
            continue
        kept.append(file)
    return kept, horizon_ms, ledger.features.names.as_dict()


def deduplicate(source, attempt: Attempt, location: TableLocation, storage_options, now_ms: int,
                observe: bool = True) -> Deduplicated:
    """The batch split by ``attempt.dedup`` against the table's keys within its horizon, ranked by
    as many tasks as read it, at most one per core (Spark's default of 200 shuffle partitions
    costs more than the ranking itself on a small batch)."""
    files, horizon_ms, names = key_files(location, storage_options, attempt.dedup, attempt.plan, now_ms)
    stored = TableFiles(location.uri, tuple(files), storage_options, names)
    own = attempt.plan.data_ranges if attempt.kind is AttemptKind.REPROCESS else ()
    tasks = len(read_slices(attempt.plan.data_ranges, attempt.spark.max_offsets_per_task))
    cores = _parallelism(source.sparkSession)
    return drop_duplicates(source, attempt.dedup.key, stored, horizon_ms, own,
                           partitions=max(1, min(tasks, cores or tasks)), observe=observe)


def _parallelism(spark) -> int | None:
    """The application's cores (Spark's default parallelism), None where the client cannot tell."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # a Spark Connect client has no SparkContext
        return None


def with_key_column(out, dups: Deduplicated):
    """The transform's output with :data:`DEDUP_COLUMN`, joined back by source offset when the
    transform did not keep it (one more shuffle: keep the column to avoid it): the next batches
    find this batch's keys in the table."""
    if DEDUP_COLUMN in out.columns:
        return out
    log.info("the transform leaves out %s, so it is joined back by offset (one more shuffle; select it "
             "in the transform to save that)", DEDUP_COLUMN)
    return join_by_offset(out, dups.keys, (DEDUP_COLUMN,))


def _first_line(exc: Exception) -> str:
    # Spark's first line may end in ';' before the plan it leaves out: the message adds its own.
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0].rstrip("; ")


class DedupStage(SparkStage):
    """The dedup sink's Spark step (:mod:`airflow_eo.sinks.dedup`): records whose producer key is in the
    table or earlier in the batch dropped before the transform (or sent to the dead letters), the key
    column kept in the table for the next batches."""

    dups: Deduplicated | None = None

    def source(self, source):
        # one pass, no cache; with dead letters their cached rows are read twice anyway,
        # so the duplicates are counted over them exactly instead of observed
        self.dups = deduplicate(source, self.attempt, self.staging.loc, self.storage_options, int(time.time() * 1000),
                                observe=self.dead is None)
        if self.attempt.dedup.to_dead_letters:
            assert self.dead is not None  # the spec asks for a dead-letter table with duplicates_to_dead_letters
            self.dead.add(self.dups.duplicates)
        return self.dups.kept

    def output(self, out):
        assert self.dups is not None
        return with_key_column(out, self.dups), None

    def late_inputs(self, arrow_schema, source):
        assert self.dups is not None
        return super().late_inputs(arrow_schema, self.dups.unobserved)

    def dropped(self, planned_offsets: int) -> int | None:
        assert self.dups is not None
        dropped = self.dups.dropped(planned_offsets)
        self.notes.append(f"{dropped} record(s) dropped as duplicates of key {self.attempt.dedup.key}")
        return dropped

