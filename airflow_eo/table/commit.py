"""Compare-and-set commit: one Delta commit holds a batch's files, its ``txn`` versions and its lineage.

One function, :func:`commit`, does every commit airflow-eo makes; its rule (a :class:`CommitRule`,
built by the table's sink: :mod:`airflow_eo.sinks`, one class per write mode and kind, each with its
own typed options) decides what is compared and what is set. This module holds the protocol step and
the pieces the rules are made of:

* ``BATCH`` (a new batch, :class:`airflow_eo.sinks.append.BatchCommit`): the table's offsets must be
  at the plan's starts (:func:`compare_offsets`); the commit adds the staged files and sets the offsets
  to the plan's ends and the batch counter to the plan's batch (:func:`offset_transactions`);
* ``REPROCESS`` (replace a committed batch's rows, :class:`airflow_eo.sinks.append.ReprocessCommit`):
  the batch's reprocess counter must be where the request found it (:func:`compare_reprocess_counter`);
  the commit removes the batch's files (and, after a compaction, replaces each file the batch shares
  with others by a copy without its rows), adds the new ones and moves the counter on by one; offsets
  do not move;
* ``DEAD_LETTERS`` (the dead-letter table, after the main commit decided:
  :class:`airflow_eo.sinks.dead_letters.DeadLetterCommit`): the dead-letter table's ``dlq`` counter
  must be below the batch; the commit adds the batch's dead letters and sets the counter to it, so a
  replay never writes them twice;
* a **merge** batch (``write_mode="merge"``, :class:`airflow_eo.sinks.merge.MergeCommit`) compares
  the offsets like ``BATCH`` and also the files: every file it rewrote (it held a key the batch
  changes) must still be in the snapshot, and no file added since the batch chose them may hold one
  of its keys; the commit removes the rewritten files and adds their copies and the batch's rows,
  with the offsets. Its reprocess (:class:`airflow_eo.sinks.merge.MergeReprocessCommit`, the newest
  batch only) compares the reprocess counter instead.

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
free, with every boundary it read unchanged (:func:`airflow_eo.core.intervals.fits`), it is **rebased**
(:func:`rebase`): it commits as the table's next batch, its staged directory renamed to that
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
that is no longer in the table (verified in ``tests/unit/sinks/test_merge.py``), which
would leave the compacted copy of a changed row beside its new version. Such a commit is
made with ``max_commit_retries=0`` (it lands only on the very snapshot it was compared on)
and, when the table moved, compared again on the new snapshot, a few times, before it gives
up with a retryable conflict. (The other order, a compaction committing after a merge that
removed one of its files, is refused by deltalake itself: the merge's removes are data changes.)

Example::

    >>> outcome = commit(sink.ingest_rule(StagedBatch(plan, files, rows, schema), attempt), table_uri)  # doctest: +SKIP
    >>> outcome.status, outcome.version
    ('committed', 12)
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Protocol

import pyarrow as pa
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import (
    AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions,
)

from airflow_eo.core.errors import CommitConflictError, StagedFilesMissingError, TableError, TableFeatureError
from airflow_eo.faults import failpoint
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan, CommitCheck, describe_mismatch
from airflow_eo.table.engine_merge import EngineMerge
from airflow_eo.table.features import TableFeatures, TableUse
from airflow_eo.table.files import TableFile, StagedFile
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.core.identity import id_mark, pack_stamp
from airflow_eo.table.app_ids import (
    batch_app_id, dead_letters_app_id, partition_app_id, stamp_app_id, topic_mark_app_id, topic_reset_app_id,
)
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.metadata import METADATA_KEY, BatchFindings, BatchMetadata, CommitKind
from airflow_eo.table.schema import add_columns, check_schema, delta_schema_of
from airflow_eo.table.staging import StagingArea, missing_staged

log = logging.getLogger(__name__)

# A commit's outcome, named as the run's result names it (airflow_eo.core.outcomes)
COMMITTED = RunStatus.COMMITTED
ALREADY_COMMITTED = RunStatus.ALREADY_COMMITTED
__all__ = ["ALREADY_COMMITTED", "COMMITTED", "CommitKind", "CommitOutcome", "CommitRule", "StagedBatch", "commit"]
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


def outcome_of(staged: StagedBatch, status: RunStatus, version: int | None) -> CommitOutcome:
    return CommitOutcome(status, staged.plan.batch, version, staged.rows, staged.rows_per_partition)


def add_actions(files) -> list[AddAction]:
    return [AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files]


def remove_action(file: TableFile, now_ms: int, names: ColumnNames | None = None) -> RemoveAction:
    """The remove of a snapshot's data file, its partition values keyed as the log keys them."""
    values = (names or ColumnNames()).physical_values(file.partition_values)
    return RemoveAction(file.path, True, now_ms, file.size, values)


def open_writable(table_uri: str, storage_options, ingest_id: str, adopt: bool = False) -> Ledger:
    ledger = Ledger.open(table_uri, storage_options)
    ledger.check_writable(ingest_id, adopt=adopt)
    return ledger


def check_features(staged: StagedBatch, ledger: Ledger, use: TableUse) -> None:
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


class EvolvingRule(Protocol):
    """A rule whose batch may add columns to the table (:func:`evolve_schema`)."""

    staged: StagedBatch
    plan: BatchPlan
    schema_evolution: bool
    adopt_table: bool

    def open(self, table_uri: str, storage_options) -> Ledger: ...
    def check(self, ledger: Ledger) -> CommitCheck: ...


class RebasingRule(Protocol):
    """A rule whose interval batch may commit under another number (:func:`rebase`)."""

    staged: StagedBatch
    plan: BatchPlan


