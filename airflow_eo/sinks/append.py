"""The append sink (``write_mode="append"``): every record a row, keyed by its source offset.

Its commit rules: :class:`BatchCommit` (a new batch: compare the offsets, add the files, set the
offsets; an interval batch may be rebased) and :class:`ReprocessCommit` (replace a committed batch's
rows: compare its reprocess counter, remove its files, add the new ones). The dedup sink
(:mod:`airflow_eo.sinks.dedup`) commits with the same rules.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from deltalake.transaction import AddAction, Transaction

from airflow_eo.attempt import Attempt
from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.planning import CommitCheck
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.sinks.base import Sink
from airflow_eo.table.commit import (
    CommitOutcome, StagedBatch, add_actions, batch_lost_race, check_features, compare_offsets,
    compare_reprocess_counter, evolve_schema, offset_transactions, open_writable, rebase, remove_action,
    reprocess_lost_race, verify_batch, verify_reprocess,
)
from airflow_eo.table.engine_merge import OFFSET_KEY, EngineMerge
from airflow_eo.table.features import TableUse
from airflow_eo.table.app_ids import reprocess_app_id
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.merge import rewrite_file
from airflow_eo.table.metadata import BatchFindings, BatchMetadata, CommitKind, ReprocessInfo
from airflow_eo.table.schema import check_schema, delta_schema_of
from airflow_eo.table.staging import KEPT_SUFFIX, attempt_dir_name, attempt_dir_of


class AppendSink(Sink):
    """``write_mode="append"``: each batch's rows added with its offsets."""

    kind = "append"
    use = TableUse.APPEND

    def ingest_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                    extra: Any = None) -> "BatchCommit":
        return BatchCommit(staged, findings=findings, schema_evolution=attempt.schema_evolution,
                           table_properties=attempt.table_properties, adopt_table=attempt.adopt_table)

    def boundaries_rule(self, staged: StagedBatch, attempt: Attempt) -> "BatchCommit":
        return boundaries_commit(self, staged, attempt)

    def reprocess_rule(self, staged: StagedBatch, attempt: Attempt, findings: BatchFindings,
                       extra: Any = None) -> "ReprocessCommit":
        assert attempt.reprocess_from is not None  # a reprocess attempt carries it (Attempt checks)
        engine = staged.features is not None and staged.features.engine_for(TableUse.REPROCESS)
        return ReprocessCommit(staged, reprocess_from=attempt.reprocess_from, requested_by=attempt.requested_by,
                               findings=findings, engine=engine)


def boundaries_commit(sink: Sink, staged: StagedBatch, attempt: Attempt) -> "BatchCommit":
    """An interval without records, whatever the write mode: a batch of no rows commits as an append does
    (what an empty Spark batch records, from the sink's findings)."""
    return BatchCommit(staged, findings=sink.findings(attempt), adopt_table=attempt.adopt_table)


class BatchCommit:
    """``BATCH``: compare the offsets, set them to the plan's ends (an interval batch may be rebased)."""

    kind = CommitKind.BATCH
    creates_table = True
    exact_snapshot = False
    engine: EngineMerge | None = None

    def __init__(self, staged: StagedBatch, *, findings: BatchFindings | None = None, schema_evolution: bool = False,
                 table_properties: dict[str, str] | None = None, adopt_table: bool = False):
        self.staged, self.plan = staged, staged.plan
        self.findings = findings or BatchFindings()
        self.schema_evolution, self.table_properties = schema_evolution, table_properties or None
        self.adopt_table = adopt_table
        self.planned_batch = staged.plan.batch
        dead = self.findings.dead_letters
        # rebased on a moved table: an interval batch whose rows depend on nothing the other batches wrote
        # (never a commit through deltalake's MERGE, which reads the snapshot it commits on itself)
        self.rebases = staged.plan.interval is not None and (dead is None or not dead.files) and \
            self.findings.duplicates is None and self.engine is None

    def open(self, table_uri: str, storage_options) -> Ledger:
        return open_writable(table_uri, storage_options, self.plan.ingest_id, self.adopt_table)

    def check(self, ledger: Ledger) -> CommitCheck:
        return compare_offsets(self.plan, ledger, self.rebases)

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        # a table made since planning
        ledger.check_writable(self.plan.ingest_id, self.staged.partition_by, adopt=self.adopt_table)
        # the features of the snapshot it commits on (a rebased batch's too: rebasing keeps the rows' checks)
        check_features(self.staged, ledger, TableUse.APPEND)
        ledger = evolve_schema(self, ledger, table_uri, storage_options)
        if self.rebases:
            rebase(self, ledger)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return add_actions(self.staged.files)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return offset_transactions(self.plan, ledger, self.findings)

    def metadata(self) -> BatchMetadata:
        meta = BatchMetadata.of(self.kind, self.plan, self.staged.files, self.staged.rows_per_partition, self.findings)
        return meta if self.plan.batch == self.planned_batch else replace(meta, planned_batch=self.planned_batch)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return batch_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return verify_batch(self.staged, table_uri, storage_options, read_version)




