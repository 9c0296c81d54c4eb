"""Merging a batch by key (``write_mode="merge"``), the Spark side: from records to the files one commit swaps.

After the read and the decoding, a merge batch takes these steps in the driver (the commit is
:class:`airflow_eo.sinks.merge.MergeCommit`; this module's
:class:`MergeStage` is the merge sink's Spark step):

1. **the change view** (:func:`change_view`): tombstones (null values) went through the
   decoders untouched (in a merge a null value is a change, not an undecodable record:
   :attr:`airflow_eo.spec.columns.ColumnSpec.tombstones`); Debezium events are unwrapped (:mod:`.cdc`); each
   record gets its delete flag (``delete_when``, evaluated here, before the transform) and
   its Kafka timestamp for the order rule, in one column, ``_airflow_eo_change``;
2. the transform runs as for appends; it must produce the ``merge_key`` columns (for a
   delete too: it sees the record with its null value and derives the key from the Kafka
   key, or from ``before`` for Debezium). ``_airflow_eo_change`` goes through ``SELECT *``;
   a transform that leaves it out gets it joined back by offset (one more shuffle);
3. **winners** (:func:`winners`): one record per key by the order rule
   (:mod:`airflow_eo.driver.changes`), chosen by two aggregations in Spark, each combined before its shuffle;
4. **the table's side** (:func:`merge_into`): the changed keys are collected (keys only), the
   snapshot's files that may hold them are chosen by statistics and partition values
   (:func:`airflow_eo.table.merge.candidate_files`) and rewritten without those keys' rows
   inside Spark tasks, through the table's own filesystem (local, ``s3://`` alike, both
   Spark paths: :func:`airflow_eo.driver.scan.over_files`); the winners that upsert are staged as the batch's new files.

Example::

    >>> view = change_view(source, attempt, dead)                          # doctest: +SKIP
    >>> merged = merge_into(transformed, attempt, location, storage_options, target)  # doctest: +SKIP
    >>> merged.info.inserted, merged.info.updated, merged.info.deleted     # doctest: +SKIP
    (120, 30, 5)
"""

from __future__ import annotations

import io
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace

import pyarrow as pa

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.driver import cdc
from airflow_eo.driver.append import SparkStage
from airflow_eo.driver.changes import CHANGES_COLUMN, ORDER, TS_COLUMN
from airflow_eo.driver.decode import functions_for
from airflow_eo.driver.scan import over_files
from airflow_eo.driver.transforms import join_by_offset
from airflow_eo.core.errors import ConfigError, MergeKeyError
from airflow_eo.core.planning import read_slices
from airflow_eo.sinks.merge import FileSwap, MergeStaged
from airflow_eo.spec import CdcFormat
from airflow_eo.table.files import StagedFile, TableFile
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.merge import DELETE_COLUMN, Rewrite, candidate_files, rewrite_file, with_key_stats
from airflow_eo.table.features import TableUse
from airflow_eo.table.metadata import MergeInfo
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.staging import KEPT_SUFFIX
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

# what the transform's output needs beside its own columns: struct<delete, ts> of the record
CHANGE_COLUMN = "_airflow_eo_change"
INTERNAL = (CHANGE_COLUMN, DELETE_COLUMN, TS_COLUMN, CHANGES_COLUMN)
REWRITE_SCHEMA = "rewrite string"
_LAST = "_airflow_eo_last"  # a record as one struct, while its key's winner is chosen


@dataclass(frozen=True)
class MergedBatch:
    """What a merge attempt staged for its one commit: the winners' files, the table files it
    rewrites, the changed keys (the commit checks files added meanwhile against them) and the
    snapshot it chose candidates from."""

    files: tuple[StagedFile, ...]
    rewrites: tuple[Rewrite, ...]
    keys: pa.Table  # every changed key: the key columns and DELETE_COLUMN
    snapshot_files: frozenset[str]
    rows_per_partition: dict[str, int]
    info: MergeInfo
    engine: bool = False  # ``files`` are the winners, deletes too, for deltalake's MERGE (no rewrites)


