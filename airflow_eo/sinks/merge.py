"""The merge sink (``write_mode="merge"``): one row per ``merge_key``; a batch's changes upsert or
delete their key's row (the last change wins).

The table is marked by its first merge batch (a ``txn`` for :func:`airflow_eo.table.app_ids.merge_app_id`
whose version names the key) and keeps its write mode and key
(:func:`airflow_eo.sinks.base.check_mark`). Its commit rules:
:class:`MergeCommit` (compare the offsets and the files the batch rewrote, swap them, add the rows,
set the offsets) and :class:`MergeReprocessCommit` (the newest batch only: :func:`newest_only`).
Its Spark step (change view, winners per key, rewritten files) is
:class:`airflow_eo.driver.merge.MergeStage`; the files by key are :mod:`airflow_eo.table.merge`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa
from deltalake.transaction import Transaction

from airflow_eo.attempt import Attempt
from airflow_eo.core.errors import CommitConflictError, ConfigError
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.sinks.append import boundaries_commit
from airflow_eo.sinks.base import Sink, check_mark
from airflow_eo.spec import MergeSpec, WriteMode
from airflow_eo.table.commit import (
    CommitOutcome, CommitRule, StagedBatch, add_actions, batch_lost_race, check_features, compare_offsets,
    compare_reprocess_counter, evolve_schema, offset_transactions, open_writable, remove_action,
    reprocess_lost_race, verify_batch, verify_reprocess,
)
from airflow_eo.table.features import TableUse
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.app_ids import merge_app_id, merge_mark, reprocess_app_id
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.engine_merge import EngineMerge
from airflow_eo.table.merge import DELETE_COLUMN, Rewrite, candidate_files
from airflow_eo.table.metadata import BatchFindings, BatchMetadata, CommitKind, MergeInfo, ReprocessInfo
from airflow_eo.table.schema import check_schema, delta_schema_of


@dataclass(frozen=True)
class MergeStaged:
    """What a merge's stage step hands its commit beside the files: the table files it swaps,
    what it did to the rows, and whether deltalake's MERGE applies it at the commit."""

    swap: "FileSwap"
    info: MergeInfo
    engine: bool = False


