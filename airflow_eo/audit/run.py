"""Running an audit: the ledger's batches, then each audited partition compared slice by slice with Kafka.

The Delta log gives the batches and their committed ranges (the tiling check needs nothing
else); Kafka's bounds clip the audited ranges to what it still holds. Each audited partition
is cut into slices (:func:`airflow_eo.audit.findings.plan_slices`) that read only coordinates
— the offsets a ``read_committed`` consumer delivers, and ``topic``, ``partition``, ``offset``
of the table's (and dead-letter table's) files whose statistics may hold them — and return
small results, merged here: memory follows the slice size, not the number of records.

Small audits run their slices in this process; one that checks at least
``spark_threshold`` offsets runs them as Spark tasks when it is given a Spark runner
(:class:`airflow_eo.submit.audit.SparkSlices`: a classic session or the Spark Connect server;
by default from :data:`~airflow_eo.audit.SPARK_THRESHOLD_WARM` offsets on a warm session and
from :data:`~airflow_eo.audit.SPARK_THRESHOLD_COLD` on one the audit would have to start).
The result is recorded beside the table (:class:`airflow_eo.table.audit_log.AuditLog`).

Example::

    >>> report = run_audit(AuditRequest("/data/orders", "orders_raw",
    ...                                 {"bootstrap.servers": "127.0.0.1:9092"}))   # doctest: +SKIP
    >>> report.exit_code                                                             # doctest: +SKIP
    0
"""

from __future__ import annotations

import enum
import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Mapping

from airflow_eo.attempt import Secrets
from airflow_eo.audit import SLICE_OFFSETS
from airflow_eo.audit.coordinates import FileIndex, table_files
from airflow_eo.audit.findings import (
    AuditReport, BatchRanges, Finding, MergeCounts, PartitionResult, PartitionScope, SliceResult, account_batches,
    check_merge_counts, check_tiling, merge_slices, plan_slices, unverifiable,
)
from airflow_eo.audit.slices import InProcessSlices, SliceRunner, SliceTask
from airflow_eo.core.errors import ConfigError, KafkaUnavailableError, TableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.core.offsets import OffsetRange, PartitionBounds, TopicPartition
from airflow_eo.table.compaction import MAINTENANCE_KEY
from airflow_eo.table.audit_log import AuditLog
from airflow_eo.table.features import TableUse
from airflow_eo.table.ledger import Ledger, batch_of_path
from airflow_eo.table.app_ids import partition_app_id
from airflow_eo.sinks import recorded_sink
from airflow_eo.table.metadata import METADATA_KEY, CommitKind

log = logging.getLogger(__name__)


class Selection(str, enum.Enum):
    SINCE_LAST_AUDIT = "since_last_audit"  # the default: batches committed after the last recorded audit
    ALL = "all"
    BATCHES = "batches"  # the newest N batches
    SINCE_VERSION = "since_version"  # batches whose commit is at or after table version V


@dataclass(frozen=True)
class AuditRequest:
    table_uri: str
    ingest_id: str
    kafka_config: Mapping[str, object]
    storage_options: Mapping[str, str] | None = None
    selection: Selection = Selection.SINCE_LAST_AUDIT
    value: int | None = None  # N for BATCHES, V for SINCE_VERSION
    dead_letter_table: str | None = None
    record: bool = True  # write the result beside the table
    kafka_timeout: float = 60.0
    slice_offsets: int = SLICE_OFFSETS
    spark_threshold: int | None = None  # with a Spark runner: audits checking this many offsets use it
    # (None: the runner's own default, lower for a warm session than for one it must start)


def batch_ranges(ledger: Ledger, ingest_id: str) -> list[BatchRanges]:
    """Each batch's newest data commit the log still holds (a reprocess replaces its ingest), by batch."""
    newest: dict[int, BatchRanges] = {}
    for rec in ledger.batches(ingest_id, limit=None):  # newest first
        meta = rec.meta
        if meta.batch in newest or meta.operation not in (CommitKind.BATCH, CommitKind.REPROCESS):
            continue
        dups = meta.findings.duplicates
        newest[meta.batch] = BatchRanges(meta.batch, rec.version, tuple(meta.ranges), tuple(meta.skipped),
                                         dups.records if dups else 0, dups.to_dead_letters if dups else False,
                                         meta.write_mode.value)
    return [newest[b] for b in sorted(newest)]