# -- 1. the change view -----------------------------------------------------------------------------
def change_view(source, attempt: Attempt, dead=None):
    """The records as the transform sees them in a merge (module doc, step 1), with
    :data:`CHANGE_COLUMN` (the delete flag and the Kafka timestamp in ms); records that are no change
    events go to ``dead`` (dead letters)."""
    with functions_for(source) as F:
        source = source.withColumn(TS_COLUMN, F.unix_millis(F.col("timestamp")))  # before a row field replaces it
        if attempt.merge.cdc_format is CdcFormat.DEBEZIUM:
            source, not_events = cdc.unwrap(source)
            if dead is not None:
                dead.add(not_events)
        rule = attempt.merge.delete_rule
        try:
            flag = F.expr(rule)
            deletes = F.coalesce(flag.cast("boolean"), F.lit(False))
            checked = source.withColumn(CHANGE_COLUMN, F.struct(deletes.alias(DELETE_COLUMN), F.col(TS_COLUMN))) \
                .drop(TS_COLUMN)
            kind = source.select(flag).schema.fields[0].dataType.typeName()  # analysed here (Connect: lazily)
        except Exception as exc:  # ParseException, AnalysisException: the user's expression
            what = "does not parse" if "Parse" in type(exc).__name__ else "cannot be evaluated over the source columns"
            raise ConfigError(f"delete_when {rule!r} {what}: {_first_line(exc)}; write one Spark SQL condition over "
                              f"{', '.join(c for c in source.columns if c not in INTERNAL)}, e.g. value IS NULL; "
                              "nothing was committed") from exc
        if kind != "boolean":
            raise ConfigError(f"delete_when {rule!r} is a {kind}, not a condition: write a boolean, e.g. "
                              "value IS NULL or data.deleted = true; nothing was committed")
        return checked


# -- 2./3. the transform's output, and each key's winner ----------------------------------------------
def check_output(out, key: tuple[str, ...]) -> None:
    """The transform's output holds the merge key columns, of types a key can have."""
    missing = [c for c in key if c not in out.columns]
    if missing:
        raise ConfigError(f"the transform's output lacks the merge_key column(s) {missing} (it has "
                          f"{[c for c in out.columns if c not in INTERNAL]}): produce them, for deletes too (e.g. "
                          "CAST(key AS STRING) AS id); nothing was committed")
    for c in key:
        kind = out.schema[c].dataType.typeName()
        if kind in ("struct", "array", "map", "float", "double", "binary", "variant"):
            raise ConfigError(f"merge_key column {c!r} is a {kind}: a key must compare exactly (integers, strings, "
                              "dates, timestamps, decimals); cast it in the transform; nothing was committed")


def deletes(out):
    """The column that marks ``out``'s rows that delete their key (after :func:`with_change_columns`)."""
    with functions_for(out) as F:
        return F.col(f"{CHANGE_COLUMN}.{DELETE_COLUMN}")


def with_change_columns(out, view):
    """``out`` with :data:`CHANGE_COLUMN`, joined back by source offset when the transform left it
    out (one more shuffle; ``SELECT *`` or naming it keeps it). The view is then kept (persisted)
    so both sides of the join read Kafka once; the caller unpersists it."""
    if CHANGE_COLUMN in out.columns:
        return out
    log.info("the transform leaves out %s, so it is joined back by offset (one more shuffle; select it in the "
             "transform to save that)", CHANGE_COLUMN)
    from pyspark import StorageLevel

    view.persist(StorageLevel.MEMORY_AND_DISK)
    return join_by_offset(out, view, (CHANGE_COLUMN,))


