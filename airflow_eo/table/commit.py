"""Compare-and-set commit: one Delta commit holds a batch's files, its ``txn`` versions and its lineage.

One function, :func:`commit`, does every commit airflow-eo makes; its rule (one class per
:class:`CommitKind`, each built with its own typed options) decides what is compared and
what is set:

* ``BATCH`` (a new batch): the table's offsets must be at the plan's starts; the commit
  adds the staged files and sets the offsets to the plan's ends and the batch counter to
  the plan's batch;
* ``REPROCESS`` (replace a committed batch's rows): the batch's reprocess counter must
  be where the request found it; the commit removes the batch's files (and, after a
  compaction, replaces each file the batch shares with others by a copy without its rows),
  adds the new ones and moves the counter on by one; offsets do not move;
* ``DEAD_LETTERS`` (the dead-letter table, after the main commit decided): the dead-letter
  table's ``dlq`` counter must be below the batch; the commit adds the batch's dead
  letters and sets the counter to it, so a replay never writes them twice.

Readers see a commit whole or not at all. What deltalake's conflict detection adds
(verified in ``tests/unit/table/test_commit.py::test_deltalake_conflict_detection_on_txn_app_ids``):
two commits carrying a ``txn`` for the same appId from the same snapshot conflict, and the
second fails with ``CommitFailedError``; commits with disjoint appIds are rebased and both
land. Every batch of one ingest writes the ``txn`` of every partition it planned and the
batch counter, so two batches of one ingest always conflict. delta-rs does not refuse a
``txn`` version that is already committed (delta-rs #2580, #3821): the compare is ours,
made on the snapshot the commit is made from.

Example::

    >>> outcome = commit(BatchCommit(StagedBatch(plan, files, rows, schema)), table_uri)  # doctest: +SKIP
    >>> outcome.status, outcome.version
    ('committed', 12)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import (
    AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions,
)

from airflow_eo.errors import CommitConflictError, TableError
from airflow_eo.faults import failpoint
from airflow_eo.outcomes import RunStatus
from airflow_eo.planning import BatchPlan, CommitCheck, RunIdentity, describe_mismatch
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger, batch_app_id, dlq_app_id, partition_app_id, reprocess_app_id
from airflow_eo.table.metadata import METADATA_KEY, BatchFindings, BatchMetadata, CommitKind, ReprocessInfo
from airflow_eo.table.partitioning import partition_values_of
from airflow_eo.table.schema import add_columns, check_schema, delta_schema_of
from airflow_eo.table.staging import KEPT_SUFFIX, StagedFile, attempt_dir_name, attempt_dir_of, rewrite_without

log = logging.getLogger(__name__)

# A commit's outcome, named as the run's result names it (airflow_eo.outcomes)
COMMITTED = RunStatus.COMMITTED
ALREADY_COMMITTED = RunStatus.ALREADY_COMMITTED
__all__ = ["ALREADY_COMMITTED", "COMMITTED", "BatchCommit", "CommitKind", "CommitOutcome", "DeadLetterCommit",
           "ReprocessCommit", "StagedBatch", "commit", "commit_dead_letters_of", "ensure_table"]


@dataclass(frozen=True)
class StagedBatch:
    """What an attempt staged for one commit: its plan, files and row counts."""

    plan: BatchPlan
    files: tuple[StagedFile, ...]
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    arrow_schema: pa.Schema | None = None
    partition_by: tuple[str, ...] = ()  # of the table the batch creates; an existing table keeps its own

    @property
    def rows(self) -> int:
        return sum(self.rows_per_partition.values())


@dataclass(frozen=True)
class CommitOutcome:
    status: RunStatus
    batch: int
    version: int | None
    rows: int = 0
    rows_per_partition: dict[str, int] = field(default_factory=dict)


def _outcome(staged: StagedBatch, status: RunStatus, version: int | None) -> CommitOutcome:
    return CommitOutcome(status, staged.plan.batch, version, staged.rows, staged.rows_per_partition)


def add_actions(files) -> list[AddAction]:
    return [AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files]


def _open_writable(table_uri: str, storage_options, ingest_id: str) -> Ledger:
    ledger = Ledger.open(table_uri, storage_options)
    ledger.check_writable(ingest_id)
    return ledger


class CommitRule(Protocol):
    """One kind of commit: what it compares, what it sets and what it records."""

    kind: CommitKind
    staged: StagedBatch
    creates_table: bool
    table_properties: dict[str, str] | None

    def open(self, table_uri: str, storage_options) -> Ledger: ...
    def check(self, ledger: Ledger) -> CommitCheck: ...
    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger: ...
    def actions(self, ledger: Ledger) -> list: ...
    def transactions(self, ledger: Ledger) -> list[Transaction]: ...
    def metadata(self) -> BatchMetadata: ...
    def lost_race(self, exc: Exception) -> CommitConflictError: ...
    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome: ...


class BatchCommit:
    """``BATCH``: compare the offsets, set them to the plan's ends."""

    kind = CommitKind.BATCH
    creates_table = True

    def __init__(self, staged: StagedBatch, *, findings: BatchFindings | None = None, schema_evolution: bool = False,
                 table_properties: dict[str, str] | None = None):
        self.staged, self.plan = staged, staged.plan
        self.findings = findings or BatchFindings()
        self.schema_evolution, self.table_properties = schema_evolution, table_properties or None

    def open(self, table_uri: str, storage_options) -> Ledger:
        return _open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        state = ledger.state_of(self.plan)
        if state is CommitCheck.CONFLICT and self.plan.interval is not None:
            raise CommitConflictError(
                f"batch {self.plan.batch} (interval {self.plan.interval}) of {self.plan.ingest_id} was planned "
                f"from a table state that changed (last batch now {ledger.last_batch(self.plan.ingest_id)}): "
                "another run committed in between. Nothing was committed; run again to plan from the table")
        if state is CommitCheck.CONFLICT:
            plan = self.plan
            committed = ledger.committed_offsets(plan.ingest_id, plan.starts)
            raise CommitConflictError(
                f"batch {plan.batch} of {plan.ingest_id} was planned from offsets the table no longer "
                f"has ({describe_mismatch(plan, committed)}; last batch in table "
                f"{ledger.last_batch(plan.ingest_id)}): another run committed in between. Nothing was "
                "committed; run again to plan from the table's current offsets"
            )
        return state

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        ledger.check_writable(self.plan.ingest_id, self.staged.partition_by)  # a table made since planning
        if self.staged.arrow_schema is None:  # boundaries only (an interval without records): no columns
            return ledger
        schema = delta_schema_of(self.staged.arrow_schema)
        new_columns = check_schema(ledger, schema, self.schema_evolution)
        if not new_columns:
            return ledger
        add_columns(ledger, schema, new_columns, self.plan)
        ledger = self.open(table_uri, storage_options)
        self.check(ledger)  # the offsets are compared again on the snapshot the data commit uses
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return add_actions(self.staged.files)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        if self.plan.interval is not None:  # interval mode: the interval, its boundaries, high-water offsets
            txns = IntervalLedger(ledger, self.plan.ingest_id).transactions(self.plan)
        else:
            txns = [Transaction(partition_app_id(self.plan.ingest_id, r.tp), r.end) for r in self.plan.ranges]
        return [*txns, Transaction(batch_app_id(self.plan.ingest_id), self.plan.batch)]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, self.staged.files, self.staged.rows_per_partition, self.findings)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return CommitConflictError(
            f"batch {self.plan.batch} of {self.plan.ingest_id} lost a race with another commit "
            f"({exc.__class__.__name__}: {exc}); nothing of this batch was committed and its files stay "
            "invisible. Run again: the next run plans from the new offsets"
        )

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        """Re-read the log: the plan's batch is in the table, and the commit is this attempt's."""
        ledger = Ledger.open(table_uri, storage_options)
        if ledger.state_of(self.plan) is not CommitCheck.ALREADY_COMMITTED:
            raise CommitConflictError(
                f"after committing batch {self.plan.batch} the table's offsets are "
                f"{ledger.committed_offsets(self.plan.ingest_id, self.plan.ends)}, not the plan's ends "
                f"{self.plan.ends}: another writer changed the table. Inspect it with `airflow-eo status`"
            )
        record = ledger.find_batch(self.plan.ingest_id, attempt_id=self.plan.attempt_id,
                                   since_version=(read_version or -1) + 1)
        return _outcome(self.staged, COMMITTED, record.version if record else ledger.version)