def since_resets(batches: list[BatchRanges], resets: Mapping[str, int]) -> list[BatchRanges]:
    """``batches`` without the ranges of a topic read before its last reset (``resets``: topic → the batch
    that read it again from a recreated topic's start): those records went with the old topic, and the
    new topic's offsets start again."""
    if not any(resets.values()):
        return batches
    return [replace(b, ranges=tuple(r for r in b.ranges if b.batch >= resets.get(r.topic, 0))) for b in batches]


def merge_counts(ledger: Ledger, ingest_id: str) -> tuple[list[MergeCounts], bool]:
    """Every merge commit the log holds, oldest first, and whether they start at the first batch
    (log cleanup drops old commit details: then the table's rows cannot be summed from them)."""
    records = [(r, recorded_sink(r.meta.write_mode).row_changes(r.meta)) for r in ledger.batches(ingest_id, limit=None)
               if r.meta.operation in (CommitKind.BATCH, CommitKind.REPROCESS)]
    changed = [(r, c) for r, c in records if c is not None]
    oldest = changed[-1][0] if changed else None
    commits = [MergeCounts(r.meta.batch, r.version, added, removed) for r, (added, removed) in reversed(changed)]
    return commits, oldest is not None and oldest.meta.batch == 1 and oldest.meta.operation is CommitKind.BATCH


# operations of other engines that change rows (delta-spark, Databricks, deltalake's own)
_ROW_CHANGES = ("DELETE", "UPDATE", "MERGE", "WRITE", "STREAMING UPDATE", "REPLACE TABLE AS SELECT", "TRUNCATE")


def other_engines_changed_rows(ledger: Ledger) -> list[str]:
    """The commits the log holds that changed rows and are not airflow-eo's ("version V (OPERATION)")."""
    assert ledger.table is not None
    return [f"version {c.get('version')} ({c.get('operation')})" for c in reversed(ledger.table.history())
            if METADATA_KEY not in c and MAINTENANCE_KEY not in c and c.get("operation") in _ROW_CHANGES]


def table_rows(ledger: Ledger) -> int:
    """The table's rows from its files' statistics (no data is read)."""
    table = ledger.table
    assert table is not None
    actions = table.get_add_actions(flatten=True)
    return int(sum(n for n in actions.column("num_records").to_pylist() if n is not None))


def rows_keep_offsets(batches: list[BatchRanges]) -> bool:
    """Whether the table holds one row per delivered offset, so rows are compared offset by offset.
    A table written in merge mode (upserts: one row per key) does not: there the audit checks the
    range tiling (and, where the merge commits record them, the recorded counts) only. The sink
    of each batch's recorded write mode says (:attr:`airflow_eo.sinks.base.Sink.rows_keep_offsets`);
    this is the one place the audit asks."""
    return all(recorded_sink(b.write_mode).rows_keep_offsets for b in batches)


def select(batches: list[BatchRanges], request: AuditRequest, since: int | None) -> list[BatchRanges]:
    """The batches to compare row by row (the tiling check always covers every batch)."""
    if request.selection is Selection.ALL:
        return batches
    if request.selection is Selection.BATCHES:
        if not request.value or request.value < 1:
            raise ConfigError(f"--batches {request.value} is not a positive number of batches: give e.g. --batches 10")
        return batches[-request.value:]
    if request.selection is Selection.SINCE_VERSION:
        return [b for b in batches if b.version >= (request.value or 0)]
    return batches if since is None else [b for b in batches if b.version > since]


def _open_table(uri: str, storage_options: Mapping[str, str] | None) -> Ledger:
    ledger = Ledger.open(uri, dict(storage_options) if storage_options else None)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and --storage-options "
                         "for object storage)")
    return ledger