def winners(out, key: tuple[str, ...], tasks: int):
    """One row per key of the batch (the order rule of :mod:`airflow_eo.driver.changes`), with
    :data:`CHANGES_COLUMN` (how many records of the batch the key had), in ``tasks`` tasks hashed by key.

    Two aggregations inside Spark's JVM, each combining in the read tasks before its shuffle: each key's
    last record (highest offset) per partition and its count, then among a key's partition lasts the
    greatest (timestamp, partition, offset, topic) and the counts' sum. A keyed producer sends a key to
    one partition, so about one row per key is shuffled, not every record; no record goes through a
    Python worker (an Arrow pass over the records each way cost more than the rest of the selection:
    on 1M records over 100,000 keys, 2.1 times the time of these aggregations). Rows whose key has a
    null column end as one row of that key, counting them: the caller refuses them.
    :func:`~airflow_eo.driver.changes.select_winners` is the rule's reference in Arrow (the tests)."""
    with functions_for(out) as F:  # the whole plan for ``out``'s kind of session
        out = out.withColumn(DELETE_COLUMN, F.col(f"{CHANGE_COLUMN}.{DELETE_COLUMN}")) \
            .withColumn(TS_COLUMN, F.col(f"{CHANGE_COLUMN}.{TS_COLUMN}")).drop(CHANGE_COLUMN)
        columns = out.columns
        row = F.struct(*(F.col(f"`{c}`") for c in columns))
        group = [F.col(f"`{c}`") for c in (*key, "topic", "partition")]
        lasts = out.groupBy(*group).agg(F.max_by(row, F.col("offset")).alias(_LAST),
                                        F.count(F.lit(1)).alias(CHANGES_COLUMN))
        order = F.struct(*(F.col(f"{_LAST}.`{c}`") for c in ORDER))
        hashed = lasts.repartition(max(1, tasks), *(F.col(f"`{c}`") for c in key))
        chosen = hashed.groupBy(*(F.col(f"`{c}`") for c in key)).agg(
            F.max_by(F.col(_LAST), order).alias(_LAST), F.sum(CHANGES_COLUMN).alias(CHANGES_COLUMN))
        return chosen.select(*(F.col(f"{_LAST}.`{c}`").alias(c) for c in columns),
                             F.col(CHANGES_COLUMN).cast("long").alias(CHANGES_COLUMN))


# -- 4. the table's side -------------------------------------------------------------------------------
def _rewriter(table_uri: str, storage_options: dict | None, files: list[TableFile], keys: bytes,
              key: tuple[str, ...], target: str, ranges: tuple, names: ColumnNames):
    """What each rewrite task runs: its share of the candidate files (pickled to the workers; the
    keys travel as Arrow IPC bytes, once per task; ``names``: the table's column mapping)."""

    def rewrite(batches):
        changed = pa.ipc.open_stream(keys).read_all()
        location = TableLocation.of(table_uri, storage_options)
        for batch in batches:
            done = []
            for i in batch.column(0).to_pylist():
                found = rewrite_file(location, files[i], changed, key, target, ranges, names)
                if found is not None:
                    done.append(found.to_json())
            if done:
                yield pa.RecordBatch.from_pydict({"rewrite": done})

    return rewrite


def rewrite_in_tasks(spark, location: TableLocation, storage_options, files: list[TableFile], keys: pa.Table,
                     key: tuple[str, ...], target: str, ranges: tuple = (),
                     names: ColumnNames | None = None) -> list[Rewrite]:
    """Read ``files`` in Spark tasks; those holding one of ``keys`` (or a row of ``ranges``) are
    rewritten into ``target`` without those rows (under column mapping, ``names``, the files hold
    physical names: the copies keep them and their field ids). Returns what was rewritten."""
    if not files:
        return []
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, keys.schema) as stream:
        stream.write_table(keys)
    plan = over_files(spark, files, _rewriter(location.uri, dict(storage_options) if storage_options else None, files,
                                              sink.getvalue(), key, target, tuple(ranges), names or ColumnNames()),
                      REWRITE_SCHEMA)
    return [Rewrite.from_json(row["rewrite"]) for row in plan.collect()]


def _null_keys(changed: pa.Table, key: tuple[str, ...]):
    import pyarrow.compute as pc

    mask = pa.array([False] * changed.num_rows, pa.bool_())
    for c in key:
        mask = pc.or_(mask, pc.is_null(changed[c]))
    return changed.filter(mask)