class ReprocessCommit:
    """``REPROCESS``: compare the batch's reprocess counter, replace its files."""

    kind = CommitKind.REPROCESS
    creates_table = False
    table_properties = None

    def __init__(self, staged: StagedBatch, *, reprocess_from: int, requested_by: RunIdentity | None = None,
                 findings: BatchFindings | None = None):
        self.staged, self.plan = staged, staged.plan
        self.reprocess_from, self.requested_by = int(reprocess_from), requested_by
        self.findings = findings or BatchFindings()
        self.removed = self.rewritten = 0

    def open(self, table_uri: str, storage_options) -> Ledger:
        return _open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        counter = ledger.reprocess_count(self.plan.ingest_id, self.plan.batch)
        if counter == self.reprocess_from:
            return CommitCheck.READY
        if counter == self.reprocess_from + 1 and ledger.find_batch(self.plan.ingest_id,
                                                                    attempt_id=self.plan.attempt_id):
            return CommitCheck.ALREADY_COMMITTED
        raise CommitConflictError(
            f"batch {self.plan.batch} was reprocessed by another run meanwhile (reprocess counter {counter}, "
            f"expected {self.reprocess_from}); this reprocess committed nothing. Its rows are already "
            "replaced: check the table history before reprocessing again"
        )

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        check_schema(ledger, delta_schema_of(self.staged.arrow_schema), replacing=True)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        """Remove the batch's own files; rewrite files it shares with other batches (after a
        compaction) without its rows; add the new rows. One commit, so readers see either."""
        new_dir = attempt_dir_name(self.plan)
        now_ms = int(time.time() * 1000)
        whole, mixed = ledger.files_of_batch(self.plan.batch, self.plan.ranges)
        whole = {path: size for path, size in whole.items() if attempt_dir_of(path) != new_dir}
        # Not in the attempt's own directory: these copies hold other batches' rows, so they must
        # stay "shared" files for later reprocesses (found by their stats, never removed whole).
        # Uncommitted, they are orphans like any attempt's files (the collector's "b…-…" rule).
        kept = [rewrite_without(ledger.location(), path, self.plan.ranges, new_dir + KEPT_SUFFIX) for path in mixed]
        removes = [RemoveAction(path, True, now_ms, size, partition_values_of(path))
                   for path, size in {**whole, **mixed}.items()]
        self.removed, self.rewritten = len(removes), len(mixed)
        # the other batches' rows, copied out of shared files: not a change of data
        unchanged = [AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, False, f.stats)
                     for f in kept if f]
        return [*removes, *add_actions(self.staged.files), *unchanged]

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [Transaction(reprocess_app_id(self.plan.ingest_id, self.plan.batch), self.reprocess_from + 1)]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, self.staged.files, self.staged.rows_per_partition,
                                self.findings, ReprocessInfo(self.reprocess_from, self.removed, self.rewritten,
                                                             self.requested_by))

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return CommitConflictError(
            f"the reprocess of batch {self.plan.batch} lost a race with another commit ({exc}); the "
            "batch's rows are unchanged. Retry the task"
        )

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        ledger = Ledger.open(table_uri, storage_options)
        record = ledger.find_batch(self.plan.ingest_id, attempt_id=self.plan.attempt_id)
        version = record.version if record else ledger.version
        log.info("reprocessed batch %s: removed %d files, added %d, version %s", self.plan.batch, self.removed,
                 len(self.staged.files), version)
        return _outcome(self.staged, COMMITTED, version)