class MergeSink(Sink):
    """``write_mode="merge"``: see the module."""

    kind = "merge"
    stage = "airflow_eo.driver.merge:MergeStage"
    write_mode = WriteMode.MERGE
    table_note = "merge by key"
    use = TableUse.MERGE
    direct = False  # change events are decoded, unwrapped and reduced to one row per key in Spark
    rows_keep_offsets = False  # one row per key: the audit checks the ranges' tiling and the recorded counts

    def check_table(self, ledger: Ledger, ingest_id: str) -> None:
        check_mark(ledger, ingest_id, self.spec.merge.key)

    def check_plan(self, ledger: Ledger, plan: BatchPlan) -> None:
        if plan.interval is not None:  # changes apply in time order
            IntervalLedger(ledger, plan.ingest_id).check_merge_order(plan.interval)

    def check_reprocess(self, ledger: Ledger, plan: BatchPlan, last: int) -> None:
        if plan.batch != last:
            raise ConfigError(newest_only(plan.batch, last, ledger.table_uri))

    def ingest_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                    extra: Any = None) -> "MergeCommit":
        assert isinstance(extra, MergeStaged)  # the merge stage step's
        return MergeCommit(staged, swap=extra.swap, info=extra.info, merge=attempt.merge, findings=findings,
                           schema_evolution=attempt.schema_evolution, table_properties=attempt.table_properties,
                           adopt_table=attempt.adopt_table, engine=extra.engine)

    def boundaries_rule(self, staged: StagedBatch, attempt: Attempt) -> CommitRule:
        return boundaries_commit(self, staged, attempt)

    def reprocess_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                       extra: Any = None) -> "MergeReprocessCommit":
        assert isinstance(extra, MergeStaged) and attempt.reprocess_from is not None
        return MergeReprocessCommit(staged, swap=extra.swap, info=extra.info, merge=attempt.merge,
                                    reprocess_from=attempt.reprocess_from, requested_by=attempt.requested_by,
                                    findings=findings, engine=extra.engine)

    @classmethod
    def describe_mode(cls, key: tuple[str, ...] = ()) -> str:
        return f"merge by {', '.join(key)}"

    @classmethod
    def result_counts(cls, meta: BatchMetadata | None) -> dict[str, Any]:
        merge = meta.merge if meta is not None else None
        if merge is None:
            return {}
        return {"write_mode": "merge", "inserted": merge.inserted, "updated": merge.updated, "deleted": merge.deleted,
                "files_rewritten": merge.files_rewritten}

    @classmethod
    def row_changes(cls, meta: BatchMetadata) -> tuple[int, int] | None:
        return (meta.merge.inserted, meta.merge.deleted) if meta.merge is not None else None

    @classmethod
    def counts_text(cls, summary: Mapping[str, Any]) -> str:
        return ("merged: {inserted} inserted, {updated} updated, {deleted} deleted, {files_rewritten} file(s) "
                "rewritten").format(**{k: summary.get(k, 0) for k in _COUNTS})

    @classmethod
    def counts_facet(cls, summary: Mapping[str, Any]) -> dict[str, int] | None:
        return {k: summary.get(k, 0) for k in _COUNTS}

    @classmethod
    def count_metrics(cls, summary: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
        return tuple((metric, int(summary.get(key) or 0)) for metric, key in (
            ("rows_inserted", "inserted"), ("rows_updated", "updated"), ("rows_deleted", "deleted"),
            ("files_rewritten", "files_rewritten")))


_COUNTS = ("inserted", "updated", "deleted", "files_rewritten")  # what a merge's result adds


@dataclass(frozen=True)
class FileSwap:
    """The files a merge commit swaps, and what it compares them with on the commit's snapshot:
    ``rewrites`` (files read from ``snapshot_files`` that held a changed key, and their copies)
    and every changed ``key`` (columns ``key`` and ``DELETE_COLUMN``)."""

    rewrites: tuple[Rewrite, ...]
    keys: pa.Table
    key: tuple[str, ...]
    snapshot_files: frozenset[str]

    def check(self, ledger: Ledger, plan: BatchPlan) -> None:
        """Refuse (retryably) a snapshot that moved under the batch: a file it rewrites is gone
        (a compaction or another batch replaced it), or a file added since it chose its files
        may hold one of its keys (a compaction's output, a reprocess of the batch before)."""
        files = ledger.file_paths()
        gone = sorted(r.removed.path for r in self.rewrites if r.removed.path not in files)
        if gone:
            raise CommitConflictError(
                f"batch {plan.batch} of {plan.ingest_id} rewrote {len(gone)} table file(s) that another commit "
                f"removed meanwhile (e.g. {gone[0]}: a compaction?); nothing was committed. Run again: the retry "
                "reads the table as it is now")
        added = files - self.snapshot_files
        if added and self.keys.num_rows and ledger.table is not None:
            actions = ledger.add_actions()
            mask = pa.array([p in added for p in actions["path"].to_pylist()])
            suspects, _ = candidate_files(actions.filter(mask), self.keys, self.key, tuple(ledger.partition_columns))
            if suspects:
                raise CommitConflictError(
                    f"batch {plan.batch} of {plan.ingest_id}: {len(suspects)} file(s) added since it read the table "
                    f"may hold keys it changes (e.g. {suspects[0].path}: a compaction or a reprocess committed "
                    "meanwhile); nothing was committed. Run again: the retry reads the table as it is now")

    def actions(self, files, names: ColumnNames | None = None) -> list:
        now_ms = int(time.time() * 1000)
        removes = [remove_action(r.removed, now_ms, names) for r in self.rewrites]
        return [*removes, *add_actions(files), *add_actions(r.copy for r in self.rewrites if r.copy)]

    @property
    def copies(self) -> int:
        return sum(1 for r in self.rewrites if r.copy)


class MergeCommit:
    """A merge batch (``write_mode="merge"``): compare the offsets like ``BATCH`` and the files the
    batch rewrote (:meth:`FileSwap.check`); swap them, add the batch's rows, set the offsets."""

    kind = CommitKind.BATCH  # on disk a batch like any other: older readers see its offsets and rows
    creates_table = True
    exact_snapshot = True

    def __init__(self, staged: StagedBatch, *, swap: FileSwap, info: MergeInfo, merge: MergeSpec,
                 findings: BatchFindings | None = None, schema_evolution: bool = False,
                 table_properties: dict[str, str] | None = None, adopt_table: bool = False, engine: bool = False):
        self.staged, self.plan, self.swap, self.info, self.merge = staged, staged.plan, swap, info, merge
        self.findings = findings or BatchFindings()
        self.schema_evolution, self.table_properties = schema_evolution, table_properties or None
        self.adopt_table = adopt_table
        self.engine = EngineMerge(merge.key, DELETE_COLUMN) if engine else None  # stages the winners, deletes too

    def open(self, table_uri: str, storage_options) -> Ledger:
        return open_writable(table_uri, storage_options, self.plan.ingest_id, self.adopt_table)

    def check(self, ledger: Ledger) -> CommitCheck:
        state = compare_offsets(self.plan, ledger)
        if state is CommitCheck.READY and self.plan.interval is not None:
            IntervalLedger(ledger, self.plan.ingest_id).check_merge_order(self.plan.interval)
        return state

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        ledger.check_writable(self.plan.ingest_id, self.staged.partition_by, adopt=self.adopt_table)
        check_mark(ledger, self.plan.ingest_id, self.merge.key)
        check_features(self.staged, ledger, TableUse.MERGE)
        ledger = evolve_schema(self, ledger, table_uri, storage_options)
        if self.engine is None:  # the MERGE reads the snapshot it commits on itself
            self.swap.check(ledger, self.plan)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return [] if self.engine is not None else self.swap.actions(self.staged.files, ledger.features.names)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [*offset_transactions(self.plan, ledger, self.findings),
                Transaction(merge_app_id(self.plan.ingest_id), merge_mark(self.merge.key))]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, () if self.engine else self.staged.files,
                                self.staged.rows_per_partition, self.findings, merge=self.info)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return batch_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return verify_batch(self.staged, table_uri, storage_options, read_version)