def merge_into(out, attempt: Attempt, location: TableLocation, storage_options, target: str, stage, arrow_schema,
               tasks: int, engine: bool = False, names: ColumnNames | None = None) -> MergedBatch:
    """Steps 3-4 (module doc) for the transform's output ``out`` (with :data:`CHANGE_COLUMN`):
    ``stage(df, location, target, storage_options, arrow_schema, partition_by)`` writes the
    winners that upsert (:func:`airflow_eo.driver.writer.stage`); the rewritten copies go
    beside ``target`` (its ``-kept`` directory: they hold other batches' rows). ``engine``
    (a table with a change data feed or deletion vectors): every winner is staged with its
    delete flag and deltalake's MERGE applies them at the commit
    (:mod:`airflow_eo.table.engine_merge`); no table file is read here. ``names``: the table's
    column mapping (the upserts and the rewritten copies are written with its physical names and
    ids; the winners staged for deltalake's MERGE are its source, read back by logical name)."""
    key, plan = attempt.merge.key, attempt.plan
    started = time.monotonic()
    chosen = winners(out, key, tasks)
    from pyspark import StorageLevel

    chosen = chosen.persist(StorageLevel.MEMORY_AND_DISK)  # collected (keys), then written (upserts)
    try:
        changed = chosen.select(*key, DELETE_COLUMN, "topic", "partition", "offset", CHANGES_COLUMN).toArrow()
        nulls = _null_keys(changed, key)
        if nulls.num_rows:
            first = nulls.slice(0, 1).to_pylist()[0]
            import pyarrow.compute as pc

            count = pc.sum(nulls[CHANGES_COLUMN]).as_py()  # a key's row counts the records it stands for
            raise MergeKeyError(
                f"batch {plan.batch}: {count} record(s) have a null merge_key {list(key)}, e.g. "
                f"{first['topic']}[{first['partition']}]@{first['offset']}: derive a key for every record in the "
                "transform (deletes too: e.g. from the Kafka key), or filter such records out; nothing was committed")
        keys = changed.select([*key, DELETE_COLUMN])
        if engine:
            winners_only = chosen.drop(*[c for c in INTERNAL if c in chosen.columns and c != DELETE_COLUMN])
            staged = stage(winners_only, location, target, storage_options,
                           arrow_schema.append(pa.field(DELETE_COLUMN, pa.bool_())), attempt.partition_by)
            log.info("batch %s: %d winner(s) staged for deltalake's MERGE (change data feed or deletion vectors)",
                     plan.batch, len(keys))
            return MergedBatch(tuple(staged), (), keys, frozenset(), _rows_per_partition(changed),
                               replace(_info(key, changed, []), inserted=0, engine=True), engine=True)
        ledger = Ledger.open(location.uri, storage_options)
        snapshot = ledger.file_paths()
        files, in_range = [], keys.slice(0, 0)
        if ledger.table is not None and keys.num_rows:
            actions = ledger.add_actions()
            files, in_range = candidate_files(actions, keys, key, tuple(ledger.partition_columns))
        ranges = ()
        if attempt.kind is AttemptKind.REPROCESS:  # also the rows the batch itself wrote, by provenance
            ranges = tuple(plan.data_ranges)
            whole, mixed = ledger.files_of_batch(plan.batch, ranges)
            named = {f.path for f in files}
            stored = ledger.table_files()  # partition values from the log
            files += [stored[p] for p in {**whole, **mixed} if p not in named]
            in_range = keys
        log.info("batch %s: %d changed key(s) in %.2fs; %d of %d table file(s) may hold them", plan.batch,
                 keys.num_rows, time.monotonic() - started, len(files), len(snapshot))
        started = time.monotonic()
        rewrites = rewrite_in_tasks(chosen.sparkSession, location, storage_options, files,
                                    in_range, key, location.relative(target) + KEPT_SUFFIX, ranges, names)
        log.info("batch %s: %d file(s) rewritten in %.2fs", plan.batch, len(rewrites), time.monotonic() - started)
        with functions_for(chosen) as F:
            upserts = chosen.where(~F.col(DELETE_COLUMN)).drop(*[c for c in INTERNAL if c in chosen.columns])
        staged = with_key_stats(location, stage(upserts, location, target, storage_options, arrow_schema,
                                                attempt.partition_by, names), key, names)
    finally:
        chosen.unpersist()
    return MergedBatch(tuple(staged), tuple(rewrites), keys, frozenset(snapshot),
                       _rows_per_partition(changed), _info(key, changed, rewrites))