class ReprocessCommit:
    """``REPROCESS``: compare the batch's reprocess counter, replace its files."""

    kind = CommitKind.REPROCESS
    creates_table = False
    table_properties: dict[str, str] | None = None
    exact_snapshot = True  # it removes the files its snapshot holds: a compaction may replace them meanwhile

    def __init__(self, staged: StagedBatch, *, reprocess_from: int, requested_by: RunIdentity | None = None,
                 findings: BatchFindings | None = None, engine: bool = False):
        self.staged, self.plan = staged, staged.plan
        self.reprocess_from, self.requested_by = int(reprocess_from), requested_by
        self.findings = findings or BatchFindings()
        self.removed = self.rewritten = 0
        # deltalake's MERGE on the batch's offsets: matched rows replaced, the range's others deleted
        self.engine = EngineMerge(OFFSET_KEY, ranges=tuple(self.plan.ranges)) if engine else None

    def open(self, table_uri: str, storage_options) -> Ledger:
        return open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        return compare_reprocess_counter(self.plan, self.reprocess_from, ledger)

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        check_features(self.staged, ledger, TableUse.REPROCESS)
        check_schema(ledger, delta_schema_of(self.staged.arrow_schema), replacing=True)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        """Remove the batch's own files; rewrite files it shares with other batches (after a
        compaction) without its rows; add the new rows. One commit, so readers see either."""
        if self.engine is not None:  # the MERGE finds and rewrites the files itself
            return []
        new_dir = attempt_dir_name(self.plan)
        now_ms = int(time.time() * 1000)
        whole, mixed = ledger.files_of_batch(self.plan.batch, self.plan.ranges)
        whole = {path: size for path, size in whole.items() if attempt_dir_of(path) != new_dir}
        files, names = ledger.table_files(), ledger.features.names  # partition values from the log
        # Not in the attempt's own directory: these copies hold other batches' rows, so they must
        # stay "shared" files for later reprocesses (found by their stats, never removed whole).
        # Uncommitted, they are orphans like any attempt's files (the collector's "b…-…" rule).
        kept = [rewrite_file(ledger.location(), files[path], None, (), new_dir + KEPT_SUFFIX, tuple(self.plan.ranges),
                             names) for path in mixed]
        removes = [remove_action(files[path], now_ms, names) for path in {**whole, **mixed}]
        self.removed, self.rewritten = len(removes), len(mixed)
        # the other batches' rows, copied out of shared files: not a change of data
        unchanged = [AddAction(r.copy.path, r.copy.size, dict(r.copy.partition_values), r.copy.modification_time,
                               False, r.copy.stats) for r in kept if r is not None and r.copy is not None]
        return [*removes, *add_actions(self.staged.files), *unchanged]

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [Transaction(reprocess_app_id(self.plan.ingest_id, self.plan.batch), self.reprocess_from + 1)]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, () if self.engine else self.staged.files,
                                self.staged.rows_per_partition, self.findings,
                                ReprocessInfo(self.reprocess_from, self.removed, self.rewritten, self.requested_by))

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return reprocess_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return verify_reprocess(self.staged, table_uri, storage_options, self.removed)


