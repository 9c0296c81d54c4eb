"""The dead-letter table: a sink of the same kind, committed after the main table's batch decided.

A batch's undecodable records (and, if asked, its dropped duplicates and rule violations) are staged
by the driver (:mod:`airflow_eo.driver.dead_letters`) beside the dead-letter table; the main commit
records them (``dead_letters`` in its metadata) and :func:`commit_dead_letters_of` then commits them
with :class:`DeadLetterCommit` — once per batch (its ``dlq`` mark), rolled forward by the next run
when a driver died between the two commits.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from deltalake.exceptions import DeltaError
from deltalake.transaction import Transaction

from airflow_eo.attempt import Attempt
from airflow_eo.core.errors import CommitConflictError, TableError, TableFeatureError
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.table.commit import COMMITTED, CommitOutcome, StagedBatch, add_actions, commit, outcome_of
from airflow_eo.table.engine_merge import EngineMerge
from airflow_eo.sinks.base import Sink, SinkKind
from airflow_eo.table.features import ConstraintKind, TableUse
from airflow_eo.table.app_ids import dlq_app_id
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import BatchFindings, BatchMetadata, CommitKind
from airflow_eo.table.schema import delta_schema_of

log = logging.getLogger(__name__)


class DeadLetterSink(Sink):
    """The ingest's dead-letter table (``dead_letter_table_uri``): appended to once per batch that has
    dead letters, after the main table's commit; never chosen by a write mode."""

    kind = SinkKind.DEAD_LETTERS
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
    def follow(findings: BatchFindings, table_uri: str, ingest_id: str, storage_options: dict | None = None) -> None:
        """After the main table's commit decided: the batch's dead letters follow (or an earlier attempt's)."""
        if findings.dead_letters is not None:
            commit_dead_letters_of(Ledger.open(table_uri, storage_options), ingest_id, storage_options)


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
        return outcome_of(self.staged, COMMITTED, Ledger.open(table_uri, storage_options).version)




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