def _rows_per_partition(changed: pa.Table) -> dict[str, int]:
    """The rows written (the upserts) per ``topic[partition]`` of the records that wrote them."""
    counts = Counter(f"{t}[{p}]" for t, p, d in zip(changed["topic"].to_pylist(), changed["partition"].to_pylist(),
                                                    changed[DELETE_COLUMN].to_pylist()) if not d)
    return dict(counts)


def _info(key: tuple[str, ...], changed: pa.Table, rewrites: list[Rewrite]) -> MergeInfo:
    import pyarrow.compute as pc

    upserts = changed.num_rows - (pc.sum(changed[DELETE_COLUMN].cast(pa.int64())).as_py() or 0)
    updated = sum(r.updated for r in rewrites)
    return MergeInfo(
        key=tuple(key), changes=int(pc.sum(changed[CHANGES_COLUMN]).as_py() or 0),
        inserted=upserts - updated, updated=updated,
        deleted=sum(r.deleted + r.replaced for r in rewrites),
        files_rewritten=len(rewrites), rows_rewritten=sum(r.kept for r in rewrites))


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0].rstrip("; ")


class MergeStage(SparkStage):
    """The merge sink's Spark step (:mod:`airflow_eo.sinks.merge`): the change view before the transform,
    the change columns after it, one row per key staged with the table files that held the keys
    rewritten (:func:`merge_into`)."""

    changes = None  # the change view (cached by the dead letters' pass, released after the write)

    def source(self, source):  # change events unwrapped, delete flags
        self.changes = change_view(source, self.attempt, self.dead)
        return self.changes

    def output(self, out):
        check_output(out, self.attempt.merge.key)
        out = with_change_columns(out, self.changes)
        return out, deletes(out)

    def arrow_schema(self, out) -> pa.Schema:
        return super().arrow_schema(out.drop(*INTERNAL))

    def write(self, out, arrow_schema: pa.Schema, stage) -> list[StagedFile]:
        """One row per key: the winners, and the table files that held their keys."""
        attempt, plan, features = self.attempt, self.attempt.plan, self.features
        tasks = len(read_slices(plan.data_ranges, attempt.spark.max_offsets_per_task))
        use = TableUse.REPROCESS if attempt.kind is AttemptKind.REPROCESS else TableUse.MERGE
        merged = merge_into(out, attempt, self.staging.loc, self.storage_options, self.staging.attempt_path(plan),
                            stage, arrow_schema, tasks, engine=features.engine_for(use), names=features.names)
        self.merged = merged
        self.extra = MergeStaged(FileSwap(merged.rewrites, merged.keys, attempt.merge.key, merged.snapshot_files),
                                 merged.info, merged.engine)
        info = merged.info
        if merged.engine:
            self.notes.append(f"merge by {list(info.key)}: {info.changes} change(s), applied by deltalake's MERGE at "
                              "the commit (it counts the rows)")
        else:
            self.notes.append(f"merge by {list(info.key)}: {info.changes} change(s) → {info.inserted} inserted, "
                              f"{info.updated} updated, {info.deleted} deleted; {info.files_rewritten} table file(s) "
                              f"rewritten ({info.rows_rewritten} rows copied)")
        return list(merged.files)

    def rows(self, files: list[StagedFile]) -> dict[str, int]:
        return self.merged.rows_per_partition

    def late_inputs(self, arrow_schema, source):
        return pa.schema([]), source  # the files hold one row per key: count over the records

    def release(self) -> None:
        if self.changes is not None:
            self.changes.unpersist()