def compare_offsets(plan: BatchPlan, ledger: Ledger, rebases: bool = False) -> CommitCheck:
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


def evolve_schema(rule: "EvolvingRule", ledger: Ledger, table_uri: str, storage_options) -> Ledger:
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


def rebase(rule: "RebasingRule", ledger: Ledger) -> None:
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


def offset_transactions(plan: BatchPlan, ledger: Ledger, findings: BatchFindings | None = None) -> list[Transaction]:
    """``BATCH``'s set: the offsets at the plan's ends (interval mode: its interval and
    boundaries), what identifies its topics, the batch counter and, when the batch staged dead
    letters (``findings``), the main table's mark of the last batch that did (their roll-forward
    goes up to it: :func:`airflow_eo.sinks.dead_letters.commit_dead_letters_of`)."""
    if plan.interval is not None:  # interval mode: the interval, its boundaries, high-water offsets
        txns = IntervalLedger(ledger, plan.ingest_id).transactions(plan)
    else:
        txns = [Transaction(partition_app_id(plan.ingest_id, r.tp), r.end) for r in plan.ranges]
    dead = findings.dead_letters if findings is not None else None
    marks = [Transaction(dead_letters_app_id(plan.ingest_id), plan.batch)] if dead is not None and dead.files else []
    return [*txns, *identity_transactions(plan), *marks, Transaction(batch_app_id(plan.ingest_id), plan.batch)]


def identity_transactions(plan: BatchPlan) -> list[Transaction]:
    """What identifies the topics the batch read, set with its offsets (:mod:`airflow_eo.core.identity`):
    each topic id's mark, each moved partition's fingerprint (0: none found, cleared) and, for a
    recreated topic read again from its start, the reset: the batch that did it, and the offsets and
    fingerprints of partitions the new topic no longer has cleared."""
    ingest, ends = plan.ingest_id, plan.ends
    txns: dict[str, int] = {topic_mark_app_id(ingest, topic): id_mark(topic_id) for topic, topic_id in plan.topic_ids}
    for tp, stamp in plan.stamps:
        packed = pack_stamp(stamp, ends[tp]) if stamp is not None and tp in ends else None
        txns[stamp_app_id(ingest, tp)] = packed or 0
    for reset in plan.resets:
        txns[topic_reset_app_id(ingest, reset.topic)] = plan.batch
        txns.setdefault(stamp_app_id(ingest, reset.tp), 0)  # the old topic's fingerprint says nothing of the new
        if reset.start is None:
            txns[partition_app_id(ingest, reset.tp)] = 0
    return [Transaction(app_id, version) for app_id, version in txns.items()]


def batch_lost_race(plan: BatchPlan, exc: Exception) -> CommitConflictError:
    return CommitConflictError(
        f"batch {plan.batch} of {plan.ingest_id} lost a race with another commit "
        f"({exc.__class__.__name__}: {exc}); nothing of this batch was committed and its files stay "
        "invisible. Run again: the next run plans from the new offsets"
    )


def verify_batch(staged: StagedBatch, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
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
    return outcome_of(staged, COMMITTED, record.version if record else ledger.version)


def compare_reprocess_counter(plan: BatchPlan, reprocess_from: int, ledger: Ledger) -> CommitCheck:
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


def reprocess_lost_race(plan: BatchPlan, exc: Exception) -> CommitConflictError:
    return CommitConflictError(
        f"the reprocess of batch {plan.batch} lost a race with another commit ({exc}); the "
        "batch's rows are unchanged. Retry the task"
    )


def verify_reprocess(staged: StagedBatch, table_uri: str, storage_options, removed: int) -> CommitOutcome:
    plan = staged.plan
    ledger = Ledger.open(table_uri, storage_options)
    record = ledger.find_batch(plan.ingest_id, attempt_id=plan.attempt_id)
    version = record.version if record else ledger.version
    log.info("reprocessed batch %s: removed %d files, added %d, version %s", plan.batch, removed,
             len(staged.files), version)
    return outcome_of(staged, COMMITTED, version)


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
            return outcome_of(staged, ALREADY_COMMITTED, ledger.version)
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
        check_staged(ledger, staged)
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
                return outcome_of(staged, ALREADY_COMMITTED, Ledger.open(table_uri, storage_options).version)
            if attempt < attempts:
                log.info("batch %s: the table moved while it committed (%s); comparing again on the new snapshot",
                         staged.plan.batch, exc.__class__.__name__)
                continue
            raise rule.lost_race(exc) from exc
        outcome = rule.verify(table_uri, storage_options, read_version)
        log.info("committed batch %s (%s) as table version %s", staged.plan.batch, rule.kind.value, outcome.version)
        return outcome
    raise AssertionError("unreachable: the last attempt returns or raises")


def check_staged(ledger: Ledger, staged: StagedBatch) -> None:
    """Every file the commit adds is still where the attempt staged it (a commit must never add a file
    that is gone: readers would fail on it). Another run's orphan collection, or a hand, may have
    deleted it; a retry stages the batch anew."""
    missing = missing_staged(ledger.location(), staged.files) if staged.files else []
    if missing:
        raise StagedFilesMissingError(
            f"{len(missing)} of the {len(staged.files)} file(s) batch {staged.plan.batch} staged in {ledger.table_uri} "
            f"are gone before its commit ({', '.join(missing[:3])}): deleted by hand or by another run's orphan "
            "collection (is staging_grace_seconds shorter than a batch on another host?). Nothing was committed; "
            "run again: the retry stages the batch anew")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]