class MergeReprocessCommit:
    """The reprocess of a merge table's newest batch: compare its reprocess counter (and that no
    batch came after it), swap the files that held its keys or its rows, add its new rows."""

    kind = CommitKind.REPROCESS
    creates_table = False
    table_properties: dict[str, str] | None = None
    exact_snapshot = True

    def __init__(self, staged: StagedBatch, *, swap: FileSwap, info: MergeInfo, merge: MergeSpec,
                 reprocess_from: int, requested_by: RunIdentity | None = None, findings: BatchFindings | None = None,
                 engine: bool = False):
        self.staged, self.plan, self.swap, self.info, self.merge = staged, staged.plan, swap, info, merge
        self.reprocess_from, self.requested_by = int(reprocess_from), requested_by
        self.findings = findings or BatchFindings()
        # the winners by key, and the batch's own rows (by offset) that no winner matched deleted
        self.engine = EngineMerge(merge.key, DELETE_COLUMN, tuple(self.plan.ranges)) if engine else None

    def open(self, table_uri: str, storage_options) -> Ledger:
        return open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        state = compare_reprocess_counter(self.plan, self.reprocess_from, ledger)
        last = ledger.last_batch(self.plan.ingest_id)
        if state is CommitCheck.READY and last != self.plan.batch:
            raise ConfigError(newest_only(self.plan.batch, last, ledger.table_uri))
        return state

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        check_mark(ledger, self.plan.ingest_id, self.merge.key)
        check_features(self.staged, ledger, TableUse.REPROCESS)
        check_schema(ledger, delta_schema_of(self.staged.arrow_schema))
        if self.engine is None:
            self.swap.check(ledger, self.plan)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return [] if self.engine is not None else self.swap.actions(self.staged.files, ledger.features.names)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [Transaction(reprocess_app_id(self.plan.ingest_id, self.plan.batch), self.reprocess_from + 1)]

    def metadata(self) -> BatchMetadata:
        info = ReprocessInfo(self.reprocess_from, len(self.swap.rewrites), self.swap.copies, self.requested_by)
        return BatchMetadata.of(self.kind, self.plan, () if self.engine else self.staged.files,
                                self.staged.rows_per_partition, self.findings, info, merge=self.info)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return reprocess_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return verify_reprocess(self.staged, table_uri, storage_options, len(self.swap.rewrites))


def newest_only(batch: int, last: int, table_uri: str) -> str:
    """Why a merge table's batch other than the newest is not reprocessed (one line)."""
    return (f"reprocess of batch {batch} refused: {table_uri} is a merge table and its newest batch is {last}; later "
            "batches may have changed or deleted the keys batch "
            f"{batch} wrote, and replaying it would put older values over newer ones (only the newest batch can be "
            "reprocessed); nothing was changed")


