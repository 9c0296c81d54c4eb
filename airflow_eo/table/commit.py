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
  letters and sets the counter to it, so a replay never writes them twice;
* a **merge** batch (``write_mode="merge"``, :class:`MergeCommit`) compares the offsets like
  ``BATCH`` and also the files: every file it rewrote (it held a key the batch changes) must
  still be in the snapshot, and no file added since the batch chose them may hold one of its
  keys; the commit removes the rewritten files and adds their copies and the batch's rows,
  with the offsets. Its reprocess (:class:`MergeReprocessCommit`, the newest batch only)
  compares the reprocess counter instead.

Readers see a commit whole or not at all. What deltalake's conflict detection adds
(verified in ``tests/unit/table/test_commit.py::test_deltalake_conflict_detection_on_txn_app_ids``):
two commits carrying a ``txn`` for the same appId from the same snapshot conflict, and the
second fails with ``CommitFailedError``; commits with disjoint appIds are rebased and both
land. Every batch of one ingest writes the ``txn`` of every partition it planned and the
batch counter, so two batches of one ingest always conflict. delta-rs does not refuse a
``txn`` version that is already committed (delta-rs #2580, #3821): the compare is ours,
made on the snapshot the commit is made from.

An interval batch (``BATCH`` with a data interval) is keyed by its interval, not by the batch
number it was planned with: when other intervals landed since it was planned and its own is still
free, with every boundary it read unchanged (:func:`airflow_eo.intervals.fits`), it is **rebased**
(:func:`_rebase`): it commits as the table's next batch, its staged directory renamed to that
number, its interval ledger and high-water offsets set on the snapshot it commits on, and the
number it was planned with kept in its metadata (``planned_batch``); a commit that loses a race
to another interval is compared and rebased again on the new snapshot, without Spark. Only two
runs of the same interval conflict: the loser finds it committed (``already_committed``). A
batch that staged dead letters or dropped duplicates against the table is not rebased (its
dead-letter rows carry its planned number, and its duplicates were judged on the snapshot it
read): it conflicts, retryably, when the table moved. A rebased batch is prepared like any other on
the snapshot it commits on (the table's features checked again, its schema evolved), and only an
append through ``create_write_transaction`` is rebased: a commit through deltalake's MERGE
(:mod:`airflow_eo.table.engine_merge`) never is.

A table's first commit creates it, also made with ``max_commit_retries=0``: deltalake 1.6 would
otherwise land a second create of the same table as its next version, ``txn`` conflict or not
(two racing first batches both landed; see ``tests/unit/table/test_commit.py``).

A rule that removes files by what it read (``exact_snapshot``: the merge commits and the
reprocess) cannot be rebased: deltalake 1.6 rebases a commit over a compaction that removed the same file
without a conflict (its removes are ``dataChange=false``) and accepts a remove of a file
that is no longer in the table (verified in ``tests/unit/table/test_merge_commit.py``), which
would leave the compacted copy of a changed row beside its new version. Such a commit is
made with ``max_commit_retries=0`` (it lands only on the very snapshot it was compared on)
and, when the table moved, compared again on the new snapshot, a few times, before it gives
up with a retryable conflict. (The other order, a compaction committing after a merge that
removed one of its files, is refused by deltalake itself: the merge's removes are data changes.)

Example::

    >>> outcome = commit(BatchCommit(StagedBatch(plan, files, rows, schema)), table_uri)  # doctest: +SKIP
    >>> outcome.status, outcome.version
    ('committed', 12)
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import pyarrow as pa
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import (
    AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions,
)

from airflow_eo.errors import CommitConflictError, ConfigError, TableError, TableFeatureError
from airflow_eo.faults import failpoint
from airflow_eo.outcomes import RunStatus
from airflow_eo.planning import BatchPlan, CommitCheck, RunIdentity, describe_mismatch
from airflow_eo.table.features import TableFeatures, TableUse
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.spec import MergeSpec
from airflow_eo.table.ledger import (
    Ledger, batch_app_id, dlq_app_id, merge_app_id, merge_mark, partition_app_id, reprocess_app_id,
)
from airflow_eo.table.engine_merge import OFFSET_KEY, EngineMerge
from airflow_eo.table.files import TableFile
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.merge import DELETE_COLUMN, Rewrite, candidate_files, rewrite_file
from airflow_eo.table.metadata import METADATA_KEY, BatchFindings, BatchMetadata, CommitKind, MergeInfo, ReprocessInfo
from airflow_eo.table.schema import add_columns, check_schema, delta_schema_of
from airflow_eo.table.staging import (
    KEPT_SUFFIX, StagedFile, StagingArea, attempt_dir_name, attempt_dir_of,
)

log = logging.getLogger(__name__)

# A commit's outcome, named as the run's result names it (airflow_eo.outcomes)
COMMITTED = RunStatus.COMMITTED
ALREADY_COMMITTED = RunStatus.ALREADY_COMMITTED
__all__ = ["ALREADY_COMMITTED", "COMMITTED", "BatchCommit", "CommitKind", "CommitOutcome", "DeadLetterCommit",
           "FileSwap", "MergeCommit", "MergeReprocessCommit", "ReprocessCommit", "StagedBatch", "commit",
           "commit_dead_letters_of", "ensure_table"]
# An exact-snapshot rule compares again on a moved table this many times before it gives up.
EXACT_COMMIT_ATTEMPTS = 5
# A rebasing interval batch loses a race only to another interval's commit: at most once per run racing it.
REBASE_COMMIT_ATTEMPTS = 32


@dataclass(frozen=True)
class StagedBatch:
    """What an attempt staged for one commit: its plan, files and row counts."""

    plan: BatchPlan
    files: tuple[StagedFile, ...]
    rows_per_partition: dict[str, int] = field(default_factory=dict)
    arrow_schema: pa.Schema | None = None
    partition_by: tuple[str, ...] = ()  # of the table the batch creates; an existing table keeps its own
    # the table's features its rows were checked against (constraints, generated columns); None: no rows
    features: TableFeatures | None = None

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


def remove_action(file: TableFile, now_ms: int, names: ColumnNames | None = None) -> RemoveAction:
    """The remove of a snapshot's data file, its partition values keyed as the log keys them."""
    values = (names or ColumnNames()).physical_values(file.partition_values)
    return RemoveAction(file.path, True, now_ms, file.size, values)


def _open_writable(table_uri: str, storage_options, ingest_id: str, adopt: bool = False) -> Ledger:
    ledger = Ledger.open(table_uri, storage_options)
    ledger.check_writable(ingest_id, adopt=adopt)
    return ledger


def _check_features(staged: StagedBatch, ledger: Ledger, use: TableUse) -> None:
    """The commit's snapshot, like the plan's, allows ``use``; and its rows were checked against the
    rules it has now (another engine may have added a constraint while the batch ran: then a
    retry checks the rows again)."""
    ledger.check_features(use)
    if staged.features is None or ledger.table is None:
        return
    now, then = ledger.features, staged.features
    if (now.constraints, now.generated, now.engine_for(use), now.names) != \
            (then.constraints, then.generated, then.engine_for(use), then.names):
        raise CommitConflictError(
            f"the constraints, generated columns, change feed/deletion vectors or column mapping of {ledger.table_uri} "
            f"changed while batch {staged.plan.batch} ran (another engine altered the table); nothing was committed. "
            "Run again: the retry checks and writes the records for the table as it is now")


# What deltalake's commit refuses for a reason a retry cannot fix (a protocol or feature error, an
# append-only table): named so, never reported as a lost race. Everything else it raises as
# CommitFailedError is a conflict with another commit (delta-rs' TransactionError: "Tried committing
# existing table version", "Commit failed: a concurrent transaction…", "Metadata/Protocol changed
# since last commit", the retry budget) and is compared again / retried.
_REFUSED = re.compile(r"unsupported table features|table features must be specified|append-only|does not support "
                      r"(reader|writer) version|snapshot is corrupted|error serializing|invariant|constraint",
                      re.IGNORECASE)


def refused_by_engine(exc: Exception) -> bool:
    """Whether deltalake refused a commit for a reason a retry cannot fix.

    >>> refused_by_engine(CommitFailedError("Unsupported table features required: [RowTracking]"))
    True
    >>> refused_by_engine(CommitFailedError("Commit failed: a concurrent transactions added new data."))
    False
    """
    return bool(_REFUSED.search(str(exc)))


class CommitRule(Protocol):
    """One kind of commit: what it compares, what it sets and what it records."""

    kind: CommitKind
    staged: StagedBatch
    creates_table: bool
    table_properties: dict[str, str] | None
    exact_snapshot: bool  # commit only on the snapshot compared (no rebase by deltalake)
    engine: EngineMerge | None  # commit through deltalake's MERGE (:mod:`airflow_eo.table.engine_merge`), not actions

    def open(self, table_uri: str, storage_options) -> Ledger: ...
    def check(self, ledger: Ledger) -> CommitCheck: ...
    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger: ...
    def actions(self, ledger: Ledger) -> list: ...
    def transactions(self, ledger: Ledger) -> list[Transaction]: ...
    def metadata(self) -> BatchMetadata: ...
    def lost_race(self, exc: Exception) -> CommitConflictError: ...
    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome: ...


def _compare_offsets(plan: BatchPlan, ledger: Ledger, rebases: bool = False) -> CommitCheck:
    """``BATCH``'s compare: the table's offsets are at the plan's starts (or it is committed); an
    interval plan: its interval is free and its boundaries fit (``rebases``: on any later table
    state; else only on the one it was planned from)."""
    state = ledger.state_of(plan)
    last = ledger.last_batch(plan.ingest_id)
    if state is CommitCheck.CONFLICT and plan.interval is not None:
        raise CommitConflictError(
            f"batch {plan.batch} (interval {plan.interval}) of {plan.ingest_id} no longer fits the table: a "
            "committed interval overlaps it or fixed one of its boundaries at another offset (another run committed "
            f"meanwhile; last batch now {last}). Nothing was committed; run again to plan from the table")
    if state is CommitCheck.READY and plan.interval is not None and not rebases and last != plan.batch - 1:
        raise CommitConflictError(
            f"batch {plan.batch} (interval {plan.interval}) of {plan.ingest_id} was planned "
            f"from a table state that changed (last batch now {last}): another run committed in between, and "
            "this batch is not rebased (it staged dead letters, judged duplicates on the table it read, or merges by "
            "key). Nothing was committed; run again to plan from the table")
    if state is CommitCheck.CONFLICT:
        committed = ledger.committed_offsets(plan.ingest_id, plan.starts)
        raise CommitConflictError(
            f"batch {plan.batch} of {plan.ingest_id} was planned from offsets the table no longer "
            f"has ({describe_mismatch(plan, committed)}; last batch in table "
            f"{last}): another run committed in between. Nothing was "
            "committed; run again to plan from the table's current offsets"
        )
    return state


def _evolve_schema(rule: "BatchCommit | MergeCommit", ledger: Ledger, table_uri: str, storage_options) -> Ledger:
    """The batch's columns against the table's: refused, or (schema evolution) new ones added in a
    commit of their own, after which the offsets are compared again on the new snapshot."""
    if rule.staged.arrow_schema is None:  # boundaries only (an interval without records): no columns
        return ledger
    schema = delta_schema_of(rule.staged.arrow_schema)
    new_columns = check_schema(ledger, schema, rule.schema_evolution, adopted=rule.adopt_table)
    if not new_columns:
        return ledger
    if ledger.features.names.active:
        raise TableFeatureError(
            f"schema evolution cannot add {new_columns} to {ledger.table_uri}: it uses column mapping, where each new "
            "column needs a physical name and id, and deltalake 1.6 (airflow-eo's commit engine) adds none to such a "
            "table ('Column mapping is not supported for write operation ADD COLUMN yet', delta-io/delta-rs#930); "
            "add them with the engine that manages the table (Spark: ALTER TABLE … ADD COLUMNS), then run again; "
            "nothing was committed")
    add_columns(ledger, schema, new_columns, rule.plan)
    ledger = rule.open(table_uri, storage_options)
    rule.check(ledger)
    return ledger


def _rebase(rule: "BatchCommit", ledger: Ledger) -> None:
    """The rebase step of an interval batch (see the module doc): when other batches landed since it
    was planned (its compare found its interval free and its boundaries unchanged), it becomes the
    table's next batch. Its staged files move to that batch's directory first, so the directory
    still names the batch (reprocess, dedup and orphan collection read it from there)."""
    plan = rule.plan
    batch = ledger.last_batch(plan.ingest_id) + 1
    if batch == plan.batch:
        return
    files = StagingArea(ledger.location()).renumber(plan, batch, rule.staged.files)
    log.info("batch %s (interval %s): batches up to %s were committed since it was planned and its interval is still "
             "free: it commits as batch %s", plan.batch, plan.interval, batch - 1, batch)
    rule.staged = replace(rule.staged, plan=replace(plan, batch=batch), files=files)
    rule.plan = rule.staged.plan


def _offset_transactions(plan: BatchPlan, ledger: Ledger) -> list[Transaction]:
    """``BATCH``'s set: the offsets at the plan's ends (interval mode: its interval and
    boundaries) and the batch counter."""
    if plan.interval is not None:  # interval mode: the interval, its boundaries, high-water offsets
        txns = IntervalLedger(ledger, plan.ingest_id).transactions(plan)
    else:
        txns = [Transaction(partition_app_id(plan.ingest_id, r.tp), r.end) for r in plan.ranges]
    return [*txns, Transaction(batch_app_id(plan.ingest_id), plan.batch)]


def _batch_lost_race(plan: BatchPlan, exc: Exception) -> CommitConflictError:
    return CommitConflictError(
        f"batch {plan.batch} of {plan.ingest_id} lost a race with another commit "
        f"({exc.__class__.__name__}: {exc}); nothing of this batch was committed and its files stay "
        "invisible. Run again: the next run plans from the new offsets"
    )


def _verify_batch(staged: StagedBatch, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
    """Re-read the log: the plan's batch is in the table, and the commit is this attempt's."""
    plan = staged.plan
    ledger = Ledger.open(table_uri, storage_options)
    if ledger.state_of(plan) is not CommitCheck.ALREADY_COMMITTED:
        raise CommitConflictError(
            f"after committing batch {plan.batch} the table's offsets are "
            f"{ledger.committed_offsets(plan.ingest_id, plan.ends)}, not the plan's ends "
            f"{plan.ends}: another writer changed the table. Inspect it with `airflow-eo status`"
        )
    record = ledger.find_batch(plan.ingest_id, attempt_id=plan.attempt_id, since_version=(read_version or -1) + 1)
    return _outcome(staged, COMMITTED, record.version if record else ledger.version)


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
        return _open_writable(table_uri, storage_options, self.plan.ingest_id, self.adopt_table)

    def check(self, ledger: Ledger) -> CommitCheck:
        return _compare_offsets(self.plan, ledger, self.rebases)

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        # a table made since planning
        ledger.check_writable(self.plan.ingest_id, self.staged.partition_by, adopt=self.adopt_table)
        # the features of the snapshot it commits on (a rebased batch's too: rebasing keeps the rows' checks)
        _check_features(self.staged, ledger, TableUse.APPEND)
        ledger = _evolve_schema(self, ledger, table_uri, storage_options)
        if self.rebases:
            _rebase(self, ledger)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return add_actions(self.staged.files)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return _offset_transactions(self.plan, ledger)

    def metadata(self) -> BatchMetadata:
        meta = BatchMetadata.of(self.kind, self.plan, self.staged.files, self.staged.rows_per_partition, self.findings)
        return meta if self.plan.batch == self.planned_batch else replace(meta, planned_batch=self.planned_batch)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return _batch_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return _verify_batch(self.staged, table_uri, storage_options, read_version)


def _compare_reprocess_counter(plan: BatchPlan, reprocess_from: int, ledger: Ledger) -> CommitCheck:
    """``REPROCESS``'s compare: the batch's reprocess counter is where the request found it."""
    counter = ledger.reprocess_count(plan.ingest_id, plan.batch)
    if counter == reprocess_from:
        return CommitCheck.READY
    if counter == reprocess_from + 1 and ledger.find_batch(plan.ingest_id, attempt_id=plan.attempt_id):
        return CommitCheck.ALREADY_COMMITTED
    raise CommitConflictError(
        f"batch {plan.batch} was reprocessed by another run meanwhile (reprocess counter {counter}, "
        f"expected {reprocess_from}); this reprocess committed nothing. Its rows are already "
        "replaced: check the table history before reprocessing again"
    )


def _reprocess_lost_race(plan: BatchPlan, exc: Exception) -> CommitConflictError:
    return CommitConflictError(
        f"the reprocess of batch {plan.batch} lost a race with another commit ({exc}); the "
        "batch's rows are unchanged. Retry the task"
    )


def _verify_reprocess(staged: StagedBatch, table_uri: str, storage_options, removed: int) -> CommitOutcome:
    plan = staged.plan
    ledger = Ledger.open(table_uri, storage_options)
    record = ledger.find_batch(plan.ingest_id, attempt_id=plan.attempt_id)
    version = record.version if record else ledger.version
    log.info("reprocessed batch %s: removed %d files, added %d, version %s", plan.batch, removed,
             len(staged.files), version)
    return _outcome(staged, COMMITTED, version)


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
        return _open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        return _compare_reprocess_counter(self.plan, self.reprocess_from, ledger)

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        _check_features(self.staged, ledger, TableUse.REPROCESS)
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
        return _reprocess_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return _verify_reprocess(self.staged, table_uri, storage_options, self.removed)


class DeadLetterCommit:
    """``DEAD_LETTERS``: on the dead-letter table, once per batch, after the main commit."""

    kind = CommitKind.DEAD_LETTERS
    creates_table = False
    table_properties: dict[str, str] | None = None
    exact_snapshot = False
    engine: EngineMerge | None = None

    def __init__(self, staged: StagedBatch):
        self.staged, self.plan = staged, staged.plan

    def open(self, table_uri: str, storage_options) -> Ledger:
        ledger = Ledger.open(table_uri, storage_options)
        if not ledger.exists:
            raise TableError(f"the dead-letter table {table_uri} does not exist: it is created when a batch "
                             "stages dead letters; nothing was committed")
        ledger.check_features(TableUse.APPEND)
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
        return _open_writable(table_uri, storage_options, self.plan.ingest_id, self.adopt_table)

    def check(self, ledger: Ledger) -> CommitCheck:
        state = _compare_offsets(self.plan, ledger)
        if state is CommitCheck.READY and self.plan.interval is not None:
            IntervalLedger(ledger, self.plan.ingest_id).check_merge_order(self.plan.interval)
        return state

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        ledger.check_writable(self.plan.ingest_id, self.staged.partition_by, self.merge, adopt=self.adopt_table)
        _check_features(self.staged, ledger, TableUse.MERGE)
        ledger = _evolve_schema(self, ledger, table_uri, storage_options)
        if self.engine is None:  # the MERGE reads the snapshot it commits on itself
            self.swap.check(ledger, self.plan)
        return ledger

    def actions(self, ledger: Ledger) -> list:
        return [] if self.engine is not None else self.swap.actions(self.staged.files, ledger.features.names)

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        return [*_offset_transactions(self.plan, ledger),
                Transaction(merge_app_id(self.plan.ingest_id), merge_mark(self.merge.key))]

    def metadata(self) -> BatchMetadata:
        return BatchMetadata.of(self.kind, self.plan, () if self.engine else self.staged.files,
                                self.staged.rows_per_partition, self.findings, merge=self.info)

    def lost_race(self, exc: Exception) -> CommitConflictError:
        return _batch_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return _verify_batch(self.staged, table_uri, storage_options, read_version)


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
        return _open_writable(table_uri, storage_options, self.plan.ingest_id)

    def check(self, ledger: Ledger) -> CommitCheck:
        state = _compare_reprocess_counter(self.plan, self.reprocess_from, ledger)
        last = ledger.last_batch(self.plan.ingest_id)
        if state is CommitCheck.READY and last != self.plan.batch:
            raise ConfigError(newest_only(self.plan.batch, last, ledger.table_uri))
        return state

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        ledger.check_write_mode(self.plan.ingest_id, self.merge)
        _check_features(self.staged, ledger, TableUse.REPROCESS)
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
        return _reprocess_lost_race(self.plan, exc)

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        return _verify_reprocess(self.staged, table_uri, storage_options, len(self.swap.rewrites))


def newest_only(batch: int, last: int, table_uri: str) -> str:
    """Why a merge table's batch other than the newest is not reprocessed (one line)."""
    return (f"reprocess of batch {batch} refused: {table_uri} is a merge table and its newest batch is {last}; later "
            "batches may have changed or deleted the keys batch "
            f"{batch} wrote, and replaying it would put older values over newer ones (only the newest batch can be "
            "reprocessed); nothing was changed")


def commit(rule: CommitRule, table_uri: str, storage_options: dict | None = None) -> CommitOutcome:
    """Commit ``rule.staged`` to the table if the table is where the attempt found it (see module doc).

    Returns ``committed`` or ``already_committed`` (an earlier attempt landed it); raises
    :class:`CommitConflictError` when another run moved the table.
    """
    attempts = EXACT_COMMIT_ATTEMPTS if rule.exact_snapshot else \
        REBASE_COMMIT_ATTEMPTS if getattr(rule, "rebases", False) else 1
    for attempt in range(1, attempts + 1):
        staged = rule.staged
        ledger = rule.open(table_uri, storage_options)
        if rule.check(ledger) is CommitCheck.ALREADY_COMMITTED:
            log.info("batch %s was committed before (%s): committing nothing", staged.plan.batch, rule.kind.value)
            return _outcome(staged, ALREADY_COMMITTED, ledger.version)
        ledger = rule.prepare(ledger, table_uri, storage_options)
        staged = rule.staged  # a rebase renumbers it
        actions = rule.actions(ledger)  # before the metadata, which counts what they remove
        # only on the compared snapshot: an exact-snapshot rule, deltalake's MERGE, a table's creation
        # (it lands only as its version 0; see the module doc)
        once = rule.exact_snapshot or rule.engine is not None or ledger.table is None
        properties = CommitProperties(custom_metadata={METADATA_KEY: rule.metadata().to_json()},
                                      app_transactions=rule.transactions(ledger),
                                      max_commit_retries=0 if once else None)
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
                if ledger.table is None:  # only rules that create tables commit to a path without one
                    raise TableError(f"there is no Delta table at {ledger.table_uri} to commit batch "
                                     f"{staged.plan.batch} to; nothing was committed")
                if rule.engine is not None:  # deltalake's MERGE: deletion vectors, change data files
                    rule.engine.write(ledger.table, ledger.location(), staged.files, staged.arrow_schema, properties)
                else:
                    ledger.table.create_write_transaction(actions, mode="append", schema=ledger.table.schema(),
                                                          commit_properties=properties)
        except (CommitFailedError, DeltaError) as exc:
            if refused_by_engine(exc):  # a retry would be refused the same way: not a race
                raise TableFeatureError(f"the Delta engine refused batch {staged.plan.batch}'s commit to "
                                        f"{ledger.table_uri} ({_first_line(exc)}); nothing was committed. The table "
                                        "needs what airflow-eo cannot write: see docs/how-to/shared-tables.md") from exc
            if not (isinstance(exc, CommitFailedError) or "already exists" in str(exc).lower()):
                raise TableError(f"committing batch {staged.plan.batch} to {ledger.table_uri} failed: {exc}. Nothing "
                                 "was committed; fix the cause and retry the run") from exc
            # Lost a race (or the table appeared meanwhile): decide from the table, not the error.
            if rule.check(rule.open(table_uri, storage_options)) is CommitCheck.ALREADY_COMMITTED:
                log.info("batch %s: another commit holds it now (%s): committing nothing", staged.plan.batch,
                         exc.__class__.__name__)
                return _outcome(staged, ALREADY_COMMITTED, Ledger.open(table_uri, storage_options).version)
            if attempt < attempts:
                log.info("batch %s: the table moved while it committed (%s); comparing again on the new snapshot",
                         staged.plan.batch, exc.__class__.__name__)
                continue
            raise rule.lost_race(exc) from exc
        outcome = rule.verify(table_uri, storage_options, read_version)
        log.info("committed batch %s (%s) as table version %s", staged.plan.batch, rule.kind.value, outcome.version)
        return outcome
    raise AssertionError("unreachable: the last attempt returns or raises")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]


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
    if record is None or manifest is None or not manifest.files:
        return None
    plan = BatchPlan(ingest_id, last, record.meta.ranges, record.meta.run, attempt_id=record.meta.attempt_id)
    return commit(DeadLetterCommit(StagedBatch(plan, manifest.files)), manifest.uri, storage_options).status


def ensure_table(table_uri: str, arrow_schema: pa.Schema, storage_options: dict | None = None) -> None:
    """Create an empty table (the dead-letter table) if there is none; safe when runs race."""
    from deltalake import DeltaTable

    try:
        DeltaTable.create(table_uri, delta_schema_of(arrow_schema), mode="ignore", storage_options=storage_options)
    except DeltaError as exc:  # another run created it between our check and our commit
        if "already exists" not in str(exc).lower():
            raise