def deleting_commits(ledger: Ledger, deleted: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """Each file with a deletion vector → the commit that wrote that vector, "version V (OPERATION)":
    the oldest snapshot in which the file already had it (found by bisection over the versions; a
    file's vector only grows while the file is in the table)."""
    if not deleted:
        return {}
    from deltalake import DeltaTable

    from airflow_eo.table.files import deleted_rows_of

    assert ledger.table is not None and ledger.version is not None
    snapshots: dict[int, dict[str, tuple[int, ...]]] = {}

    def rows_at(version: int) -> dict[str, tuple[int, ...]]:
        if version not in snapshots:
            try:
                table = DeltaTable(ledger.table_uri, version=version, storage_options=ledger.storage_options)
                reader = table.protocol().reader_features or ()
                snapshots[version] = deleted_rows_of(table) if "deletionVectors" in reader else {}
            except Exception:  # a version the log no longer holds (log cleanup): not this one
                snapshots[version] = {}
        return snapshots[version]

    operations = {int(c.get("version", -1)): c.get("operation", "") for c in ledger.table.history()}
    found = {}
    for path, rows in deleted.items():
        low, high = 0, ledger.version
        while low < high:
            middle = (low + high) // 2
            if rows_at(middle).get(path) == rows:
                high = middle
            else:
                low = middle + 1
        found[path] = f"version {low} ({operations.get(low) or 'operation no longer in the log'})"
    return found


def slice_tasks(request: AuditRequest, ledger: Ledger, batches: list[BatchRanges],
                scopes: dict[TopicPartition, PartitionScope], dead: Ledger | None,
                resets: Mapping[str, int] | None = None) -> list[SliceTask]:
    """Every audited partition's slices, each with the files whose statistics may hold its rows (not
    the files batches before a reset of its topic wrote: those rows are of the old topic)."""
    deleted = ledger.deleted_rows()  # rows other engines deleted with deletion vectors: not the table's
    files = FileIndex(table_files(ledger.table, deleted, deleting_commits(ledger, deleted)))
    dead_files = FileIndex(table_files(dead.table) if dead is not None else [])
    tasks = []
    for tp, scope in sorted(scopes.items()):
        committed = [(r.start, r.end) for b in batches for r in b.ranges if r.tp == tp]
        for spec in plan_slices(scope, committed, request.slice_offsets, files.highest_offset(tp)):
            since = (resets or {}).get(tp.topic, 0)
            mine = tuple(f for f in files.files(tp, spec.lo, spec.hi)
                         if not since or (batch_of_path(f.path) or since) >= since)
            tasks.append(SliceTask(spec, ledger.table_uri, mine,
                                   dead.table_uri if dead is not None else None,
                                   dead_files.files(tp, spec.lo, spec.hi), request.ingest_id,
                                   ledger.features.names.as_dict()))
    return tasks


def compare_rows(request: AuditRequest, ledger: Ledger, batches: list[BatchRanges],
                 scopes: dict[TopicPartition, PartitionScope], spark: SliceRunner | None,
                 resets: Mapping[str, int] | None = None) -> tuple[list[PartitionResult], str, int]:
    """Each audited partition's rows against Kafka, slice by slice: in Spark tasks when the audit
    is large and Spark is given, else in this process. Returns the results, the engine, rows read."""
    dead = _open_table(request.dead_letter_table, request.storage_options) if request.dead_letter_table else None
    tasks = slice_tasks(request, ledger, batches, scopes, dead, resets)
    offsets = sum(t.size for t in tasks)
    runner: SliceRunner = InProcessSlices()
    if spark is not None:
        threshold = spark.default_threshold if request.spark_threshold is None else request.spark_threshold
        runner = spark if offsets >= threshold else runner
    log.info("audit: comparing %d offsets of %d partition(s) in %d slice(s) %s", offsets, len(scopes), len(tasks),
             "as Spark tasks" if runner.engine != InProcessSlices.engine else "in this process")
    started = time.monotonic()
    by_tp: dict[TopicPartition, list[SliceResult]] = {tp: [] for tp in scopes}
    for result in runner.run(tasks, Secrets(dict(request.kafka_config), request.storage_options)):
        by_tp[result.spec.tp].append(result)
    results = [merge_slices(scope, by_tp[tp]) for tp, scope in sorted(scopes.items())]
    log.info("audit: %d slice(s) read and compared in %.1f s", len(tasks), time.monotonic() - started)
    return results, runner.engine, sum(r.rows_read for r in results)


def run_audit(request: AuditRequest, spark: SliceRunner | None = None) -> AuditReport:
    """Audit ``request``'s batches; records the result beside the table unless told not to.
    ``spark``: where large audits run their slices (:class:`airflow_eo.submit.audit.SparkSlices`)."""
    ledger = _open_table(request.table_uri, request.storage_options)
    ledger.check_owner(request.ingest_id)
    ledger.check_features(TableUse.AUDIT)  # deletion vectors, column mapping: refused, not misread
    audits = AuditLog(ledger.location())
    last = audits.last(request.ingest_id) if request.selection is Selection.SINCE_LAST_AUDIT else None
    batches = batch_ranges(ledger, request.ingest_id)
    resets = {t: ledger.last_reset(request.ingest_id, t) for t in sorted({r.topic for b in batches for r in b.ranges})}
    batches = since_resets(batches, resets)
    tps = sorted({r.tp for b in batches for r in b.ranges})
    table = ledger.table
    assert table is not None  # _open_table refused a path without one
    txn = {tp: table.transaction_version(partition_app_id(request.ingest_id, tp)) for tp in tps}
    findings: list[Finding] = check_tiling(batches, txn)
    chosen = select(batches, request, last.through_version if last else None)
    audited: dict[TopicPartition, list[tuple[BatchRanges, OffsetRange]]] = {}
    for b in chosen:
        for r in b.ranges:
            if r.size > 0:
                audited.setdefault(r.tp, []).append((b, r))
    kafka = KafkaOffsets(dict(request.kafka_config), timeout=min(request.kafka_timeout, 30.0))
    topics = sorted({tp.topic for tp in audited})
    known = set(kafka.partitions(topics)) if topics else set()
    gone = sorted(set(audited) - known)
    if gone:
        raise KafkaUnavailableError(f"Kafka has no partition {', '.join(map(str, gone))} the table committed: "
                                    "check the bootstrap servers point at the table's cluster; nothing was changed")
    bounds: dict[TopicPartition, PartitionBounds] = kafka.bounds(sorted(audited)) if audited else {}
    scopes = {tp: PartitionScope(tp, bounds[tp].log_start, tuple(a)) for tp, a in audited.items()}
    notes = []
    if rows_keep_offsets(batches):
        results, engine, rows_read = compare_rows(request, ledger, batches, scopes, spark, resets)
    else:  # merge mode: rows do not keep every offset (see rows_keep_offsets): the ranges' tiling and the
        # table's rows against what its merge commits recorded
        commits, complete = merge_counts(ledger, request.ingest_id)
        others = other_engines_changed_rows(ledger)
        if not others:
            findings.extend(check_merge_counts(commits, table_rows(ledger), complete))
        notes.append("rows written in merge mode are not compared offset by offset: the committed ranges are checked"
                     + ("; other engines changed rows (" + ", ".join(others[:3]) + "), so the table's rows are not "
                        "counted against its merge commits" if others else
                        ", and the table's rows against the rows its merge commits inserted and deleted" if complete
                        else "; the log no longer holds every merge commit, so the rows are not counted"))
        results = [PartitionResult(tp, tuple(unverifiable(scope))) for tp, scope in sorted(scopes.items())]
        engine, rows_read = InProcessSlices.engine, 0
    by_batch = {b.batch: b for b in batches}
    for res in results:
        findings.extend(res.findings)
    findings.extend(account_batches(results, by_batch))
    for topic, batch in sorted(resets.items()):
        if batch:
            notes.append(f"topic {topic!r} was deleted and created again: batch {batch} read it again from the new "
                         "topic's start (on_topic_recreated='reset'), so its earlier batches are not compared with Kafka")
    if batches and batches[0].batch > 1:
        notes.append(f"the Delta log no longer holds batches before {batches[0].batch} (log cleanup): ranges are "
                     f"checked from batch {batches[0].batch} on")
    report = AuditReport(
        table_uri=ledger.table_uri, ingest_id=request.ingest_id, table_version=ledger.version or 0,
        batches=tuple(b.batch for b in chosen),
        through_version=max((b.version for b in chosen), default=last.through_version if last else -1),
        partitions=tuple(sorted(set(tps) | set(scopes))),
        findings=tuple(sorted(findings, key=lambda f: (f.tp, f.kind.value, f.start or 0))),
        checked_offsets=sum(r.checked_offsets for r in results), rows_read=rows_read,
        audited_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), note="; ".join(notes), engine=engine,
    )
    if request.record:
        text = json.dumps({**report.to_dict(), "summary": report.summary()})
        audits.record(request.ingest_id, report.audited_at, text)
    for f in report.findings:
        (log.warning if f.drift else log.info)("audit: %s", f)
    log.info("%s", report.summary())
    return report