class DeadLetterCommit:
    """``DEAD_LETTERS``: on the dead-letter table, once per batch, after the main commit."""

    kind = CommitKind.DEAD_LETTERS
    creates_table = False
    table_properties = None

    def __init__(self, staged: StagedBatch):
        self.staged, self.plan = staged, staged.plan

    def open(self, table_uri: str, storage_options) -> Ledger:
        ledger = Ledger.open(table_uri, storage_options)
        if not ledger.exists:
            raise TableError(f"the dead-letter table {table_uri} does not exist: it is created when a batch "
                             "stages dead letters; nothing was committed")
        return ledger

    def check(self, ledger: Ledger) -> CommitCheck:
        if ledger.transaction(dlq_app_id(self.plan.ingest_id)) >= self.plan.batch:
            return CommitCheck.ALREADY_COMMITTED
        missing = [f.path for f in self.staged.files if not ledger.location().exists(f.path)]
        if missing:
            raise TableError(
                f"the dead letters of committed batch {self.plan.batch} of {self.plan.ingest_id} cannot be "
                f"committed to {ledger.table_uri}: their staged files are gone ({', '.join(missing[:3])}), "
                "deleted by hand or by a VACUUM of the dead-letter table. Reprocess that batch to rebuild "
                "them, or accept the loss"
            )
        return CommitCheck.READY

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return add_actions(self.staged.files)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [Transaction(dlq_app_id(self.plan.ingest_id), self.plan.batch)]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, self.staged.files)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return CommitConflictError(
            f"the dead letters of batch {self.plan.batch} of {self.plan.ingest_id} lost a race with another "
            f"commit ({exc.__class__.__name__}: {exc}); nothing of them was committed. Run again"
        )

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        log.info("batch %s: %s dead-letter file(s) committed to %s", self.plan.batch, len(self.staged.files),
                 table_uri)
        return _outcome(self.staged, COMMITTED, Ledger.open(table_uri, storage_options).version)


