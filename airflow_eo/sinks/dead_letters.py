"""The dead-letter table: a sink of the same kind, committed after the main table's batch decided.

A batch's undecodable records (and, if asked, its dropped duplicates and rule violations) are staged
by the driver (:mod:`airflow_eo.driver.dead_letters`) beside the dead-letter table; the main commit
records them (``dead_letters`` in its metadata, and the batch in the main table's
``…:dead-letters:last`` mark) and :func:`commit_dead_letters_of` then commits them with
:class:`DeadLetterCommit` — once per batch, in batch order (the dead-letter table's ``dlq`` counter
only moves past a batch by committing its dead letters), rolled forward by the driver's own follow-up,
the run's verify and every later run, whatever committed in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from deltalake.exceptions import DeltaError
from deltalake.transaction import Transaction

from dataclasses import replace

from airflow_eo.attempt import Attempt, AttemptKind
from airflow_eo.core.errors import CommitConflictError, TableError, TableFeatureError
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.table.commit import COMMITTED, CommitOutcome, StagedBatch, add_actions, commit, outcome_of
from airflow_eo.table.engine_merge import EngineMerge
from airflow_eo.sinks.base import Sink
from airflow_eo.table.features import ConstraintKind, TableUse
from airflow_eo.faults import failpoint
from airflow_eo.table.app_ids import dead_letters_app_id, dlq_app_id
from airflow_eo.table.ledger import BatchRecord, Ledger
from airflow_eo.sinks.append import ReprocessCommit
from airflow_eo.table.metadata import BatchFindings, BatchMetadata, CommitKind, DeadLetterManifest
from airflow_eo.table.schema import delta_schema_of
from airflow_eo.table.staging import missing_staged

log = logging.getLogger(__name__)


class DeadLetterSink(Sink):
    """The ingest's dead-letter table (``dead_letter_table_uri``): appended to once per batch that has
    dead letters, after the main table's commit; never chosen by a write mode."""

    kind = "dead_letters"  # a sink no write mode chooses
    use = TableUse.APPEND

    @property
    def table_uri(self) -> str | None:
        return self.spec.dead_letters.table_uri

    def check_table(self, ledger: Ledger, ingest_id: str = "") -> None:
        """The dead-letter table, if there is one yet, takes appends (its features allow them)."""
        ledger.check_features(TableUse.APPEND)
        # dead letters are staged with their own column names and checked against no rule (a NOT NULL column
        # is one the dead letters' own schema declares: the table is created from it)
        rules = [c for c in ledger.features.constraints if c.kind is not ConstraintKind.NOT_NULL]
        what = "column mapping" if ledger.features.names.active else \
            "constraints or generated columns" if rules or ledger.features.generated else None
        if what is not None:
            raise TableFeatureError(
                f"the dead-letter table {ledger.table_uri} has {what}, which airflow-eo does not write dead letters "
                "with: give a dead-letter table without them; nothing was changed")

    def ingest_rule(self, staged: StagedBatch, attempt: Attempt | None = None, findings: BatchFindings | None = None,
                    extra: Any = None) -> "DeadLetterCommit":
        return DeadLetterCommit(staged)

    @staticmethod
    def follow(attempt: Attempt, findings: BatchFindings, table_uri: str, batch: int,
               storage_options: dict | None = None) -> None:
        """After the main table's commit of ``batch`` decided: its dead letters follow (an earlier attempt's,
        if that one committed), and with them any earlier batch's the dead-letter table still misses. A
        reprocess's replace the batch's earlier ones (:func:`commit_reprocessed_dead_letters`)."""
        manifest = findings.dead_letters
        if manifest is None or not manifest.uri:
            return
        failpoint("before_dead_letters")  # the main commit landed, its dead letters not yet
        main, ingest_id = Ledger.open(table_uri, storage_options), attempt.plan.ingest_id
        if attempt.kind is AttemptKind.REPROCESS:
            assert attempt.reprocess_from is not None  # a reprocess attempt carries it
            commit_reprocessed_dead_letters(main, replace(attempt.plan, batch=batch), attempt.reprocess_from,
                                            manifest, storage_options)
        else:
            commit_dead_letters_of(main, ingest_id, manifest.uri, storage_options, upto=batch)


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
        missing = missing_staged(ledger.location(), self.staged.files)
        if missing:
            plan = self.plan
            raise TableError(
                f"the dead letters of committed batch {plan.batch} of {plan.ingest_id} "
                f"({sum(f.num_records for f in self.staged.files)} records of {', '.join(map(str, plan.data_ranges))}) "
                f"cannot be committed to {ledger.table_uri}: their staged files are gone ({', '.join(missing[:3])}), "
                "deleted by hand, by a VACUUM of the dead-letter table or by orphan collection. Reprocess that batch "
                f"(`airflow-eo reprocess --run-key {plan.run.run_key or '<its run key>'}`): it stages them again and "
                "commits them; `airflow-eo audit --dead-letter-table …` lists the offsets in neither table"
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
        return outcome_of(self.staged, COMMITTED, Ledger.open(table_uri, storage_options).version)




def pending_dead_letters(ledger: Ledger, ingest_id: str, counter: Callable[[], int],
                         upto: int | None = None) -> list[BatchRecord]:
    """The batches of ``ingest_id`` after the dead-letter table's ``counter()`` (up to ``upto``) whose
    dead letters it does not hold yet, oldest first, from the main table's log.

    The main table's mark (``…:dead-letters:last``, a ``txn``) names the last batch that staged dead
    letters: at or below the counter, nothing is pending and no history is read. Else the log is read
    back from the newest commit until the counter (a batch the log no longer holds was rolled forward by
    the runs after it: each run rolls forward before it plans). A table whose commits predate the mark is
    read as before it: its last batch only."""
    mark = ledger.transaction(dead_letters_app_id(ingest_id))
    last = ledger.last_batch(ingest_id)
    if not mark:  # batches committed before the mark existed: the newest batch, as they were rolled forward
        record = ledger.find_batch(ingest_id, batch=last, operation=CommitKind.BATCH) if last else None
        return [record] if record is not None and _has_dead_letters(record) and last > counter() else []
    top = min(mark, upto if upto is not None else mark)
    held = counter()
    if top <= held:
        return []
    found: dict[int, BatchRecord] = {}
    window, span = 16, (ledger.version or 0) + 1
    while True:  # newest first, in growing windows, until the counter (or the oldest commit the log holds)
        records = ledger.batches(ingest_id, limit=min(window, span))
        for record in records:
            b = record.meta.batch
            if record.meta.operation is CommitKind.BATCH and held < b <= top and _has_dead_letters(record):
                found.setdefault(b, record)
        if any(r.meta.batch <= held for r in records) or window >= span:
            return [found[b] for b in sorted(found)]
        window *= 16


def _has_dead_letters(record: BatchRecord) -> bool:
    manifest = record.meta.findings.dead_letters
    return manifest is not None and bool(manifest.files)


def commit_dead_letters_of(ledger: Ledger, ingest_id: str, dead_letter_uri: str,
                           storage_options: dict | None = None, upto: int | None = None) -> int:
    """Roll the dead-letter commits forward: every batch after the dead-letter table's counter (up to
    ``upto``) that staged dead letters, oldest first, each once (:class:`DeadLetterCommit`).

    Whatever committed in between (a rebased interval batch, a racing run) cannot make a batch's
    dead letters be skipped: the counter only moves past a batch by committing its dead letters.
    Returns how many batches' dead letters this call committed (``dead_letter_uri``: the ingest's
    dead-letter table, whose counter says which it holds)."""
    def counter() -> int:  # the dead-letter table is opened only when a batch may be pending
        return Ledger.open(dead_letter_uri, storage_options).transaction(dlq_app_id(ingest_id))

    committed = 0
    for record in pending_dead_letters(ledger, ingest_id, counter, upto):
        manifest = record.meta.findings.dead_letters
        assert manifest is not None
        meta = record.meta
        plan = BatchPlan(ingest_id, meta.batch, meta.ranges, meta.run, attempt_id=meta.attempt_id)
        status = commit(DeadLetterCommit(StagedBatch(plan, manifest.files)), manifest.uri, storage_options).status
        if status is RunStatus.COMMITTED:
            committed += 1
            log.info("rolled forward the dead letters of batch %s (%d records)", meta.batch, manifest.records)
    return committed


class ReprocessedDeadLetters(ReprocessCommit):
    """A reprocess's dead letters on the dead-letter table: the batch's earlier ones replaced by its new
    ones, in one commit, once per reprocess (the dead-letter table's own reprocess counter of the batch
    follows the main table's). Where the batch's first dead letters never landed (their staged files
    were lost), the new ones take their place: the ``dlq`` counter moves to the batch."""

    kind = CommitKind.DEAD_LETTERS

    def open(self, table_uri: str, storage_options) -> Ledger:
        return DeadLetterCommit.open(self, table_uri, storage_options)  # type: ignore[arg-type]

    def check(self, ledger: Ledger) -> CommitCheck:
        done = ledger.reprocess_count(self.plan.ingest_id, self.plan.batch) > self.reprocess_from
        return CommitCheck.ALREADY_COMMITTED if done else CommitCheck.READY

    def prepare(self, ledger: Ledger, table_uri: str, storage_options) -> Ledger:
        ledger.check_features(TableUse.REPROCESS)  # the dead letters' own columns: no schema to compare
        return ledger

    def transactions(self, ledger: Ledger) -> list[Transaction]:
        counter = ledger.transaction(dlq_app_id(self.plan.ingest_id))
        first = [Transaction(dlq_app_id(self.plan.ingest_id), self.plan.batch)] if counter < self.plan.batch else []
        return [*super().transactions(ledger), *first]

    def verify(self, table_uri: str, storage_options, read_version: int | None) -> CommitOutcome:
        log.info("batch %s: the reprocess's %s dead-letter file(s) replaced the batch's earlier ones in %s",
                 self.plan.batch, len(self.staged.files), table_uri)
        return outcome_of(self.staged, COMMITTED, Ledger.open(table_uri, storage_options).version)


def commit_reprocessed_dead_letters(main: Ledger, plan: BatchPlan, reprocess_from: int, manifest: DeadLetterManifest,
                                    storage_options: dict | None = None) -> RunStatus:
    """A reprocess of ``plan``'s batch committed: its dead letters replace the batch's in the dead-letter
    table. Every earlier batch's pending ones land first, so the ``dlq`` counter never skips one."""
    commit_dead_letters_of(main, plan.ingest_id, manifest.uri, storage_options, upto=plan.batch - 1)
    rule = ReprocessedDeadLetters(StagedBatch(plan, manifest.files), reprocess_from=reprocess_from)
    return commit(rule, manifest.uri, storage_options).status


def ensure_table(table_uri: str, arrow_schema: pa.Schema, storage_options: dict | None = None) -> None:
    """Create an empty table (the dead-letter table) if there is none; safe when runs race."""
    from deltalake import DeltaTable

    try:
        DeltaTable.create(table_uri, delta_schema_of(arrow_schema), mode="ignore", storage_options=storage_options)
    except DeltaError as exc:  # another run created it between our check and our commit
        if "already exists" not in str(exc).lower():
            raise