def commit(rule: CommitRule, table_uri: str, storage_options: dict | None = None) -> CommitOutcome:
    """Commit ``rule.staged`` to the table if the table is where the attempt found it (see module doc).

    Returns ``committed`` or ``already_committed`` (an earlier attempt landed it); raises
    :class:`CommitConflictError` when another run moved the table.
    """
    staged = rule.staged
    ledger = rule.open(table_uri, storage_options)
    if rule.check(ledger) is CommitCheck.ALREADY_COMMITTED:
        log.info("batch %s was committed before (%s): committing nothing", staged.plan.batch, rule.kind.value)
        return _outcome(staged, ALREADY_COMMITTED, ledger.version)
    ledger = rule.prepare(ledger, table_uri, storage_options)
    actions = rule.actions(ledger)  # before the metadata, which counts what they remove
    properties = CommitProperties(custom_metadata={METADATA_KEY: rule.metadata().to_json()},
                                  app_transactions=rule.transactions(ledger))
    read_version = ledger.version
    failpoint("during_commit")  # compare done, Delta write not yet issued: the narrowest window
    try:
        if ledger.table is None and rule.creates_table:
            create_table_with_add_actions(ledger.table_uri, delta_schema_of(staged.arrow_schema),
                                          actions, mode="error", partition_by=list(staged.partition_by) or None,
                                          storage_options=storage_options,
                                          configuration=rule.table_properties or None,
                                          commit_properties=properties)
        else:
            ledger.table.create_write_transaction(actions, mode="append", schema=ledger.table.schema(),
                                                  commit_properties=properties)
    except (CommitFailedError, DeltaError) as exc:
        if not (isinstance(exc, CommitFailedError) or "already exists" in str(exc).lower()):
            raise TableError(f"committing batch {staged.plan.batch} to {ledger.table_uri} failed: {exc}. Nothing "
                             "was committed; fix the cause and retry the run") from exc
        # Lost a race (or the table appeared meanwhile): decide from the table, not the error.
        if rule.check(rule.open(table_uri, storage_options)) is CommitCheck.ALREADY_COMMITTED:
            return _outcome(staged, ALREADY_COMMITTED, Ledger.open(table_uri, storage_options).version)
        raise rule.lost_race(exc) from exc
    outcome = rule.verify(table_uri, storage_options, read_version)
    log.info("committed batch %s (%s) as table version %s", staged.plan.batch, rule.kind.value, outcome.version)
    return outcome


def commit_dead_letters_of(ledger: Ledger, ingest_id: str, storage_options: dict | None = None) -> RunStatus | None:
    """Roll the dead-letter commit of the table's last batch forward if it is missing.

    The main commit records its staged dead-letter files (``dead_letters`` in its metadata);
    this commits them to the dead-letter table. Earlier batches are always complete: every run
    does this before it plans. Returns the outcome's status, or None when the last batch has
    no dead letters.
    """
    last = ledger.last_batch(ingest_id)
    record = ledger.find_batch(ingest_id, batch=last, operation=CommitKind.BATCH) if last else None
    manifest = record.meta.findings.dead_letters if record else None
    if manifest is None or not manifest.files:
        return None
    plan = BatchPlan(ingest_id, last, record.ranges, record.meta.run, attempt_id=record.attempt_id)
    return commit(DeadLetterCommit(StagedBatch(plan, manifest.files)), manifest.uri, storage_options).status


def ensure_table(table_uri: str, arrow_schema: pa.Schema, storage_options: dict | None = None) -> None:
    """Create an empty table (the dead-letter table) if there is none; safe when runs race."""
    from deltalake import DeltaTable

    try:
        DeltaTable.create(table_uri, delta_schema_of(arrow_schema), mode="ignore", storage_options=storage_options)
    except DeltaError as exc:  # another run created it between our check and our commit
        if "already exists" not in str(exc).lower():
            raise
